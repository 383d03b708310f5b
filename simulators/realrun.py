"""``sim=realrun``: execute a strategy for real with ``torch.distributed`` and time it.

The event simulator still gives ``step_time_s``; this backend adds what the hardware says,
``measured_step_time_s`` (and per-rank figures) to result.json.

How a strategy runs
-------------------
One process (*rank*) per device of the cluster: gloo on CPUs, NCCL on GPUs, started with
``torch.multiprocessing`` (``launcher: spawn``) or ``torchrun`` (``launcher: torchrun``; or
on several hosts by hand, see :func:`main`), rendezvous through ``env://`` or a file.  A
CPU rank is pinned to its own cores (``os.sched_setaffinity``) and runs
``threads_per_rank`` torch threads, so that the ranks behave as separate devices; with
``spin_idle`` (default) it keeps a ``SCHED_IDLE`` busy loop on each of its cores
(:class:`harness.profile.IdleSpinners`), so that a rank waiting for a message does not halt
its core - waking a halted virtual CPU costs milliseconds per message.  With
``steady_malloc`` (default) a CPU rank keeps the memory it frees
(:func:`harness.profile.steady_malloc`, as the profiler does), so that its buffers are reused
without page faults, as a GPU's caching allocator reuses them; otherwise whether glibc hands
freed buffers back to the OS differs from process to process, and so does the step time.

The captured joint forward + backward + SGD-update graph is turned into an
:class:`~harness.execgraph.ExecGraph` and, for each rank, into straight-line Python code
(compiled once; a few hundred nanoseconds of overhead per op, like ``torch.fx``'s own code):

* **operator placement** (every node on one device): every rank walks the nodes in the
  strategy's order and runs those placed on it; a tensor produced on rank a and read on rank
  b is sent once per (producer, destination rank) - the simulator's cache - with ``isend``
  right after it is produced and received into a fresh buffer with an ``irecv`` posted
  before the step's barrier (``early_recv``, the default, on gloo; on NCCL, or with
  ``early_recv: false``, at the producer's position of the walk - NCCL runs the operations
  with one peer in order on one stream, where a receive posted up front would hold back the
  sends it depends on) and waited for just before its first use.  gloo writes a
  tensor from the sending thread at once only when the receiver's notice that its receive is
  posted has already arrived; otherwise the payload leaves from gloo's event-loop thread when
  that notice comes in, which on a one-core rank that computes on waits for the scheduler
  (about 1 ms on average here; ``python -m harness.calibrate`` measures both).  Posted late,
  the list-scheduled placements of the tiny models ran 20-30% slower.  Every rank posts its
  operations in one global order, so the exchange cannot deadlock.  Parameters live on
  their *home* rank (the rank of their update op, else of their first reader, as in the
  simulator); other ranks that read a parameter receive it at the start of the step and the
  home rank keeps the updated value.  Consumers that read only a tensor's shape
  (``ones_like``...) get a local stand-in (the graph has no edge there either);
* **data parallelism** (the same ``{sample: k}`` config on every node): each rank runs the
  graph captured at batch B/k on its k-th of the batch and all-reduces (averages) every
  partial result that feeds a replicated op - the weight gradients before their update -
  asynchronously, waiting just before the update (or at the end of the step).  Batch
  statistics (BatchNorm) stay per rank, as in DDP without SyncBatchNorm;
* **channel-parallel layers** (a layer-graph strategy - OWT, OptCNN, PaSE - whose every layer is
  ``{sample: k}`` or, for an ``nn.Linear`` or an elementwise layer, ``{channel: k}``, all on the
  same k devices): the data-parallel program above, in which the aten ops of those layers hold
  other *representations* (:class:`ChannelPlan`) and a value is converted, with a blocking
  collective over the k ranks, where its consumer needs another one.  On rank p a value is
  ``L`` (its batch shard, all features: what data parallelism computes), ``C`` (the full
  batch, its p-th slice of the features), ``W`` (its p-th slice of the rows - output features -
  of a linear layer's weight and bias, of their gradients and updated values) or ``P`` (a
  full-batch partial sum).  A channel-parallel linear layer reads its input in full (``R``:
  ``L`` -> all-gather of the batch shards, ``C`` -> all-gather of the feature slices), multiplies
  it by its weight rows (``addmm`` with the bias slice) and outputs ``C``; its input gradient is
  the output gradient in ``C`` times the weight rows, a ``P`` summed by an all-reduce (each rank
  then takes its rows, ``L``, or its features, ``C``); its weight and bias gradients are the
  products with the full input and the batch sum of the ``C`` output gradient, divided by k -
  every rank's loss is the mean over its own B/k samples, so this is the mean of the k local
  gradients, as data parallelism's all-reduce - and stay local (no gradient all-reduce), as
  does the SGD update of the slice.  A channel-parallel elementwise layer (``tanh`` / ``relu``
  after a linear layer, OWT's choice) runs its forward and backward ops on ``C``.  ``C`` -> ``L``
  and ``L`` -> ``C`` are an all-to-all: a linear layer's output read by a data-parallel layer is
  re-split by sample.  The results equal data parallelism's (``reference_outputs(shards=k)``)
  up to the order of floating-point sums; the step's reported gradients and updated parameters
  of those layers are the slices concatenated over the ranks (an all-gather after the step).
  Measured as ``mode: channel_parallel``; the conversions are not counted in the ranks' busy
  time.  Ranks keep only their slices, so a channel-parallel layer's weights are never whole;
* anything else is refused with :class:`RealRunError`: other parallel configs (channel-parallel
  convolutions or views, spatial splits, a sample x channel split, a mix of configs and
  placements, layers on different device sets) are simulated only, and the message names the
  layer; so is a linear layer outside the pattern above (called twice, a weight shared with
  another op such as a tied output projection, a non-nn.Linear product).  A graph rewritten by
  an algorithm (FD-DPS's split sub-ops, Celeritas's coarse nodes) has no executable form.  On an
  op graph only pure placements and pure data parallelism run.  Layer-granularity op graphs
  (``graph.granularity=layer``) run by expanding each coarse node into its aten ops.

Step time (Celeritas Sec. 6): ``warmup`` steps are discarded and the mean of the next
``steps`` is reported.  Each step starts at a barrier; its time is that of its longest rank,
from leaving the barrier to the end of its last operation and wait (``measured_span_s``, the
first start to the last end on one host's clock, also counts the barrier's exit skew).
``measured_rank_busy_s`` is the time each rank spent inside its ops (host time on a GPU),
``measured_rank_send_s`` inside its ``isend`` calls (on gloo the payload is written there)
and ``measured_rank_wait_s`` waiting for its receives, its all-reduces and, at the end of
the step, its sends to complete; ``measured_rank_page_faults`` counts the minor page faults
of the rank's process during a step (allocations the C library had to map afresh, see
``steady_malloc``); per step, means over the measured steps.

Profiled during the run (``interleave_profile``, off by default): after every step one rank
in turn - the others wait at a barrier it joins when done - runs the whole executed graph alone
from its own copy of the initial state and times each op in situ
(:func:`harness.profile.in_situ_step`, the profiler's ``mode=in_situ``).  The plan is then
simulated again with each op's mean over those reference steps (summed per coarse node of a
layer-granularity plan; the B/k graph's times stand for the data-parallel shards) - means, as
the measured step is a mean and a mean step is the sum of its ops' means (per-op medians came
out 2-5 % short on plans with no transfers, an op now and then being slow):
each device's times from its own rank's reference steps, as two cores of a shared VM need not be
equally fast at a given minute: ``step_time_interleaved_s`` and ``sim_relative_error_interleaved`` beside ``step_time_s``,
``measured_reference_step_s`` the reference steps' mean length.  A profile taken minutes
before the run sees another machine when the machine's speed drifts (``python -m
harness.calibrate --drift``: tens of percent on a shared VM); one interleaved with the measured
steps sees the same one, so the comparison isolates the simulator's model of the step -
overlap, order, communication - from the drift.  Not for channel-parallel runs, whose layers
execute other ops than the captured graph's.

How a run ends
--------------
Every rank writes what it is doing - loading its job, at the rendezvous, building its state,
at a step's barrier, running its ops, waiting for a message from rank q or for a collective -
on a *progress board*, a small file of the launch that every local rank maps into memory
(:class:`Progress`: a few memory stores per barrier and per wait, none per op), and the
launcher reads it twice a second.  When the board has not changed for ``rank_timeout_s``
(default 2 minutes) the run has stalled: the launcher ends every rank and raises a one-line
:class:`RealRunError` naming the ranks that stopped it - the least advanced ones and, of
those, the ones not waiting for the others (a rank stuck in an op, not its peers waiting for
it) - and what each rank was doing (:func:`stall_message`).  ``timeout_s``, torch.distributed's
own timeout of an operation, must exceed it: it is the guard of a job run by hand under
torchrun, which no launcher of ours watches.  A rank that fails ends the run at once with its
traceback.  However a launch ends - results, a failed or stalled rank, Ctrl-C
(``KeyboardInterrupt``) or SIGTERM (``SystemExit``, where SIGTERM had its default action) -
every rank still running is killed with its process group (a spawned rank leads its own,
which holds its idle spinners; torchrun's agent ends its workers) before the launcher returns
or raises, and the kernel kills a rank whose launcher died without a word
(``PR_SET_PDEATHSIG``).  An interruption is re-raised with a :class:`RealRunError` as its
cause that says what was ended, the one line ``python -m harness`` reports.  A job directory
the launcher made for itself (``job_dir: null``) is removed at the end; one the user named
(``sim.job_dir``, ``launcher: prepare``) stays.
"""

from __future__ import annotations

import contextlib
import copy
import math
import mmap
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from harness.cluster import Cluster
from harness.costs import CostModel
from harness.errors import UserError
from harness.execgraph import DEVICE, ExecGraph, Ref, TensorMeta, initial_state, is_shape_only, layer_runs, resolve, short_target
from harness.graph import PARTIAL, REPLICATED, OpGraph
from harness.profile import rank_cores
from harness.strategy import Strategy
from simulators.simulate import SimResult, simulate
from simulators.taskgraph import _param_home_nodes


#: ``sim.trace`` event kinds: an op's call (id = node), a send call (id = message tag), waiting
#: for a message (tag) or an all-reduce (id = node), the step's last wait for its sends
TRACE_OP, TRACE_SEND, TRACE_RECV, TRACE_ALLREDUCE, TRACE_DRAIN = range(5)
TRACE_KINDS = ("op", "send", "recv_wait", "allreduce_wait", "drain")

#: What a rank is doing, as it writes it on the progress board (:class:`Progress`): not yet
#: heard from, loading its job, at the rendezvous, building its state and program, at the barrier
#: before a step, running its ops, waiting for a message / a collective / its sends, at the barrier
#: of the in-situ profile or running it, at the barrier after its last step, done
(P_START, P_LOAD, P_RENDEZVOUS, P_SETUP, P_BARRIER, P_STEP, P_RECV, P_COLLECTIVE, P_DRAIN, P_PROFILE_WAIT, P_PROFILE, P_FINAL,
 P_DONE) = range(13)
#: the phases in which a rank waits for the others
WAITING = frozenset({P_RENDEZVOUS, P_BARRIER, P_RECV, P_COLLECTIVE, P_DRAIN, P_PROFILE_WAIT, P_FINAL})
#: a rank's row on the board, int64: phase, job (its index in the launch), step, detail (P_RECV:
#: the sender's rank << 32 | the tag; P_COLLECTIVE: the all-reduced node, -1 for another collective)
BOARD_SLOTS = 4
#: how often the launcher looks at its ranks and their board (seconds)
POLL_S = 0.5
#: a device kind that names a CPU: :func:`harness.profile.device_name`'s "<model> (N thread(s))"
_CPU_KIND = re.compile(r"\(\d+ threads?\)$")


class RealRunError(UserError, RuntimeError):
    """A strategy that cannot be executed for real, or a run that failed; the message says why."""


# ---------------------------------------------------------------------------- programs
@dataclass
class RankProgram:
    """What one rank executes: generated source of ``step`` and the tables it refers to."""

    rank: int
    code: str
    consts: list[Any]
    targets: list[str]
    recv_params: list[int]  # placeholders received every step (persistent buffers)
    nodes: int  # ops this rank runs
    sends: int
    recvs: int


@dataclass
class Job:
    """Everything a rank needs (pickled to the workers)."""

    world: int
    mode: str  # placement | data_parallel | channel_parallel
    backend: str
    device: str  # cpu | cuda
    threads: int
    warmup: int
    steps: int
    seed: int
    source: Any
    eg: ExecGraph
    programs: list[RankProgram]
    cores: list[list[int]]
    dp_devices: list[int] = field(default_factory=list)
    full_batch: int = 0
    collect: bool = False
    timeout_s: float = 600.0
    #: the launcher ends a run in which no rank made progress for this long (see the module docstring)
    rank_timeout_s: float = 120.0
    #: channel_parallel: parameter placeholder -> rows of it each rank keeps (its slice of output features)
    param_rows: dict[int, int] = field(default_factory=dict)
    #: channel_parallel: outputs (``grad<j>``, ``new<j>``) that are slices, concatenated over the ranks along dim 0
    gather: list[str] = field(default_factory=list)
    #: CPU ranks: keep each rank's cores from idling (:class:`harness.profile.IdleSpinners`)
    spin_idle: bool = False
    #: CPU ranks: keep freed memory in the process (:func:`harness.profile.steady_malloc`)
    steady_malloc: bool = False
    #: after every step one rank in turn runs the whole ``eg`` alone, timing each node in situ
    #: (:func:`harness.profile.in_situ_step`): a profile taken while the run is measured
    interleave_profile: bool = False
    #: the plan graph's node of each ``eg`` node when the plan is coarser (layer granularity), else None
    ref_group: Any = None
    #: the fraction of the plan graph's work one ``eg`` node does (1/k under k-way data parallelism)
    ref_fraction: float = 1.0
    #: record every op, send and wait of the measured steps (``sim.trace``)
    trace: bool = False


class _Emitter:
    """Generates one rank's ``step`` function."""

    def __init__(self, rank: int, eg: ExecGraph) -> None:
        self.rank = rank
        self.eg = eg
        self.lines: list[str] = []
        self.consts: list[Any] = []
        self._const_ids: dict[int, int] = {}
        self.targets: list[str] = []
        self._target_ids: dict[str, int] = {}
        self.pending: dict[str, str] = {}  # local name -> statement to run before its first use (a wait)
        self.standins: set[str] = set()
        self.nodes = self.sends = self.recvs = 0
        self.posted: list[str] = []  # receives posted before the step's barrier (``post``)
        self.posted_names: list[str] = []  # the names ``post`` hands to ``step``

    def const(self, x: Any) -> str:
        key = id(x)
        if key not in self._const_ids:
            self._const_ids[key] = len(self.consts)
            self.consts.append(x)
        return f"K[{self._const_ids[key]}]"

    def target(self, t: str) -> str:
        if t not in self._target_ids:
            self._target_ids[t] = len(self.targets)
            self.targets.append(t)
        return f"F{self._target_ids[t]}"

    def need(self, name: str) -> None:
        """Wait for a received value before its first use."""
        stmt = self.pending.pop(name, None)
        if stmt is not None:
            self.lines.append(f"    {stmt}")

    def expr(self, x: Any, name_of: Any) -> str:
        if isinstance(x, Ref):
            nm = name_of(x)
            self.need(nm)
            return nm
        if x is DEVICE:
            return "DEV"
        if x is None or isinstance(x, (bool, int, str)):
            return repr(x)
        if isinstance(x, float):
            return repr(x) if math.isfinite(x) else self.const(x)
        if isinstance(x, list):
            return "[" + ", ".join(self.expr(v, name_of) for v in x) + "]"
        if isinstance(x, tuple):
            return "(" + "".join(self.expr(v, name_of) + ", " for v in x) + ")"
        return self.const(x)

    def call(self, out: str, i: int, name_of: Any, timed: bool = True, args_override: tuple[Any, ...] | None = None) -> None:
        ins = self.eg.instrs[i]
        args = [self.expr(a, name_of) for a in (ins.args if args_override is None else args_override)]
        args += [f"{k}={self.expr(v, name_of)}" for k, v in ins.kwargs.items()]
        fn = self.target(ins.target)
        if timed:
            self.lines.append(f"    _t = _pc(); {out} = {fn}({', '.join(args)}); _b += _op({i}, _t)")
        else:
            self.lines.append(f"    {out} = {fn}({', '.join(args)})")
        self.nodes += 1

    def post_recv(self, stmt: str, *names: str) -> None:
        """Post a receive in ``post`` (before the step's barrier); ``names`` are what it defines."""
        self.posted.append(f"    {stmt}")
        self.posted_names.extend(names)

    def source(self, body: list[str], prologue: list[str], epilogue: list[str]) -> str:
        head: list[str] = []
        unpack: list[str] = []
        if self.posted:
            tup = "(" + "".join(f"{n}, " for n in self.posted_names) + ")"
            head = ["def post(PH, RB):", *self.posted, f"    return {tup}"]
            unpack = [f"    {tup} = _P"]
        return "\n".join([*head, "def step(PH, RB, W, _P=()):", "    _b = 0.0", *unpack, *prologue, *body, *epilogue])


def _consumers(eg: ExecGraph) -> list[list[tuple[int, bool]]]:
    """Per node: (consumer, reads only metadata) in node order, one entry per consumer."""
    cons: list[list[tuple[int, bool]]] = [[] for _ in range(eg.num_nodes)]
    for c, ins in enumerate(eg.instrs):
        so = is_shape_only(ins.target)
        seen = set()
        for r in eg.refs(c):
            if r.kind == "n" and r.index not in seen:
                seen.add(r.index)
                cons[r.index].append((c, so))
    return cons


def _ph_readers(eg: ExecGraph) -> list[list[int]]:
    readers: list[list[int]] = [[] for _ in eg.placeholders]
    for c, ins in enumerate(eg.instrs):
        if is_shape_only(ins.target):
            continue
        for r in {r.index for r in eg.refs(c) if r.kind == "p"}:
            readers[r].append(c)
    return readers


def _getitem_elt(eg: ExecGraph, c: int, i: int) -> int | None:
    ins = eg.instrs[c]
    if ins.target == "getitem" and isinstance(ins.args[0], Ref) and ins.args[0] == Ref("n", i):
        return int(ins.args[1])
    return None


def _elt_meta(eg: ExecGraph, i: int, elt: int | None) -> Any:
    out = eg.instrs[i].out
    return out if elt is None else out[elt]


def placement_programs(eg: ExecGraph, dev: np.ndarray, order: np.ndarray, world: int, home_node: np.ndarray,
                       early_recv: bool = True) -> list[RankProgram]:
    """Per-rank programs of an operator placement (``dev[i]`` = rank of node i).

    ``early_recv``: every receive of the step is posted before its barrier (``post``), else at
    the producer's position of the walk.  gloo writes a sent tensor from the sending thread only
    when the receiver's notice that the receive is posted has already arrived; otherwise the
    payload leaves from gloo's event-loop thread once that notice comes in, which on a busy
    one-core rank waits for the scheduler to preempt the computing thread (milliseconds)."""
    n = eg.num_nodes
    cons = _consumers(eg)
    walk = sorted(range(n), key=lambda i: (int(order[i]), i))
    em = [_Emitter(r, eg) for r in range(world)]
    body: list[list[str]] = [[] for _ in range(world)]
    for e, b in zip(em, body):
        e.lines = b
    tag = 0
    outputs = {r.index for r in eg.outputs if r is not None and r.kind == "n"}

    def receive(r: int, here: list[str], stmt: str, *names: str) -> None:
        """Post a receive of rank r before the step (``early_recv``), else at this point of ``here``."""
        if early_recv:
            em[r].post_recv(stmt, *names)
        else:
            here.append(f"    {stmt}")

    # --- parameters: home rank sends to remote readers at the start of the step
    ph_read = _ph_readers(eg)
    n_state = eg.n_params + eg.n_buffers
    prologue: list[list[str]] = [[] for _ in range(world)]
    recv_params: list[list[int]] = [[] for _ in range(world)]
    ph_name: list[dict[int, str]] = [{} for _ in range(world)]
    for j in range(len(eg.placeholders)):
        ranks = sorted({int(dev[c]) for c in ph_read[j]})
        if j >= n_state or not ranks:
            for r in ranks:
                prologue[r].append(f"    ph{j} = PH[{j}]")
                ph_name[r][j] = f"ph{j}"
            continue
        h = int(dev[home_node[j]]) if home_node[j] >= 0 else ranks[0]
        prologue[h].append(f"    ph{j} = PH[{j}]")
        ph_name[h][j] = f"ph{j}"
        for r in ranks:
            if r == h:
                continue
            prologue[h].append(f"    _send(ph{j}, {r}, {tag})")
            receive(r, prologue[r], f"ph{j} = RB[{j}]; hp{j} = _irecv(ph{j}, {h}, {tag})", f"ph{j}", f"hp{j}")
            em[r].pending[f"ph{j}"] = f"hp{j}.wait()"
            ph_name[r][j] = f"ph{j}"
            recv_params[r].append(j)
            em[h].sends += 1
            em[r].recvs += 1
            tag += 1
    # --- nodes
    msg: dict[tuple[int, int | None, int], str] = {}

    def namer(r: int, consumer: int) -> Any:
        so = is_shape_only(eg.instrs[consumer].target)

        def name_of(ref: Ref) -> str:
            if ref.kind == "p":
                return ph_name[r][ref.index]
            i = ref.index
            if so:
                nm = f"s{i}"
                if nm not in em[r].standins:
                    meta = eg.instrs[i].out
                    if not isinstance(meta, TensorMeta):
                        raise RealRunError(f"node {consumer} reads the metadata of multi-output node {i}")
                    body[r].append(f"    {nm} = _empty_strided({em[r].const(meta)})")
                    em[r].standins.add(nm)
                return nm
            if int(dev[i]) == r:
                return f"v{i}"
            key = (i, None, r)
            if key not in msg:
                raise RealRunError(f"internal: no message for node {i} on rank {r}")
            return msg[key]

        return name_of

    for i in walk:
        r = int(dev[i])
        ins = eg.instrs[i]
        src_node = ins.args[0].index if ins.target == "getitem" and isinstance(ins.args[0], Ref) and ins.args[0].kind == "n" else -1
        if src_node >= 0 and int(dev[src_node]) != r:
            nm = msg[(src_node, int(ins.args[1]), r)]
            em[r].need(nm)
            body[r].append(f"    v{i} = {nm}")
        else:
            em[r].call(f"v{i}", i, namer(r, i))
        # messages to every other rank that reads this node's value
        for c, so in cons[i]:
            rc = int(dev[c])
            if rc == r or so:
                continue
            elt = _getitem_elt(eg, c, i)
            if elt is None and isinstance(ins.out, (list, tuple)):
                raise RealRunError(f"node {c} ({eg.instrs[c].target}) reads the whole multi-output value of node {i} from another rank")
            key = (i, elt, rc)
            if key in msg:
                continue
            meta = _elt_meta(eg, i, elt)
            nm = f"m{tag}"
            msg[key] = nm
            if meta is None:
                body[rc].append(f"    {nm} = None")
            elif not isinstance(meta, TensorMeta):
                raise RealRunError(f"node {i} sends a non-tensor value ({type(meta).__name__}) to rank {rc}")
            elif math.prod(meta.shape) == 0:
                body[rc].append(f"    {nm} = _empty_strided({em[rc].const(meta)})")
            else:
                val = f"v{i}" if elt is None else f"v{i}[{elt}]"
                perm = meta.dense_perm()
                wire = meta if perm is None else meta.permuted(perm)
                body[r].append(f"    _send({val}, {rc}, {tag}, {perm!r})")
                receive(rc, body[rc], f"{nm} = _empty({em[rc].const(wire)}); h{tag} = _irecv({nm}, {r}, {tag})", nm, f"h{tag}")
                # permuted back on arrival: the received tensor has the traced strides
                inv = None if perm is None else tuple(int(x) for x in np.argsort(perm))
                em[rc].pending[nm] = f"h{tag}.wait()" + ("" if inv is None else f"; {nm} = {nm}.permute({inv!r})")
                em[r].sends += 1
                em[rc].recvs += 1
            tag += 1
    # --- end of step: the last waits, parameter updates, outputs
    progs = []
    for r in range(world):
        e = em[r]
        epi = [f"    {stmt}" for stmt in e.pending.values()]
        epi.append("    _drain(W)")
        outs = []
        for j, ref in enumerate(eg.new_param_refs):
            if ref is not None and ref.kind == "n" and int(dev[ref.index]) == r and eg.placeholders[j].kind == "param":
                epi.append(f"    PH[{j}] = v{ref.index}")
        for key, ref in _output_items(eg):
            if ref.kind == "n" and int(dev[ref.index]) == r:
                outs.append(f"{key!r}: v{ref.index}")
            elif ref.kind == "p" and r == 0:
                outs.append(f"{key!r}: PH[{ref.index}]")
        epi.append("    return _b, {" + ", ".join(outs) + "}")
        _insert_dels(body[r], outputs | {ref.index for ref in eg.new_param_refs if ref is not None and ref.kind == "n"})
        progs.append(RankProgram(r, e.source(body[r], prologue[r], epi), e.consts, e.targets, recv_params[r], e.nodes, e.sends, e.recvs))
    return progs


def dp_program(eg: ExecGraph, order: np.ndarray, roles: np.ndarray, k: int, chan: "ChannelPlan | None" = None) -> RankProgram:
    """The program every data-parallel rank runs (the graph at batch B/k, gradient all-reduce).

    With ``chan`` (a :class:`ChannelPlan`), the nodes of channel-parallel layers hold other
    representations than the local batch shard and values are converted between
    representations where a consumer needs another one (see the module docstring)."""
    n = eg.num_nodes
    cons = _consumers(eg)
    e = _Emitter(0, eg)
    body = e.lines
    rep = chan.rep if chan is not None else ["L"] * n
    grads = {r.index for r in eg.grad_refs if r is not None and r.kind == "n"}
    reduce = {i for i in range(n) if rep[i] == "L" and roles[i] == PARTIAL
              and (any(roles[c] == REPLICATED and rep[c] == "L" for c, so in cons[i] if not so) or i in grads)}
    ph_read = _ph_readers(eg)
    prologue = [f"    ph{j} = PH[{j}]" for j in range(len(eg.placeholders)) if ph_read[j]]
    walk = sorted(range(n), key=lambda i: (int(order[i]), i))
    reduced_for: dict[int, set[int]] = {i: {c for c, so in cons[i] if not so and roles[c] == REPLICATED and rep[c] == "L"} for i in reduce}
    converted: dict[tuple[Ref, str], str] = {}

    def plain(ref: Ref) -> str:
        return f"ph{ref.index}" if ref.kind == "p" else f"v{ref.index}"

    def convert(ref: Ref, have: str, want: str) -> str:
        """The name of ``ref``'s value in representation ``want`` (a collective emitted at first need)."""
        key = (ref, want)
        if key in converted:
            return converted[key]
        nm = f"{'x' if ref.kind == 'n' else 'y'}{want.lower()}{ref.index}"
        src = plain(ref)
        if have == "P" and want in ("L", "C"):
            full = convert(ref, "P", "R")
            line = f"{nm} = {'_rows' if want == 'L' else '_cols'}({full})"
        elif (have, want) in _CONVERSIONS:
            line = f"{nm} = {_CONVERSIONS[(have, want)]}({src})"
        else:
            raise RealRunError(f"internal: no conversion of {ref} from representation {have} to {want}")
        body.append(f"    {line}")
        converted[key] = nm
        return nm

    def namer(consumer: int) -> Any:
        so = is_shape_only(eg.instrs[consumer].target)
        wants = chan.needs.get(consumer, {}) if chan is not None else {}
        default = "C" if rep[consumer] == "C" else "W" if rep[consumer] == "W" else "L"

        def name_of(ref: Ref) -> str:
            if ref.kind == "p":
                have = chan.ph_rep.get(ref.index, "L") if chan is not None else "L"
                want = wants.get(ref, default if have == "W" else "L")
                return f"ph{ref.index}" if want == have else convert(ref, have, want)
            i = ref.index
            if so:
                nm = f"s{i}"
                if nm not in e.standins:
                    body.append(f"    {nm} = _empty_strided({e.const(eg.instrs[i].out)})")
                    e.standins.add(nm)
                return nm
            have, want = rep[i], wants.get(ref, default)
            if have != want:
                return convert(ref, have, want)
            if i in reduce and consumer in reduced_for[i]:
                return f"g{i}"
            return f"v{i}"

        return name_of

    for i in walk:
        shape = chan.shape_args.get(i) if chan is not None else None
        e.call(f"v{i}", i, namer(i), args_override=None if shape is None else (eg.instrs[i].args[0], shape))
        if chan is not None and i in chan.scale:
            body.append(f"    v{i}.div_({k})")  # a weight-gradient slice summed over the k local losses: their mean, as DP's all-reduce
        if i in reduce:
            private = all(c in reduced_for[i] for c, so in cons[i] if not so)
            meta = eg.instrs[i].out
            perm = meta.dense_perm() if isinstance(meta, TensorMeta) else None
            inv = None if perm is None else tuple(int(x) for x in np.argsort(perm))
            # reduced in a contiguous buffer (the traced layout, permuted), a private copy when
            # batched consumers still read the local value
            body.append(f"    g{i} = _own(v{i}, {perm!r}, {not private}); hg{i} = _allreduce(g{i}, {i})")
            e.pending[f"g{i}"] = f"hg{i}.wait(); g{i}.div_({k})" + ("" if inv is None else f"; g{i} = g{i}.permute({inv!r})")
    epi = [f"    {stmt}" for stmt in e.pending.values()]
    outs = []
    for j, ref in enumerate(eg.new_param_refs):
        if ref is not None and ref.kind == "n" and eg.placeholders[j].kind == "param":
            epi.append(f"    PH[{j}] = v{ref.index}")
    for key, ref in _output_items(eg):
        if ref.kind == "n":
            outs.append(f"{key!r}: {'g' if ref.index in reduce else 'v'}{ref.index}")
        else:
            outs.append(f"{key!r}: PH[{ref.index}]")
    epi.append("    return _b, {" + ", ".join(outs) + "}")
    keep = {r.index for r in eg.outputs if r is not None and r.kind == "n"} | {r.index for r in eg.new_param_refs if r is not None and r.kind == "n"}
    _insert_dels(body, keep, keep_g=keep)
    return RankProgram(0, e.source(body, prologue, epi), e.consts, e.targets, [], e.nodes, 0, 0)


def _output_items(eg: ExecGraph) -> list[tuple[str, Ref]]:
    items: list[tuple[str, Ref]] = []
    if eg.loss_ref is not None:
        items.append(("loss", eg.loss_ref))
    for j, r in enumerate(eg.grad_refs):
        if r is not None:
            items.append((f"grad{j}", r))
    for j, r in enumerate(eg.new_param_refs):
        if r is not None:
            items.append((f"new{j}", r))
    return items


def _insert_dels(lines: list[str], keep_nodes: set[int], keep_g: set[int] | None = None) -> None:
    """Free each local value after its last use (``del``), as a real step frees activations."""
    import re

    # v: node values, m: received, s: stand-ins, g: all-reduced, x?/y?: a node's / placeholder's
    # value converted to another representation (channel parallelism)
    pat = re.compile(r"\b(v|m|s|g|x[lcr]|y[lcr])(\d+)\b")
    last: dict[str, int] = {}
    for ln, line in enumerate(lines):
        for kind, num in pat.findall(line):
            last[kind + num] = ln
    dels: dict[int, list[str]] = {}
    for name, ln in last.items():
        kind, num = pat.fullmatch(name).groups()  # type: ignore[union-attr]
        if kind == "v" and int(num) in keep_nodes:
            continue
        if kind == "g" and keep_g is not None and int(num) in keep_g:
            continue
        dels.setdefault(ln, []).append(name)
    for ln in sorted(dels, reverse=True):
        lines.insert(ln + 1, "    del " + ", ".join(sorted(dels[ln])))


# ---------------------------------------------------------------------------- channel parallelism
#: (have, want) -> the collective of :func:`_compile` that converts a value between representations
_CONVERSIONS = {("L", "R"): "_ag_rows", ("L", "C"): "_a2a_lc", ("C", "L"): "_a2a_cl", ("C", "R"): "_ag_cols", ("P", "R"): "_ar"}

#: shape-agnostic aten ops (no size arguments) that may run on a slice of a tensor: the ops of a
#: channel-parallel elementwise layer, and the optimizer's update of a sliced parameter
_SLICEABLE = {
    "relu", "tanh", "sigmoid", "gelu", "silu", "leaky_relu", "elu", "hardtanh", "detach", "alias", "clone", "neg", "sqrt", "rsqrt",
    "threshold_backward", "tanh_backward", "sigmoid_backward", "gelu_backward", "silu_backward", "leaky_relu_backward",
    "elu_backward", "hardtanh_backward", "add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp",
}
_VIEWS = {"view", "_unsafe_view", "reshape"}


@dataclass
class ChannelPlan:
    """How the data-parallel program runs channel-parallel layers (built by :func:`channel_plan`).

    ``rep[i]`` is the representation node i's value has on a rank: ``L`` its batch shard (all
    features; what data parallelism computes), ``C`` the full batch's rows of its slice of the
    features (a channel-parallel layer's output), ``P`` a full-batch partial sum (a
    channel-parallel layer's input gradient before the sum over ranks), ``W`` the rank's slice
    of a parameter or of its gradient (output features, rows of the weight), ``T`` a transposed
    ``C`` / ``R`` operand of a weight-gradient product.  ``R`` (the full tensor) exists only as
    a conversion.  A node reads each input in ``needs[i][ref]`` when given, else in its own
    representation (``L`` for ``L``, ``P`` and ``T`` nodes have explicit needs).
    """

    k: int
    rep: list[str]
    needs: dict[int, dict[Ref, str]]
    scale: set[int]  # weight-gradient sums over the full batch: divided by k (the mean of the k local losses' gradients)
    shape_args: dict[int, list[int]]  # views of a gradient slice: the per-rank shape argument
    ph_rep: dict[int, str]  # sliced parameter placeholder -> "W"
    param_rows: dict[int, int]  # sliced parameter placeholder -> rows per rank
    layers: list[str]  # the channel-parallel layers, for messages


def _simulated(what: str, layer: str, why: str) -> RealRunError:
    return RealRunError(f"{what}: channel-parallel layer {layer!r}: {why}; sim=realrun cannot execute it, this plan is simulated only")


def channel_plan(eg: ExecGraph, graph: OpGraph, lg: Any, linear: Sequence[int], elementwise: Sequence[int], k: int,
                 what: str) -> ChannelPlan:
    """Representations of every node of the per-rank graph (batch B/k) when the layer-graph
    nodes ``linear`` (nn.Linear) and ``elementwise`` run channel-parallel over k ranks and every
    other layer data-parallel; refuses, naming the layer, any op that does not fit the pattern
    (a weight shared with another op, a linear layer called twice, a non-2-D activation...)."""
    from harness.graph import BACKWARD, FORWARD

    n = eg.num_nodes
    rep = ["L"] * n
    needs: dict[int, dict[Ref, str]] = {}
    scale: set[int] = set()
    shape_args: dict[int, list[int]] = {}
    axis: dict[Ref, int] = {}  # W values: the axis that holds the output features
    preset: set[int] = set()
    cons = _consumers(eg)
    ph_index = {p.name: j for j, p in enumerate(eg.placeholders) if p.kind == "param"}
    param_rows: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for c in range(n):
        for r in {r for r in eg.refs(c) if r.kind == "p"}:
            readers.setdefault(r.index, []).append(c)

    def node(ref: Any) -> int | None:
        return ref.index if isinstance(ref, Ref) and ref.kind == "n" else None

    def tgt(i: int) -> str:
        return short_target(eg.instrs[i].target)

    for v in linear:
        name = lg.names[v]
        pnames = list((lg.attrs[v] or {}).get("params") or {})
        js = [ph_index.get(p) for p in pnames]
        if not pnames or None in js:
            raise _simulated(what, name, f"its parameters {pnames} are not parameters of the captured graph")
        shapes = {j: eg.placeholders[j].meta.shape for j in js}
        weights = [j for j in js if len(shapes[j]) == 2]
        biases = [j for j in js if len(shapes[j]) == 1]
        if len(weights) != 1 or len(biases) > 1 or len(weights) + len(biases) != len(js):
            raise _simulated(what, name, f"expected a 2-D weight and at most a 1-D bias, got parameters {shapes}")
        jw, jb = weights[0], (biases[0] if biases else None)
        out = shapes[jw][0]
        if out % k or (jb is not None and shapes[jb] != (out,)):
            raise _simulated(what, name, f"its {out} output features do not split into {k} equal slices")
        for j in (jw, jb):
            if j is not None:
                param_rows[j] = out // k
                axis[Ref("p", j)] = 0
        # forward: addmm(bias, x, t(W)) or mm(x, t(W)), once
        t1 = [c for c in readers.get(jw, []) if tgt(c) == "t"]
        fwd = [c for t in t1 for c, _ in cons[t] if tgt(c) in ("addmm", "mm") and graph.phase[c] == FORWARD
               and eg.instrs[c].args[-1] == Ref("n", t)]
        if len(fwd) != 1:
            raise _simulated(what, name, f"expected one forward matrix product with its transposed weight, found {len(fwd)} "
                             "(a layer called several times, or not an nn.Linear)")
        f = fwd[0]
        fins = eg.instrs[f]
        x = fins.args[-2]
        if not isinstance(x, Ref) or (tgt(f) == "addmm") != (jb is not None) or (jb is not None and fins.args[0] != Ref("p", jb)):
            raise _simulated(what, name, f"its forward product {fins.target} does not read the input, the layer's bias and weight")
        rep[f] = "C"
        needs[f] = {a: "W" for a in fins.args if isinstance(a, Ref) and a != x}
        needs[f][x] = "R"
        preset.add(f)
        # weight gradient: t(...t(mm(t(G), X))) [out, in] or mm(t(X), G) [in, out]
        gw = eg.grad_refs[jw]
        m = node(gw)
        while m is not None and tgt(m) == "t":
            m = node(eg.instrs[m].args[0])
        if m is None or tgt(m) != "mm":
            raise _simulated(what, name, "its weight gradient is not a matrix product of the output gradient and the input")
        a0, a1 = eg.instrs[m].args
        a = node(a0)
        if a is None or tgt(a) != "t":
            raise _simulated(what, name, "its weight gradient is not a matrix product of the output gradient and the input")
        y = eg.instrs[a].args[0]
        if a1 == x:
            grad, needs[a], axis[Ref("n", m)] = y, {y: "C"}, 0
        elif y == x:
            grad, needs[a], axis[Ref("n", m)] = a1, {y: "R"}, 1
        else:
            raise _simulated(what, name, "its weight gradient does not read the layer's forward input")
        if any(c != m for c, so in cons[a] if not so):
            raise _simulated(what, name, f"the transposed operand of its weight gradient (node {a}) has other readers")
        rep[a], rep[m] = "T", "W"
        needs[m] = {a0: "T", a1: "R" if a1 == x else "C"}
        scale.add(m)
        preset.update((a, m))
        # bias gradient: view(sum(G, [0], keepdim)) or sum(G, [0])
        if jb is not None:
            sb = node(eg.grad_refs[jb])
            while sb is not None and tgt(sb) in _VIEWS:
                sb = node(eg.instrs[sb].args[0])
            sins = eg.instrs[sb] if sb is not None else None
            if sins is None or sins.target != "aten.sum.dim_IntList" or sins.args[0] != grad or list(sins.args[1]) not in ([0], [-2]):
                raise _simulated(what, name, "its bias gradient is not the sum over the batch of its output gradient")
            keepdim = bool(sins.args[2]) if len(sins.args) > 2 else bool(sins.kwargs.get("keepdim", False))
            rep[sb], needs[sb], axis[Ref("n", sb)] = "W", {grad: "C"}, (1 if keepdim else 0)
            scale.add(sb)
            preset.add(sb)
    names_of_layers = [lg.names[v] for v in linear]
    # channel-parallel elementwise layers: every op of the module on the rank's feature slice
    for v in elementwise:
        name = lg.names[v]
        ops = [i for i in range(n) if graph.layer_names[graph.layer[i]] == name]
        if not ops:
            raise _simulated(what, name, "no op of the captured graph belongs to it")
        for i in ops:
            ins = eg.instrs[i]
            meta = ins.out
            if tgt(i) not in _SLICEABLE or not isinstance(meta, TensorMeta) or len(meta.shape) != 2 or meta.shape[1] % k:
                raise _simulated(what, name, f"its op {ins.target} (node {i}) is not an elementwise op on a 2-D (batch, features) "
                                 f"tensor with features divisible by {k}")
            for r in eg.refs(i):
                rm = eg.instrs[r.index].out if r.kind == "n" else eg.placeholders[r.index].meta
                if not isinstance(rm, TensorMeta) or rm.shape != meta.shape:
                    raise _simulated(what, name, f"its op {ins.target} (node {i}) broadcasts an operand")
            rep[i] = "C"
            preset.add(i)
        names_of_layers.append(name)
    # the rest, in node order: what reads a weight slice is a view of it, its product with an
    # output gradient (the input gradient, a partial sum) or an elementwise update of it
    def is_w(r: Ref) -> bool:
        return r in axis and (r.kind == "p" or rep[r.index] == "W")

    for i in range(n):
        ins = eg.instrs[i]
        refs = eg.refs(i)
        ws = [r for r in refs if is_w(r)]
        if i in preset:
            if ws and i not in needs:
                raise _simulated(what, ", ".join(names_of_layers), f"node {i} ({ins.target}) reads a parameter slice")
            continue
        if not ws:
            continue
        t = tgt(i)
        layer = graph.layer_names[graph.layer[i]]
        meta = ins.out
        if is_shape_only(ins.target) or not isinstance(meta, TensorMeta):
            raise _simulated(what, layer, f"node {i} ({ins.target}) reads a parameter slice")
        if t == "t" and len(meta.shape) == 2:
            rep[i], axis[Ref("n", i)] = "W", 1 - axis[ws[0]]
        elif t == "mm" and ins.args[1] in ws and axis[ins.args[1]] == 0 and not is_w(ins.args[0]) and graph.phase[i] == BACKWARD:
            rep[i], needs[i] = "P", {ins.args[0]: "C", ins.args[1]: "W"}
        elif t in _VIEWS and len(ws) == 1 and ws[0] == ins.args[0]:
            src = eg.instrs[ws[0].index].out if ws[0].kind == "n" else eg.placeholders[ws[0].index].meta
            big_in = [d for d, s in enumerate(src.shape) if s != 1]
            big_out = [d for d, s in enumerate(meta.shape) if s != 1]
            if big_in != [axis[ws[0]]] or len(big_out) != 1:
                raise _simulated(what, layer, f"node {i} ({ins.target}) reshapes a gradient slice across its feature axis")
            rep[i], axis[Ref("n", i)] = "W", big_out[0]
            shape_args[i] = [s // k if d == big_out[0] else s for d, s in enumerate(meta.shape)]
        elif t in _SLICEABLE and all(is_w(r) for r in refs) and all(
                (eg.instrs[r.index].out if r.kind == "n" else eg.placeholders[r.index].meta).shape == meta.shape for r in refs):
            rep[i], axis[Ref("n", i)] = "W", axis[ws[0]]
        else:
            raise _simulated(what, layer, f"node {i} ({ins.target}) reads a parameter slice of a channel-parallel layer "
                             "(a shared weight, or an op other than the layer's products and the optimizer's update)")
    # nothing else may read a W or T value, and sliced parameters leave the step as slices
    for i in range(n):
        for r in eg.refs(i):
            have = rep[r.index] if r.kind == "n" else ("W" if r in axis else "L")
            want = needs.get(i, {}).get(r, "W" if rep[i] == "W" else "C" if rep[i] == "C" else "L")
            if have != want and (have in ("W", "T") or want in ("W", "T")):
                layer = graph.layer_names[graph.layer[i]]
                raise _simulated(what, layer, f"node {i} ({eg.instrs[i].target}) reads a sliced value as a whole")
    for j in param_rows:
        for refs in (eg.grad_refs, eg.new_param_refs):
            r = refs[j]
            if r is None or r.kind != "n" or rep[r.index] != "W" or axis.get(r) != 0:
                raise _simulated(what, eg.placeholders[j].name, "its gradient or update is not computed on the rank's slice")
    for j, r in enumerate(eg.grad_refs):
        if j not in param_rows and r is not None and r.kind == "n" and rep[r.index] != "L":
            why = "the gradient of this data-parallel parameter is not computed on the batch shard"
            raise _simulated(what, eg.placeholders[j].name, why)
    return ChannelPlan(k, rep, needs, scale, shape_args, {j: "W" for j in param_rows}, param_rows, names_of_layers)


# ---------------------------------------------------------------------------- planning
def _is_layer_graph(graph: Any) -> bool:
    return type(graph).__name__ == "LayerGraph"


def _uniform_sample_config(strategy: Strategy, what: str, names: Sequence[str]) -> tuple[int, ...] | None:
    """The devices of a pure data-parallel strategy; None for a pure placement; refuse mixes."""
    cid = strategy.config_id
    if (cid < 0).all():
        return None
    if (cid < 0).any():
        v = int(np.flatnonzero(cid < 0)[0])
        raise RealRunError(
            f"{what}: node {v} ({names[v]}) is placed while others carry parallel configs; a mix of placement and "
            "configs is only simulated (sim=realrun executes pure placements and pure data parallelism)"
        )
    used = sorted(set(cid.tolist()))
    cfgs = [strategy.configs[c] for c in used]
    first = cfgs[0]
    for c, cfg in zip(used, cfgs):
        other = {k: d for k, d in cfg.dims if d > 1 and k != "sample"}
        if other:
            v = int(np.flatnonzero(cid == c)[0])
            raise RealRunError(
                f"{what}: node {v} ({names[v]}) has config {cfg}, split along {sorted(other)}; sim=realrun executes "
                "sample-dimension (data) parallelism only on this graph - other configs are only simulated"
            )
        if cfg.devices != first.devices:
            v = int(np.flatnonzero(cid == c)[0])
            raise RealRunError(
                f"{what}: node {v} ({names[v]}) has config {cfg} but others {first}; data parallelism with different "
                "device sets per node is only simulated"
            )
    return tuple(first.devices)


def _split(cfg: Any) -> dict[str, int]:
    """The dims a config splits (degree > 1); {} for a placed node."""
    return {} if cfg is None else {d: n for d, n in cfg.dims if n > 1}


def _layer_channel_split(lg: Any, strategy: Strategy, what: str) -> tuple[tuple[int, ...], list[int], list[int]]:
    """The devices, channel-parallel linear layers and channel-parallel elementwise layers of a
    layer-graph strategy whose layers are each ``{sample: k}`` or ``{channel: k}`` (linear or
    elementwise) on the same k devices; anything else is refused, naming the layer."""
    devs: tuple[int, ...] | None = None
    first = ""
    linear, elementwise = [], []
    for v in range(lg.num_nodes):
        kind, name = lg.kinds[v], lg.names[v]
        if kind == "input":
            continue
        cfg = strategy.config_of(v)
        if cfg is None:
            raise RealRunError(f"{what}: layer {name!r} is placed on device {int(strategy.device[v])} while other layers carry parallel "
                               "configs; a mix of placement and configs is simulated only")
        split = _split(cfg)
        if devs is None:
            devs, first = tuple(sorted(cfg.devices)), name
        k = len(devs)
        if tuple(sorted(cfg.devices)) != devs:
            raise RealRunError(f"{what}: layer {name!r} has config {cfg} but layer {first!r} runs on devices {list(devs)}; configs on "
                               "different device sets are simulated only (sim=realrun runs every layer on the same k devices)")
        if split == {"sample": k}:
            continue
        if split == {"channel": k} and kind == "linear":
            linear.append(v)
        elif split == {"channel": k} and kind == "elementwise":
            elementwise.append(v)
        else:
            raise RealRunError(
                f"{what}: layer {name!r} ({kind}) has config {cfg}, a {' x '.join(f'{d}={n}' for d, n in split.items()) or 'degree-1'} "
                f"split; sim=realrun executes {{sample: {k}}} (data parallelism) and {{channel: {k}}} on linear and elementwise layers "
                "over the same devices - this config is simulated only"
            )
    assert devs is not None
    return devs, linear, elementwise


class RealRun:
    """``sim=realrun``: simulate (``step_time_s``) and execute for real (``measured_step_time_s``)."""

    #: harness.run captures the graph with its fx module and calls :meth:`bind` with the source
    needs_fx = True

    def __init__(
        self,
        warmup: int = 5,
        steps: int = 50,
        backend: str = "auto",
        device: str = "auto",
        threads_per_rank: int = 1,
        launcher: str = "spawn",
        order: str = "strict",
        timeout_s: float = 600.0,
        job_dir: str | None = None,
        spin_idle: bool = True,
        early_recv: bool = True,
        steady_malloc: bool = True,
        interleave_profile: bool = False,
        trace: bool = False,
        rank_timeout_s: float = 120.0,
        force: bool = False,
        **params: Any,
    ) -> None:
        if launcher not in ("spawn", "torchrun", "prepare"):
            raise ValueError(f"sim.launcher must be spawn, torchrun or prepare, got {launcher!r}")
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"sim.backend must be auto, gloo or nccl, got {backend!r}")
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"sim.device must be auto, cpu or cuda, got {device!r}")
        if int(warmup) < 0 or int(steps) < 1:
            raise ValueError(f"sim.warmup must be >= 0 and sim.steps >= 1 (got {warmup}, {steps})")
        self.warmup, self.steps = int(warmup), int(steps)
        self.backend, self.device, self.launcher = backend, device, launcher
        self.threads = int(threads_per_rank)
        self.order = order
        self.timeout_s = float(timeout_s)
        self.rank_timeout_s = float(rank_timeout_s)
        if not 0 < self.rank_timeout_s < self.timeout_s:
            raise RealRunError(f"sim.rank_timeout_s must be > 0 and below sim.timeout_s ({timeout_s}), torch.distributed's own timeout, "
                               f"or a rank waiting for a stalled one fails first and the stalled one goes unnamed; got {rank_timeout_s} "
                               "(raise sim.timeout_s with it)")
        self.force = bool(force)
        self.job_dir = job_dir
        self.spin_idle = bool(spin_idle)
        self.early_recv = bool(early_recv)
        self.steady_malloc = bool(steady_malloc)
        self.interleave_profile = bool(interleave_profile)
        self.trace = bool(trace)
        self.params = params
        self.source: Any = None
        self.seed = 0
        self.graph_cfg: dict[str, Any] = {}

    def bind(self, source: Any, seed: int = 0, graph_cfg: dict[str, Any] | None = None) -> None:
        """The model source (real weights and inputs come from a real instance of it)."""
        self.source = source
        self.seed = int(seed)
        self.graph_cfg = dict(graph_cfg or {})

    # ------------------------------------------------------------------ plan -> job
    def _device(self) -> str:
        import torch

        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def _exec_graph(self, batch: int, granularity: str) -> tuple[OpGraph, ExecGraph]:
        src = self.source
        if batch != src.batch_size:
            src = copy.copy(src)
            src.batch_size = int(batch)
        opt = self.graph_cfg.get("optimizer", "sgd")
        probe = self.graph_cfg.get("batch_probe", True)
        g = src.op_graph(granularity=granularity, optimizer=opt, batch_probe=probe, keep_fx=True)
        return g, ExecGraph.from_graph(g)

    def prepare(self, graph: Any, strategy: Strategy, num_devices: int, collect: bool = False) -> Job:
        """Check that the plan can run for real and build each rank's program."""
        if self.source is None or not hasattr(self.source, "build"):
            raise RealRunError(
                "sim=realrun needs a PyTorch model source (a zoo model or model=custom); "
                + ("none was bound (harness.run binds it; call RealRun.bind(source) yourself otherwise)" if self.source is None
                   else f"model {getattr(self.source, 'name', '?')!r} is a {type(self.source).__name__}, which has nothing to execute")
            )
        name = getattr(self.source, "name", "?")
        what = f"model {name!r}"
        if _is_layer_graph(graph):
            inputs = np.array([k == "input" for k in graph.kinds], dtype=bool)
            keep = ~inputs
            if any(_split(strategy.config_of(v)).get("channel", 1) > 1 for v in np.flatnonzero(keep)):
                devs, linear, elementwise = _layer_channel_split(graph, strategy, what)
                return self._dp_job(devs, num_devices, collect, "aten", int(self.source.batch_size), None, (graph, linear, elementwise))
            sub = Strategy(strategy.device[keep], strategy.order[keep], strategy.config_id[keep], strategy.configs)
            try:
                devs = _uniform_sample_config(sub, f"{what} (layer graph)", [n for n, k in zip(graph.names, keep) if k])
            except RealRunError as e:
                raise RealRunError(f"{e}. Of layer-graph (OptCNN / PaSE) strategies only data parallelism with channel-parallel "
                                   "linear (and elementwise) layers runs for real; other configs are simulated only") from None
            if devs is None:
                raise RealRunError(f"{what}: a layer-graph strategy without parallel configs cannot be executed")
            return self._dp_job(devs, num_devices, collect, "aten", int(self.source.batch_size), None)
        if not isinstance(graph, OpGraph):
            raise RealRunError(f"{what}: cannot execute a plan on a {type(graph).__name__}")
        if graph.meta.get("synthetic"):
            raise RealRunError(f"{what}: a synthetic graph has no operators to execute")
        devs = _uniform_sample_config(strategy, what, graph.names)
        gran = str(graph.meta.get("granularity", self.graph_cfg.get("granularity", "aten")))
        B = int(graph.meta.get("batch_size", self.source.batch_size))
        aten, eg, grp = self._resolve_graph(graph, gran, B, what)
        if devs is not None:
            order = strategy.order if grp is None else None
            return self._dp_job(devs, num_devices, collect, "aten" if gran == "layer" else gran, B, order)
        # operator placement
        if grp is None:
            dev, order = strategy.device.astype(np.int64), strategy.order.astype(np.int64)
        else:  # a layer-granularity node runs its aten ops, in their order, on its device
            dev = strategy.device.astype(np.int64)[grp]
            order = np.empty(aten.num_nodes, np.int64)
            key = sorted(range(aten.num_nodes), key=lambda j: (int(strategy.order[grp[j]]), j))
            order[key] = np.arange(aten.num_nodes)
        if (dev < 0).any() or (dev >= num_devices).any():
            v = int(np.flatnonzero((dev < 0) | (dev >= num_devices))[0])
            raise RealRunError(f"{what}: node {v} ({aten.names[v]}) is on device {int(dev[v])}, outside 0..{num_devices - 1}")
        home = _param_home_nodes(aten)
        # NCCL runs a rank's sends and receives to one peer in order on one stream, and a posted
        # receive holds that stream until its data comes: posted up front, it would block the
        # sends its own data depends on.  gloo matches by tag and sends from the caller's thread.
        progs = placement_programs(eg, dev, order, num_devices, home, early_recv=self.early_recv and self._backend() == "gloo")
        job = self._job("placement", eg, progs, num_devices, collect, [], int(aten.meta["batch_size"]))
        job.ref_group = grp
        return job

    def _resolve_graph(self, graph: OpGraph, gran: str, batch: int, what: str) -> tuple[OpGraph, ExecGraph, np.ndarray | None]:
        """The captured aten graph (with fx) the plan's graph stands for, its ExecGraph, and for
        a layer-granularity graph the coarse node of every aten node; refuse a rewritten graph.

        A plan graph without an fx module is accepted when it is structurally the captured graph
        (same names, targets and edges: an algorithm that copied it without changing it)."""
        if graph.fx is not None:
            return graph, ExecGraph.from_graph(graph), None
        if gran == "layer":
            aten, eg = self._exec_graph(batch, "aten")
            grp = layer_runs(aten)
            starts = np.flatnonzero(np.concatenate([[True], grp[1:] != grp[:-1]])) if aten.num_nodes else np.zeros(0, np.int64)
            if len(starts) == graph.num_nodes and [aten.names[s] for s in starts] == list(graph.names):
                return aten, eg, grp
            raise RealRunError(self._rewritten(what, graph))
        aten, eg = self._exec_graph(batch, gran)
        same = (aten.num_nodes == graph.num_nodes and list(aten.names) == list(graph.names) and list(aten.targets) == list(graph.targets)
                and np.array_equal(aten.src, graph.src) and np.array_equal(aten.dst, graph.dst))
        if not same:
            raise RealRunError(self._rewritten(what, graph))
        return aten, eg, None

    @staticmethod
    def _rewritten(what: str, graph: OpGraph) -> str:
        return (f"{what}: the plan's graph ({graph.num_nodes} nodes) is not the captured graph - it was rewritten by the "
                "algorithm (FD-DPS split sub-ops, Celeritas coarse nodes) or loaded from a file, and has no executable form; "
                "it is only simulated (sim=default)")

    def _dp_job(self, devs: tuple[int, ...], num_devices: int, collect: bool, granularity: str, B: int, order: np.ndarray | None,
                channels: tuple[Any, list[int], list[int]] | None = None) -> Job:
        """Data parallelism over ``devs``; ``channels`` = (layer graph, its channel-parallel
        linear layers, its channel-parallel elementwise layers) runs those channel-parallel."""
        k = len(devs)
        if B % k:
            raise RealRunError(f"model {self.source.name!r}: data parallelism over {k} devices needs a batch divisible by {k}, got {B}")
        if any(d < 0 or d >= num_devices for d in devs):
            raise RealRunError(f"data-parallel devices {list(devs)} outside 0..{num_devices - 1}")
        full, _ = self._exec_graph(B, granularity)
        g, eg = self._exec_graph(B // k, granularity)
        if list(g.targets) != list(full.targets):
            raise RealRunError(
                f"model {self.source.name!r}: the graph at batch {B // k} (each of {k} data-parallel ranks) has other ops than at "
                f"batch {B}; use a batch of at least {2 * k}"
            )
        if order is None or len(order) != g.num_nodes:
            order = np.arange(g.num_nodes)
        chan = None
        if channels is not None:
            lg, linear, elementwise = channels
            chan = channel_plan(eg, g, lg, linear, elementwise, k, f"model {self.source.name!r}")
        prog = dp_program(eg, np.asarray(order), g.batch_role, k, chan)
        progs = []
        idle = RankProgram(0, "def step(PH, RB, W, _P=()):\n    return 0.0, {}", [], [], [], 0, 0, 0)
        for r in range(num_devices):
            p = copy.copy(prog if r in devs else idle)
            p.rank = r
            progs.append(p)
        if chan is None:
            job = self._job("data_parallel", eg, progs, num_devices, collect, list(devs), B)
            job.ref_group, job.ref_fraction = layer_runs(g), 1.0 / k
            return job
        job = self._job("channel_parallel", eg, progs, num_devices, collect, list(devs), B)
        job.param_rows = dict(chan.param_rows)
        job.gather = [f"{kind}{j}" for j in sorted(chan.param_rows) for kind in ("grad", "new")]
        return job

    def _backend(self) -> str:
        return self.backend if self.backend != "auto" else ("nccl" if self._device() == "cuda" else "gloo")

    def _job(self, mode: str, eg: ExecGraph, progs: list[RankProgram], world: int, collect: bool, dp: list[int], full_batch: int) -> Job:
        device = self._device()
        backend = self._backend()
        cores, _ = rank_cores(world, self.threads)
        return Job(world, mode, backend, device, self.threads, self.warmup, self.steps, self.seed, self.source, eg, progs, cores,
                   dp, full_batch, collect, self.timeout_s, self.rank_timeout_s, spin_idle=self.spin_idle and device == "cpu",
                   steady_malloc=self.steady_malloc and device == "cpu",
                   # a channel-parallel layer's ops are not the captured graph's: no profile of them to interleave
                   interleave_profile=self.interleave_profile and mode != "channel_parallel", trace=self.trace)

    # ------------------------------------------------------------------ run
    def execute(self, graph: Any, strategy: Strategy, num_devices: int, collect: bool = False) -> "Measured":
        """Prepare, launch and read back a real run of a plan."""
        job = self.prepare(graph, strategy, num_devices, collect)
        return launch(job, self.launcher, self.job_dir)

    def check_devices(self, job: Job, cluster: Cluster) -> None:
        """Refuse to run a GPU cluster's plan here unless each rank that has work gets a GPU of
        its own (rank r runs on GPU r mod the GPUs there are): on CPU ranks or shared GPUs the
        measured step says nothing about the cluster the step was simulated on (``sim.force``
        runs it anyway).  A cluster whose devices are CPUs (``cpu2``: its device kind is a CPU's
        profile name) runs on this machine's cores, as meant."""
        kinds = sorted({d.spec.kind for d in cluster.devices if not _CPU_KIND.search(d.spec.kind)})
        if self.force or not kinds:
            return
        import torch

        used = [p.rank for p in job.programs if p.nodes]
        gpus = torch.cuda.device_count() if job.device == "cuda" else 0
        if not used or max(used) < gpus:
            return
        here = (f"its {len(used)} busy ranks would share this machine's {gpus} GPU(s)" if gpus else
                f"this machine has no GPU (sim.device={self.device}): its {len(used)} busy ranks would run on CPU cores")
        raise RealRunError(f"cluster {cluster.name!r} is {cluster.num_devices} x {'/'.join(kinds)} but {here}, and the measured step "
                           f"would say nothing about that cluster; run on a machine with {max(used) + 1} such GPUs, use cluster=cpu2 to "
                           "measure this machine's CPU, or set sim.force=true to run it anyway")

    def __call__(self, graph: Any, strategy: Strategy, cluster: Cluster, costs: CostModel) -> SimResult:
        job = self.prepare(graph, strategy, cluster.num_devices)  # refuse before spending time
        if self.launcher != "prepare":  # a prepared job runs on other hosts
            self.check_devices(job, cluster)
        res = simulate(graph, strategy, cluster, costs, self.order)
        if self.launcher == "prepare":
            d = write_job(job, self.job_dir)
            res.extras = {**getattr(res, "extras", {}), "realrun_job_dir": str(d)}
            return res
        m = launch(job, self.launcher, self.job_dir)
        extras = m.summary()
        meas = extras["measured_step_time_s"]
        extras["sim_relative_error"] = (res.step_time_s / meas - 1.0) if meas > 0 else None
        if len(m.reference_s):
            res.interleaved_costs = interleaved_costs(graph, cluster, costs, job, m.reference_s, m.reference_rank)
            t = None if res.interleaved_costs is None else simulate(graph, strategy, cluster, res.interleaved_costs, self.order).step_time_s
            extras["step_time_interleaved_s"] = t
            extras["sim_relative_error_interleaved"] = (t / meas - 1.0) if (t is not None and meas > 0) else None
        res.extras = {**getattr(res, "extras", {}), **extras}
        if self.trace:
            res.measured_timeline = {**m.timeline(), **_node_labels(graph, job)}
        return res


def _node_labels(graph: Any, job: Job) -> dict[str, Any]:
    """``node_name`` and ``node_phase`` of every executed node (``job.eg``'s) from the plan graph:
    the same node, or the coarse (layer-granularity) node it belongs to; for a graph they do not
    map onto, the executed graph's own targets and phase -1."""
    n = job.eg.num_nodes
    names, phase = getattr(graph, "names", None), getattr(graph, "phase", None)
    if names is not None and phase is not None:
        if len(names) == n:
            return {"node_name": list(names), "node_phase": np.asarray(phase, dtype=np.int64)}
        grp = job.ref_group
        if grp is not None and len(grp) == n and int(np.max(grp, initial=-1)) < len(names):
            return {"node_name": [names[g] for g in grp], "node_phase": np.asarray(phase, dtype=np.int64)[grp]}
    return {"node_name": [ins.target for ins in job.eg.instrs], "node_phase": np.full(n, -1, dtype=np.int64)}


# ---------------------------------------------------------------------------- interleaved profile
class RunProfileCosts:
    """A cost model whose compute times for one graph are those profiled in situ between a
    real run's measured steps (``sim.interleave_profile``), per device (``times[d]``: what rank
    d measured on its own cores); everything else - other graphs or fractions, transfers,
    all-reduce, memory - is the plan's own cost model's."""

    def __init__(self, base: CostModel, graph: OpGraph, fraction: float, times: np.ndarray) -> None:
        self.base, self.graph, self.fraction = base, graph, float(fraction)
        self.times = np.asarray(times, dtype=np.float64)  # [devices, nodes]
        self.cluster = base.cluster

    def node_times(self, graph: Any, device: int, fraction: float = 1.0) -> np.ndarray:
        if graph is not self.graph:
            return self.base.node_times(graph, device, fraction)
        own = self.times[device]
        if abs(float(fraction) - self.fraction) < 1e-9:
            return own
        t = self.base.node_times(graph, device, fraction)
        # a node whose work does not shrink with the batch (a weight's update, an unrolled
        # RNN's gradient accumulation) does the same work at every batch size: data
        # parallelism asks for it at fraction 1 and the reference ran it at 1/k
        return np.where(graph.batch_scaled(), t, own)

    def compute_time(self, graph: Any, node: int, device: int, fraction: float = 1.0) -> float:
        return float(self.node_times(graph, device, fraction)[node])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "base" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["base"], name)


def interleaved_costs(graph: Any, cluster: Cluster, costs: CostModel, job: Job, reference_s: np.ndarray,
                      reference_rank: np.ndarray | None = None) -> "RunProfileCosts | None":
    """The plan's cost model with its ops' times profiled *during* the real run: on each
    device, each node's mean over the reference steps its rank ran between the measured steps
    (:func:`harness.profile.in_situ_step` on the executed graph; all ranks' steps where
    ``reference_rank`` is not given or a rank ran none), summed per plan node when the plan is
    coarser.  Per rank, because the two cores of a shared VM need not be equally fast at a
    given minute.  Means, not medians: the measured step is a mean, and a mean step is the sum
    of its ops' means.  None where the executed graph does not map onto the plan's (a
    layer-graph plan) or there are no reference steps."""
    ref = np.asarray(reference_s, dtype=np.float64)
    if not isinstance(graph, OpGraph) or not len(ref):
        return None
    everyone = ref.mean(axis=0)
    rank = np.asarray(reference_rank) if reference_rank is not None else np.full(len(ref), -1)
    t = np.vstack([ref[rank == d].mean(axis=0) if (rank == d).any() else everyone for d in range(cluster.num_devices)])
    if t.shape[1] != graph.num_nodes:
        grp = job.ref_group
        if grp is None or len(grp) != t.shape[1] or int(np.max(grp)) + 1 != graph.num_nodes:
            return None
        t = np.vstack([np.bincount(np.asarray(grp), weights=row, minlength=graph.num_nodes) for row in t])
    if getattr(costs, "free_ops", "measured") == "zero":
        t = np.where(graph.free[None, :], 0.0, t)
    return RunProfileCosts(costs, graph, job.ref_fraction, t)


def interleaved_step_time(graph: Any, strategy: Strategy, cluster: Cluster, costs: CostModel, job: Job, reference_s: np.ndarray,
                          order: str = "strict", reference_rank: np.ndarray | None = None) -> float | None:
    """The simulated step of the plan with its ops' times profiled during the real run
    (:func:`interleaved_costs`).  A shared machine's speed moves by tens of percent between
    minutes (``python -m harness.calibrate --drift``); a profile interleaved with the measured
    steps sees the same machine they do.  None where there is no such profile of the plan."""
    run_costs = interleaved_costs(graph, cluster, costs, job, reference_s, reference_rank)
    return None if run_costs is None else simulate(graph, strategy, cluster, run_costs, order).step_time_s


# ---------------------------------------------------------------------------- reference
def reference_outputs(source: Any, seed: int = 0, shards: int = 1, granularity: str = "aten", optimizer: str = "sgd",
                      batch_probe: bool = True, device: Any = "cpu") -> dict[str, Any]:
    """The single-process run of the captured step that a distributed run must reproduce:
    ``{"loss", "grads", "new_params"}`` of the first step from the initial state.

    ``shards=k`` gives data parallelism's semantics: the graph at batch B/k run on each k-th
    of the batch, loss, gradients and updated parameters averaged (batch statistics per
    shard, as DDP without SyncBatchNorm; for models without batch statistics this equals the
    full-batch run up to rounding).
    """
    B = int(source.batch_size)
    if B % shards:
        raise RealRunError(f"batch {B} does not split into {shards} shards")
    src = copy.copy(source)
    src.batch_size = B // shards
    g = src.op_graph(granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, keep_fx=True)
    eg = ExecGraph.from_graph(g)
    outs = []
    for k in range(shards):
        ph = initial_state(src, eg, seed, device, batch=B, shard=None if shards == 1 else (k, shards))
        outs.append(eg.run(ph, device))
    if shards == 1:
        return outs[0]

    def mean(vals: list[Any]) -> Any:
        return None if vals[0] is None else sum(vals[1:], vals[0].clone()) / len(vals)

    n = len(outs[0]["grads"])
    return {
        "loss": mean([o["loss"] for o in outs]),
        "grads": [mean([o["grads"][j] for o in outs]) for j in range(n)],
        "new_params": [mean([o["new_params"][j] for o in outs]) for j in range(n)],
    }


# ---------------------------------------------------------------------------- progress board
class Progress:
    """One rank's row of the progress board: a file of ``world`` x :data:`BOARD_SLOTS` int64
    that every rank of a local launch maps into memory and the launcher reads (:class:`_Watchdog`).
    ``row`` is written where the rank's phase changes (:data:`P_START`...), a memory store each;
    without a board (a job run by hand under torchrun) it is the rank's own memory."""

    def __init__(self, board: str | None, rank: int) -> None:
        if board:
            with open(board, "r+b") as fh:
                buf: Any = mmap.mmap(fh.fileno(), 0)
        else:
            buf = bytearray(8 * BOARD_SLOTS * (rank + 1))
        self.row = memoryview(buf).cast("q")[rank * BOARD_SLOTS:(rank + 1) * BOARD_SLOTS]

    def set(self, phase: int, job: int | None = None, step: int | None = None) -> None:
        """Enter ``phase`` (of ``job``, at ``step``, where given)."""
        if job is not None:
            self.row[1] = job
        if step is not None:
            self.row[2] = step
        self.row[0] = phase


def _advance(row: Sequence[int]) -> tuple[int, int]:
    """How far a rank got, as a sortable key: phases before the first job, then per job its
    set-up, each step's barrier, the step itself (running or waiting inside it), the in-situ
    profile after it, and the barrier after the last step."""
    phase, job, step = (int(x) for x in row[:3])
    if phase <= P_RENDEZVOUS:
        return -1, phase
    if phase == P_DONE:
        return 1 << 40, 0
    if phase == P_SETUP:
        return job, -1
    if phase == P_FINAL:
        return job, 1 << 40
    return job, 3 * step + (0 if phase == P_BARRIER else 2 if phase in (P_PROFILE_WAIT, P_PROFILE) else 1)


def _doing(row: Sequence[int], jobs: Sequence[Job]) -> str:
    """What a rank was doing, from its row on the board."""
    phase, k, s, detail = (int(x) for x in row)
    job = jobs[min(max(k, 0), len(jobs) - 1)]
    of = f" of job {k}" if len(jobs) > 1 else ""
    at = f"step {s}{' (warm-up)' if s < job.warmup else ''}{of}"
    return {
        P_START: "had not started (never heard from, and no CPU time used, since its launch)",
        P_LOAD: "was loading its job",
        P_RENDEZVOUS: "was waiting at the rendezvous (init_process_group)",
        P_SETUP: f"was building its model, state and program{of}",
        P_BARRIER: f"was waiting at the barrier before {at}",
        P_STEP: f"was running its ops in {at}",
        P_RECV: f"was waiting for a message from rank {detail >> 32} (tag {detail & 0xFFFFFFFF}) in {at}",
        P_COLLECTIVE: f"was waiting for {f'the all-reduce of node {detail}' if detail >= 0 else 'a collective'} in {at}",
        P_DRAIN: f"was waiting for its sends to complete at the end of {at}",
        P_PROFILE_WAIT: f"was waiting at the barrier of the in-situ profile after {at}",
        P_PROFILE: f"was running the in-situ profile after {at}",
        P_FINAL: f"was waiting at the barrier after its last step{of}",
        P_DONE: "had finished",
    }.get(phase, f"was in unknown phase {phase}")


def _ranks(rs: Sequence[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def stall_message(rows: np.ndarray, jobs: Sequence[Job], timeout_s: float) -> str:
    """The line that reports a run in which no rank made progress for ``timeout_s``, from the
    board's ``rows`` (one per rank): the ranks that stopped it - of the least advanced ranks
    (:func:`_advance`) those not waiting for the others, or all of them when every one waits
    (a deadlock, a message that never comes) - then what every rank was doing."""
    keys = [_advance(r) for r in rows]
    behind = [q for q, key in enumerate(keys) if key == min(keys)]
    stuck = [q for q in behind if int(rows[q][0]) not in WAITING] or behind
    doing: dict[str, list[int]] = {}
    for q in stuck + [q for q in range(len(rows)) if q not in stuck]:
        doing.setdefault(_doing(rows[q], jobs), []).append(q)
    return (f"real run stalled: {_ranks(stuck)} stopped responding (no rank made progress for {timeout_s:g} s, sim.rank_timeout_s): "
            + "; ".join(f"{_ranks(qs)} {what if len(qs) == 1 else re.sub('^was ', 'were ', what)}" for what, qs in doing.items())
            + f"; all {len(rows)} ranks were ended (raise sim.rank_timeout_s if a step of this plan takes longer)")


def _cpu_ticks(pid: int) -> int:
    """A process's user + system CPU time in clock ticks (Linux's /proc; 0 where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


class _Watchdog:
    """The launcher's side of the progress board: creates it, and :meth:`check` raises a
    :class:`RealRunError` (:func:`stall_message`) once nothing has moved for the jobs'
    ``rank_timeout_s``: the board, nor the CPU time of a rank that has not written on it yet
    (it is starting Python and importing torch, seconds on a busy machine)."""

    def __init__(self, board: Path, jobs: Sequence[Job]) -> None:
        self.board, self.jobs = board, list(jobs)
        self.timeout_s = max(j.rank_timeout_s for j in jobs)
        board.write_bytes(bytes(8 * BOARD_SLOTS * jobs[0].world))
        self.seen: tuple[bytes, list[int]] = (b"", [])
        self.since = time.monotonic()

    def check(self, pids: Sequence[int] = ()) -> None:
        """``pids``: the ranks' processes, where known (by rank)."""
        data, now = self.board.read_bytes(), time.monotonic()
        rows = np.frombuffer(data, dtype=np.int64).reshape(-1, BOARD_SLOTS)
        state = (data, [_cpu_ticks(pid) for pid, row in zip(pids, rows) if row[0] == P_START])
        if state != self.seen:
            self.seen, self.since = state, now
        elif now - self.since > self.timeout_s:
            raise RealRunError(stall_message(rows, self.jobs, self.timeout_s))


# ---------------------------------------------------------------------------- workers
def _setup_rank(job: Job, rank: int, local_rank: int) -> tuple[Any, Any]:
    import torch

    if job.device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(job.cores[local_rank % len(job.cores)]))  # this host's cores: by local rank
    if job.steady_malloc:
        from harness.profile import steady_malloc

        steady_malloc()
    torch.set_num_threads(job.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if job.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device()), torch
    return torch.device("cpu"), torch


def _compile(prog: RankProgram, device: Any, dist: Any, pg: Any, dp_group: Any, k: int, row: Any, pos: int = 0,
             trace: list[tuple[int, int, float, float]] | None = None) -> tuple[Any, Any, list[float]]:
    """This rank's ``post(PH, RB)`` (posts the step's early receives, returns their buffers and
    handles), ``step(PH, RB, P)`` and the step's ``[send seconds, wait seconds]`` (summed by
    ``step``, reset by the caller); ``pos`` is its position among the k data-parallel ranks
    (its batch shard and, with channel parallelism, its slice of the features).  With a
    ``trace`` list, every op, send and wait appends ``(kind, id, start, end)`` to it
    (perf_counter seconds; kinds :data:`TRACE_KINDS`).  ``row`` is the rank's row of the
    progress board (:class:`Progress`): every wait and collective marks itself there."""
    import torch

    W: list[Any] = []
    pc = time.perf_counter
    acc = [0.0, 0.0]  # this step's seconds in sends, and waiting for messages and collectives
    rec = trace.append if trace is not None else None

    class _Timed:
        """A communication handle whose ``wait`` counts into the step's wait time."""

        __slots__ = ("h", "kind", "id", "phase", "detail")

        def __init__(self, h: Any, kind: int, ident: int, phase: int, detail: int) -> None:
            self.h, self.kind, self.id, self.phase, self.detail = h, kind, ident, phase, detail

        def wait(self) -> None:
            row[3] = self.detail
            row[0] = self.phase
            t = pc()
            self.h.wait()
            t1 = pc()
            row[0] = P_STEP
            acc[1] += t1 - t
            if rec is not None:
                rec((self.kind, self.id, t, t1))

    def _op(i: int, t0: float) -> float:
        t1 = pc()
        if rec is not None:
            rec((TRACE_OP, i, t0, t1))
        return t1 - t0

    def _send(t: Any, dst: int, tag: int, perm: Any = None) -> None:
        t0 = pc()
        if perm is not None:
            t = t.permute(perm)
        c = t if t.is_contiguous() else t.contiguous()
        W.append(dist.isend(c, dst, group=pg, tag=tag))
        W.append(c)
        t1 = pc()
        acc[0] += t1 - t0
        if rec is not None:
            rec((TRACE_SEND, tag, t0, t1))

    def _irecv(t: Any, src: int, tag: int) -> Any:
        return _Timed(dist.irecv(t, src, group=pg, tag=tag), TRACE_RECV, tag, P_RECV, src << 32 | tag)

    def _drain(w: list[Any]) -> None:
        row[0] = P_DRAIN
        t0 = pc()
        for x in w:
            if hasattr(x, "wait"):
                x.wait()
        w.clear()
        t1 = pc()
        row[0] = P_STEP
        acc[1] += t1 - t0
        if rec is not None:
            rec((TRACE_DRAIN, -1, t0, t1))

    def _empty(meta: TensorMeta) -> Any:
        return torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=device)

    def _empty_strided(meta: TensorMeta) -> Any:
        return meta.empty_strided(device)

    def _own(t: Any, perm: Any, copy: bool) -> Any:
        p = t.permute(perm) if perm is not None else t
        if p.is_contiguous() and t._base is None and not copy:
            return p
        return p.clone(memory_format=torch.contiguous_format)

    def _allreduce(t: Any, i: int) -> Any:
        return _Timed(dist.all_reduce(t, group=dp_group, async_op=True), TRACE_ALLREDUCE, i, P_COLLECTIVE, i)

    def _collective(op: Any, *args: Any) -> None:
        """A blocking collective over the data-parallel ranks, marked on the progress board."""
        row[3] = -1
        row[0] = P_COLLECTIVE
        op(*args, group=dp_group)
        row[0] = P_STEP

    # channel parallelism: conversions between representations (see ChannelPlan), blocking
    # collectives over the k data-parallel ranks; rows are samples (batch-major), columns features
    def _ag_rows(t: Any) -> Any:  # L [b, f] -> R [k*b, f]
        out = torch.empty((k * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
        _collective(dist.all_gather, list(out.chunk(k, 0)), t.contiguous())
        return out

    def _ag_cols(t: Any) -> Any:  # C [B, f/k] -> R [B, f]
        parts = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for _ in range(k)]
        _collective(dist.all_gather, parts, t.contiguous())
        return torch.cat(parts, 1)

    def _a2a_lc(t: Any) -> Any:  # L [b, f] -> C [k*b, f/k]: feature block q goes to rank q
        b, f = t.shape
        send = t.reshape(b, k, f // k).transpose(0, 1).contiguous()
        recv = torch.empty_like(send)
        _collective(dist.all_to_all_single, recv, send)
        return recv.view(k * b, f // k)

    def _a2a_cl(t: Any) -> Any:  # C [k*b, f/k] -> L [b, f]: rows of rank q go to rank q
        rows, o = t.shape
        send = t.contiguous()
        recv = torch.empty_like(send)
        _collective(dist.all_to_all_single, recv, send)
        return recv.view(k, rows // k, o).transpose(0, 1).reshape(rows // k, k * o)

    def _ar(t: Any) -> Any:  # P [B, f] -> R [B, f], summed in place
        _collective(dist.all_reduce, t)
        return t

    def _rows(t: Any) -> Any:  # R -> L: this rank's samples
        b = t.shape[0] // k
        return t.narrow(0, pos * b, b)

    def _cols(t: Any) -> Any:  # R -> C: this rank's features
        o = t.shape[1] // k
        return t.narrow(1, pos * o, o).contiguous()

    ns: dict[str, Any] = {
        "K": prog.consts, "DEV": device, "_pc": time.perf_counter, "_op": _op, "_send": _send, "_irecv": _irecv, "_drain": _drain,
        "_empty": _empty, "_empty_strided": _empty_strided, "_own": _own, "_allreduce": _allreduce,
        "_ag_rows": _ag_rows, "_ag_cols": _ag_cols, "_a2a_lc": _a2a_lc, "_a2a_cl": _a2a_cl, "_ar": _ar, "_rows": _rows, "_cols": _cols,
    }
    for i, t in enumerate(prog.targets):
        ns[f"F{i}"] = resolve(t)
    exec(compile(prog.code, f"<realrun rank {prog.rank}>", "exec"), ns)
    step = ns["step"]
    return ns.get("post", lambda PH, RB: ()), (lambda PH, RB, P: step(PH, RB, W, P)), acc


def _minor_faults() -> int:
    """This process's minor page faults so far (0 where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def _run_job(job: Job, rank: int, device: Any, out_dir: str, row: Any) -> None:
    """Build this rank's state and program for one job, run and time its steps, save the record;
    ``row``: the rank's row of the progress board (:class:`Progress`), in phase :data:`P_SETUP`."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    dp_group = None
    dp = job.mode in ("data_parallel", "channel_parallel")
    if dp:
        dp_group = pg if sorted(job.dp_devices) == list(range(job.world)) else dist.new_group(sorted(job.dp_devices))
    prog = job.programs[rank]
    k = len(job.dp_devices)
    pos = job.dp_devices.index(rank) if rank in job.dp_devices else 0
    if dp:
        PH = initial_state(job.source, job.eg, job.seed, device, batch=job.full_batch, shard=(pos, k))
        for j, rows in job.param_rows.items():  # channel-parallel layers: this rank's rows (output features) of W and b
            PH[j] = PH[j].narrow(0, pos * rows, rows).clone()
    else:
        PH = initial_state(job.source, job.eg, job.seed, device)
    RB = {j: job.eg.placeholders[j].meta.empty(device) for j in prog.recv_params}
    events: list[tuple[int, int, float, float]] | None = [] if job.trace else None
    post, step, acc = _compile(prog, device, dist, pg, dp_group, k, row, pos, events)
    traces: list[np.ndarray] = []  # [events, 4] per measured step: kind, id, start, end (perf_counter seconds)
    if job.interleave_profile:
        from harness.profile import dead_inputs, in_situ_step

        ref_ph = initial_state(job.source, job.eg, job.seed, device)
        ref_dead = dead_inputs(job.eg)
        ref_fns = [resolve(ins.target) for ins in job.eg.instrs]
    reference: list[np.ndarray] = []
    starts, ends, busy, sent, waited, faults = [], [], [], [], [], []
    outputs: dict[str, Any] | None = None
    for s in range(job.warmup + job.steps):
        P = post(PH, RB)  # before the barrier: the peers know of every receive when the step starts
        acc[0] = acc[1] = 0.0
        row[2] = s
        row[0] = P_BARRIER
        dist.barrier()
        row[0] = P_STEP
        f0 = _minor_faults()
        t0 = time.perf_counter()
        b, outs = step(PH, RB, P)
        del P
        if job.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        faults.append(_minor_faults() - f0)
        starts.append(t0)
        ends.append(t1)
        busy.append(b)
        sent.append(acc[0])
        waited.append(acc[1])
        if events is not None:
            if s >= job.warmup:
                traces.append(np.array(events, dtype=np.float64).reshape(len(events), 4))
            events.clear()
        if s == 0 and job.collect:
            row[3] = -1
            row[0] = P_COLLECTIVE
            outputs = {key: (v.detach().cpu().clone() if hasattr(v, "detach") else v) for key, v in outs.items()}
            if dp and "loss" in outs and rank in job.dp_devices:
                loss = outs["loss"].detach().clone()
                dist.all_reduce(loss, group=dp_group)
                outputs["loss"] = (loss / len(job.dp_devices)).cpu()
            if rank in job.dp_devices:
                for key in job.gather:  # the slices of a channel-parallel layer's parameters, concatenated
                    t = outs[key].detach().contiguous()
                    parts = [torch.empty_like(t) for _ in job.dp_devices]
                    dist.all_gather(parts, t, group=dp_group)
                    outputs[key] = torch.cat(parts, 0).cpu()
            row[0] = P_STEP
        del outs
        if job.interleave_profile:
            # the ranks take turns, the others waiting at a barrier - not at the next step's: one
            # that posted its receives a whole reference step before its peer stalled ~40 ms on
            # one message in every such step (gloo over loopback, measured with sim.trace)
            row[0] = P_PROFILE_WAIT
            dist.barrier()
            if s % job.world == rank:
                row[0] = P_PROFILE
                t_ref = in_situ_step(job.eg, ref_ph, device, ref_dead, ref_fns)
                if s >= job.warmup:
                    reference.append(t_ref)
                row[0] = P_PROFILE_WAIT
            dist.barrier()
    row[0] = P_FINAL
    dist.barrier()
    rec = {"rank": rank, "start": starts, "end": ends, "busy": busy, "send": sent, "wait": waited, "faults": faults, "host": socket.gethostname(), "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
           "threads": torch.get_num_threads(), "outputs": outputs, "nodes": prog.nodes, "sends": prog.sends, "recvs": prog.recvs,
           "reference": np.asarray(reference).reshape(len(reference), job.eg.num_nodes), "trace": traces}
    torch.save(rec, os.path.join(out_dir, f"rank{rank}.pt"))


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``;
    elsewhere nothing): a rank whose launcher is gone has no one to report to."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG


def run_rank(job_dirs: Sequence[str], rank: int, local_rank: int, init_method: str, board: str | None = None) -> None:
    """One rank: load the jobs written in ``job_dirs``, pin, join the group once, then run each
    job in turn (they share world size, backend, device and threads), telling the launcher
    what it does on the progress ``board`` (:class:`Progress`); a failing job leaves
    ``rank<r>.error`` in its directory."""
    import datetime

    import torch.distributed as dist

    from harness.profile import IdleSpinners

    _die_with_parent()
    progress = Progress(board, rank)
    progress.set(P_LOAD)
    jobs = [pickle.loads(Path(d, "job.pkl").read_bytes()) for d in job_dirs]
    first = jobs[0]
    device, _ = _setup_rank(first, rank, local_rank)
    progress.set(P_RENDEZVOUS)
    dist.init_process_group(first.backend, init_method=init_method, rank=rank, world_size=first.world,
                            timeout=datetime.timedelta(seconds=max(j.timeout_s for j in jobs)))
    # the spinners are started after the rendezvous, on this rank's own (already pinned) cores
    try:
        with IdleSpinners(os.sched_getaffinity(0) if first.spin_idle and hasattr(os, "sched_getaffinity") else []):
            for k, (job, d) in enumerate(zip(jobs, job_dirs)):
                progress.set(P_SETUP, job=k, step=0)
                try:
                    _run_job(job, rank, device, d, progress.row)
                except Exception:
                    Path(d, f"rank{rank}.error").write_text(traceback.format_exc())
                    raise
        progress.set(P_DONE)
    finally:
        dist.destroy_process_group()


def _spawn_entry(local_rank: int, job_dirs: Sequence[str], init_method: str, board: str) -> None:
    """A rank started by ``torch.multiprocessing``: it leads its own process group, which its
    idle spinners join, so that the launcher ends it and them with one signal."""
    os.setpgid(0, 0)
    run_rank(job_dirs, local_rank, local_rank, init_method, board)


@dataclass
class Measured:
    """What a real run measured, read back from the ranks."""

    mode: str
    backend: str
    device: str
    world: int
    threads: int
    warmup: int
    steps: int
    step_s: np.ndarray  # [steps] measured steps (warm-up dropped)
    rank_step_s: np.ndarray  # [world] mean per rank
    rank_busy_s: np.ndarray  # [world]
    cores: list[list[int]]
    oversubscribed: bool
    launcher: str
    records: list[dict[str, Any]]
    span_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [steps] first start to last end (one host)
    rank_send_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean per step in send calls
    rank_wait_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean per step waiting for messages / collectives
    rank_faults: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean minor page faults per step
    reference_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [reference steps, nodes] interleaved in-situ profile
    reference_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [reference steps] the rank that ran each
    #: ``sim.trace``: per rank [steps, events, 4] = kind (:data:`TRACE_KINDS`), id, start, end in seconds
    #: from the step's first rank start (one host; else the rank's own start); empty without it
    trace: list[np.ndarray] = field(default_factory=list)

    @property
    def step_time_s(self) -> float:
        return float(self.step_s.mean())

    def timeline(self) -> dict[str, np.ndarray]:
        """``sim.trace``: every rank's events (op calls, sends, waits) in program order, each
        with its mean start, end and duration over the measured steps (seconds from the step's
        start): arrays ``rank, kind`` (index into :data:`TRACE_KINDS`), ``id`` (node or message
        tag), ``start_s, end_s, duration_s``; empty arrays without a trace.  Means, not medians:
        the events' durations are skewed (a wait is now and then milliseconds long), and only
        means add up to the mean step that ``measured_step_time_s`` reports."""
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "kind", "id", "start_s", "end_s", "duration_s")}
        for r, ev in enumerate(self.trace):
            if not ev.size:
                continue
            e = ev.shape[1]
            cols["rank"].append(np.full(e, r, dtype=np.int64))
            cols["kind"].append(ev[0, :, 0].astype(np.int64))
            cols["id"].append(ev[0, :, 1].astype(np.int64))
            cols["start_s"].append(ev[:, :, 2].mean(axis=0))
            cols["end_s"].append(ev[:, :, 3].mean(axis=0))
            cols["duration_s"].append((ev[:, :, 3] - ev[:, :, 2]).mean(axis=0))
        return {k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64 if k in ("rank", "kind", "id") else np.float64))
                for k, v in cols.items()}

    def outputs(self) -> dict[str, Any]:
        """Loss, gradients and updated parameters of the first step, merged over the ranks."""
        out: dict[str, Any] = {}
        for rec in self.records:
            for k, v in (rec.get("outputs") or {}).items():
                out.setdefault(k, v)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "measured_step_time_s": self.step_time_s,
            "measured_step_time_std_s": float(self.step_s.std()),
            "measured_step_time_median_s": float(np.median(self.step_s)),
            "measured_step_times_s": self.step_s.tolist(),
            "measured_span_s": float(self.span_s.mean()) if len(self.span_s) else None,
            "measured_steps": self.steps,
            "measured_warmup": self.warmup,
            "measured_rank_step_s": self.rank_step_s.tolist(),
            "measured_rank_busy_s": self.rank_busy_s.tolist(),
            "measured_rank_send_s": self.rank_send_s.tolist(),
            "measured_rank_wait_s": self.rank_wait_s.tolist(),
            "measured_rank_page_faults": self.rank_faults.tolist(),
            "measured_reference_step_s": float(self.reference_s.sum(axis=1).mean()) if len(self.reference_s) else None,
            "measured_reference_steps": int(len(self.reference_s)),
            "measured_reference_rank_step_s": [float(self.reference_s[self.reference_rank == r].sum(axis=1).mean())
                                               if (self.reference_rank == r).any() else None for r in range(self.world)],
            "realrun": {
                "mode": self.mode, "backend": self.backend, "device": self.device, "world_size": self.world,
                "threads_per_rank": self.threads, "cores": self.cores, "oversubscribed": self.oversubscribed,
                "launcher": self.launcher, "ops_per_rank": [r["nodes"] for r in self.records],
                "sends_per_rank": [r["sends"] for r in self.records],
            },
        }


def write_job(job: Job, job_dir: str | None) -> Path:
    d = Path(job_dir) if job_dir else Path(tempfile.mkdtemp(prefix="realrun-"))
    d.mkdir(parents=True, exist_ok=True)
    for f in d.glob("rank*"):
        f.unlink()
    with open(d / "job.pkl", "wb") as fh:
        pickle.dump(job, fh)
    return d


def read_results(job: Job, d: Path, launcher: str) -> Measured:
    import torch

    recs = []
    for r in range(job.world):
        err = d / f"rank{r}.error"
        if err.exists():
            raise RealRunError(f"rank {r} failed:\n{err.read_text()[-4000:]}")
        f = d / f"rank{r}.pt"
        if not f.exists():
            raise RealRunError(f"rank {r} wrote no result into {d}")
        recs.append(torch.load(f, weights_only=False))
    start = np.array([r["start"] for r in recs])[:, job.warmup:]
    end = np.array([r["end"] for r in recs])[:, job.warmup:]
    busy = np.array([r["busy"] for r in recs])[:, job.warmup:]
    one_host = len({r["host"] for r in recs}) == 1
    # a step lasts as long as its longest rank (from leaving the barrier to its last wait);
    # the span from the first start to the last end also counts the barrier's exit skew
    step = (end - start).max(axis=0)
    span = end.max(axis=0) - start.min(axis=0) if one_host else step
    _, over = rank_cores(job.world, job.threads)
    per_rank = [np.array([r[key] for r in recs])[:, job.warmup:].mean(axis=1) for key in ("send", "wait", "faults")]
    ref = np.concatenate([r["reference"] for r in recs])  # each rank's [its reference steps, nodes]
    ref_rank = np.concatenate([np.full(len(r["reference"]), r["rank"], dtype=np.int64) for r in recs])
    trace = []
    if job.trace:
        origin = start.min(axis=0) if one_host else None
        for q, r in enumerate(recs):
            ev = np.stack(r["trace"]) if len(r["trace"]) else np.zeros((0, 0, 4))
            ev[:, :, 2:] -= (origin if origin is not None else start[q])[:, None, None]
            trace.append(ev)
    return Measured(job.mode, job.backend, job.device, job.world, job.threads, job.warmup, job.steps, step, (end - start).mean(axis=1),
                    busy.mean(axis=1), [list(r["cores"]) for r in recs], over if job.device == "cpu" else False, launcher, recs, span,
                    *per_rank, reference_s=ref, reference_rank=ref_rank, trace=trace)


def _unguarded_script_hint() -> str:
    """Why ranks that died before starting may have died: ``spawn`` re-runs the caller's script
    in every rank, and a script that calls ``harness.run`` at its top level starts ranks again
    there, which multiprocessing refuses during a child's start-up."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        return ""  # python -m ... or an interactive session: nothing is re-run
    try:
        guarded = "__main__" in Path(path).read_text(errors="replace")
    except OSError:
        return ""
    if guarded:
        return ""
    return (f"\nThe ranks are started with spawn, which runs the script {path} again in every rank; it has no "
            "`if __name__ == \"__main__\":` guard, so each rank tried to start ranks of its own. Put the call under "
            "that guard, or use sim.launcher=torchrun.")


class _Terminated(BaseException):
    """SIGTERM arrived while ranks were running (raised by :func:`_sigterm_raises`'s handler)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While ranks run, SIGTERM raises :class:`_Terminated` in this thread instead of ending the
    process at once, which would leave the ranks to the kernel and the job directory behind -
    where SIGTERM has its default action and this is the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _end_ranks(procs: Sequence[Any]) -> None:
    """SIGKILL every spawned rank still running, with its process group (its idle spinners;
    a rank killed before it made its group is killed alone), and reap them all."""
    for p in procs:
        if p.exitcode is None:  # not reaped: its pid is still its own
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError):
                    kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join()


def _rank_failure(rank: int, code: int, error_file: str, dirs: Sequence[Path]) -> str:
    """What is known of a failed rank: a job's traceback (``rank<r>.error``), else the traceback
    torch.multiprocessing saved, else how it ended."""
    errs = sorted(f for d in dirs for f in d.glob("rank*.error"))
    if errs:
        return errs[0].read_text()[-4000:]
    if os.path.exists(error_file) and os.path.getsize(error_file):
        return str(pickle.loads(Path(error_file).read_bytes()))[-4000:]
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    return f"rank {rank} {how}{_unguarded_script_hint()}"


def _launch_spawn(jobs: Sequence[Job], dirs: Sequence[Path], root: Path, board: Path) -> None:
    """Run the ranks with ``torch.multiprocessing`` until they are done, one fails or they
    stall (:class:`_Watchdog`); every rank still running is ended however this returns."""
    import multiprocessing.connection

    import torch.multiprocessing as mp

    j0 = jobs[0]
    rdzv = root / "rdzv"
    rdzv.unlink(missing_ok=True)
    watch = _Watchdog(board, jobs)
    ctx = mp.start_processes(_spawn_entry, args=([str(d) for d in dirs], f"file://{rdzv}", str(board)), nprocs=j0.world,
                             join=False, start_method="spawn")
    procs = ctx.processes
    try:
        while True:
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                r = failed[0]
                raise RealRunError(f"real run ({j0.world} ranks) failed:\n{_rank_failure(r, procs[r].exitcode, ctx.error_files[r], dirs)}")
            running = [p.sentinel for p in procs if p.exitcode is None]
            if not running:
                return
            multiprocessing.connection.wait(running, timeout=POLL_S)
            watch.check([p.pid for p in procs])
    finally:
        _end_ranks(procs)
        for f in ctx.error_files:
            Path(f).unlink(missing_ok=True)


def _launch_torchrun(job: Job, d: Path, board: Path) -> None:
    """Run one job's ranks under ``python -m torch.distributed.run --standalone`` until they are
    done, fail or stall; however this returns, the agent is gone and has ended its workers."""
    watch = _Watchdog(board, [job])
    log = d / "torchrun.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={job.world}", "-m", "simulators.realrun",
           "--progress", str(board), str(d)]
    with open(log, "wb") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            try:
                p.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                watch.check()
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # the agent ends its workers' process groups
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # its workers die with it (PR_SET_PDEATHSIG)
                p.wait()
    if p.returncode != 0:
        errs = sorted(d.glob("rank*.error"))
        detail = errs[0].read_text()[-4000:] if errs else log.read_text(errors="replace")[-4000:]
        raise RealRunError(f"torchrun real run failed (exit {p.returncode}):\n{detail}")


def launch_many(jobs: Sequence[Job], launcher: str = "spawn", job_dir: str | None = None) -> list[Measured]:
    """Run jobs one after the other on one set of local ranks (``spawn``: torch.multiprocessing,
    one process start for all of them; ``torchrun``: ``python -m torch.distributed.run
    --standalone`` per job) and read back what they measured.

    A run that stalls raises a :class:`RealRunError` naming the ranks that stopped it, Ctrl-C a
    ``KeyboardInterrupt`` and SIGTERM a ``SystemExit``, each with a :class:`RealRunError` as its
    cause; every rank has been ended by then, and the job directory is removed unless
    ``job_dir`` named it (then only the launch's own files go: the board and the rendezvous
    file).  See the module docstring."""
    if not jobs:
        return []
    j0 = jobs[0]
    for j in jobs[1:]:
        if (j.world, j.backend, j.device, j.threads) != (j0.world, j0.backend, j0.device, j0.threads):
            raise RealRunError("jobs launched together must share world size, backend, device and threads per rank")
    root = Path(job_dir) if job_dir else Path(tempfile.mkdtemp(prefix="realrun-"))
    board = root / "progress"
    loopback = j0.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # single host: loopback, whatever the host name resolves to
    try:
        with _sigterm_raises():
            dirs = [write_job(j, str(root if len(jobs) == 1 else root / f"job{k}")) for k, j in enumerate(jobs)]
            if launcher == "spawn":
                _launch_spawn(jobs, dirs, root, board)
            elif launcher == "torchrun":
                for d, j in zip(dirs, jobs):
                    _launch_torchrun(j, d, board)
            else:
                raise RealRunError(f"unknown launcher {launcher!r}")
            return [read_results(j, d, launcher) for j, d in zip(jobs, dirs)]
    except KeyboardInterrupt:
        line = f"real run interrupted (SIGINT): its {j0.world} ranks were ended"
        raise KeyboardInterrupt(line) from RealRunError(line)
    except _Terminated:
        line = f"real run terminated (SIGTERM): its {j0.world} ranks were ended"
        raise SystemExit(f"error: {line}") from RealRunError(line)
    finally:
        if loopback:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        if job_dir:
            for f in (board, root / "rdzv"):
                f.unlink(missing_ok=True)
        else:
            shutil.rmtree(root, ignore_errors=True)


def launch(job: Job, launcher: str = "spawn", job_dir: str | None = None) -> Measured:
    """Run one job (see :func:`launch_many`)."""
    return launch_many([job], launcher, job_dir)[0]


#: how a job's ranks are started by hand, for the messages of :func:`main`
_TORCHRUN = "torchrun --nproc-per-node {n} -m simulators.realrun {d}"
#: the variables torchrun sets for its workers that ``env://`` needs
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main(argv: list[str] | None = None) -> int:
    """``torchrun [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT] --nproc-per-node P -m simulators.realrun JOB_DIR``

    Runs one rank of a job written by ``sim.launcher=prepare sim.job_dir=JOB_DIR`` (or by any
    launch), with ``env://`` rendezvous (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT as torchrun
    sets them); each rank writes ``JOB_DIR/rank<r>.pt``.  ``python -m simulators.realrun --summary
    JOB_DIR`` then prints the measured figures as JSON.  JOB_DIR must be shared by the hosts.
    ``--progress BOARD`` (before JOB_DIR) is the progress board of a launch of ours.  A mistake
    (no JOB_DIR, no job in it, no torchrun environment) is one line on stderr and status 2.
    """
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(main.__doc__)
        return 0

    def usage(msg: str) -> int:
        print(f"error: {msg}", file=sys.stderr)
        return 2

    summary = args[:1] == ["--summary"]
    board = args[1] if args[:1] == ["--progress"] and len(args) > 1 else None
    args = args[1:] if summary else args[2:] if board else args
    if len(args) != 1:
        return usage(f"start one rank per device of a prepared job with {_TORCHRUN.format(n='N', d='JOB_DIR')} (JOB_DIR written by "
                     "python -m harness sim=realrun sim.launcher=prepare sim.job_dir=JOB_DIR), or print its figures with "
                     "python -m simulators.realrun --summary JOB_DIR")
    d = Path(args[0])
    if not (d / "job.pkl").is_file():
        return usage(f"no job in {d} ({d / 'job.pkl'} is missing): write one with python -m harness sim=realrun sim.launcher=prepare "
                     f"sim.job_dir={d}")
    job = pickle.loads((d / "job.pkl").read_bytes())
    if summary:
        print(json.dumps(read_results(job, d, "torchrun").summary(), indent=1))
        return 0
    missing = [v for v in _TORCHRUN_ENV if v not in os.environ]
    if missing:
        return usage(f"python -m simulators.realrun runs one rank of a job and torchrun starts it ({', '.join(missing)} not set): "
                     f"{_TORCHRUN.format(n=job.world, d=d)} (across hosts add --nnodes, --node-rank and --rdzv-endpoint)")
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != job.world:
        return usage(f"the job in {d} needs {job.world} ranks, torchrun started {world}: {_TORCHRUN.format(n=job.world, d=d)}")
    run_rank([str(d)], rank, int(os.environ.get("LOCAL_RANK", rank)), "env://", board)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
