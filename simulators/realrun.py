"""``sim=realrun``: execute a strategy for real with ``torch.distributed`` and time it.

The event simulator still gives ``step_time_s``; this backend adds what the hardware says,
``measured_step_time_s`` (and per-rank figures) to result.json.

How a strategy runs
-------------------
One process (*rank*) per device of the cluster: gloo on CPUs, NCCL on GPUs, started with
``torch.multiprocessing`` (``launcher: spawn``) or ``torchrun`` (``launcher: torchrun``; or
on several hosts by hand, see :func:`main`), rendezvous through ``env://`` or a file.  A
CPU rank is pinned to its own cores (``os.sched_setaffinity``) and runs
``threads_per_rank`` torch threads, so that the ranks behave as separate devices.

The captured joint forward + backward + SGD-update graph is turned into an
:class:`~harness.execgraph.ExecGraph` and, for each rank, into straight-line Python code
(compiled once; a few hundred nanoseconds of overhead per op, like ``torch.fx``'s own code):

* **operator placement** (every node on one device): every rank walks the nodes in the
  strategy's order and runs those placed on it; a tensor produced on rank a and read on rank
  b is sent once per (producer, destination rank) - the simulator's cache - with ``isend``
  right after it is produced and received with an ``irecv`` posted at the producer's
  position of the walk and waited for just before its first use.  Every rank posts its
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
* anything else is refused with :class:`RealRunError`: other parallel configs (channel,
  spatial, a mix of configs and placements) are simulated only; a graph rewritten by an
  algorithm (FD-DPS's split sub-ops, Celeritas's coarse nodes) has no executable form; a
  layer-graph (OptCNN / PaSE) strategy runs only when it is pure data parallelism (each
  layer ``{sample: k}`` on the same devices), which executes as above.  Layer-granularity op
  graphs (``graph.granularity=layer``) run by expanding each coarse node into its aten ops.

Step time (Celeritas Sec. 6): ``warmup`` steps are discarded and the mean of the next
``steps`` is reported.  Each step starts at a barrier; its time is that of its longest rank,
from leaving the barrier to the end of its last operation and wait (``measured_span_s``, the
first start to the last end on one host's clock, also counts the barrier's exit skew).
``measured_rank_busy_s`` is the time each rank spent inside its ops (host time on a GPU).
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harness.cluster import Cluster
from harness.costs import CostModel
from harness.execgraph import DEVICE, ExecGraph, Ref, TensorMeta, initial_state, is_shape_only, layer_runs, resolve
from harness.graph import PARTIAL, REPLICATED, OpGraph
from harness.strategy import Strategy
from simulators.simulate import SimResult, simulate
from simulators.taskgraph import _param_home_nodes


class RealRunError(RuntimeError):
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
    mode: str  # placement | data_parallel
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

    def call(self, out: str, i: int, name_of: Any, timed: bool = True) -> None:
        ins = self.eg.instrs[i]
        args = [self.expr(a, name_of) for a in ins.args]
        args += [f"{k}={self.expr(v, name_of)}" for k, v in ins.kwargs.items()]
        fn = self.target(ins.target)
        if timed:
            self.lines.append(f"    _t = _pc(); {out} = {fn}({', '.join(args)}); _b += _pc() - _t")
        else:
            self.lines.append(f"    {out} = {fn}({', '.join(args)})")
        self.nodes += 1

    def source(self, body: list[str], prologue: list[str], epilogue: list[str]) -> str:
        return "\n".join(["def step(PH, RB, W):", "    _b = 0.0", *prologue, *body, *epilogue])


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


def placement_programs(eg: ExecGraph, dev: np.ndarray, order: np.ndarray, world: int, home_node: np.ndarray) -> list[RankProgram]:
    """Per-rank programs of an operator placement (``dev[i]`` = rank of node i)."""
    n = eg.num_nodes
    cons = _consumers(eg)
    walk = sorted(range(n), key=lambda i: (int(order[i]), i))
    em = [_Emitter(r, eg) for r in range(world)]
    body: list[list[str]] = [[] for _ in range(world)]
    for e, b in zip(em, body):
        e.lines = b
    tag = 0
    outputs = {r.index for r in eg.outputs if r is not None and r.kind == "n"}
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
            prologue[r].append(f"    ph{j} = RB[{j}]; hp{j} = _irecv(ph{j}, {h}, {tag})")
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
                body[rc].append(f"    {nm} = _empty({em[rc].const(wire)}); h{tag} = _irecv({nm}, {r}, {tag})")
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


def dp_program(eg: ExecGraph, order: np.ndarray, roles: np.ndarray, k: int) -> RankProgram:
    """The program every data-parallel rank runs (the graph at batch B/k, gradient all-reduce)."""
    n = eg.num_nodes
    cons = _consumers(eg)
    e = _Emitter(0, eg)
    body = e.lines
    grads = {r.index for r in eg.grad_refs if r is not None and r.kind == "n"}
    reduce = {i for i in range(n) if roles[i] == PARTIAL and (any(roles[c] == REPLICATED for c, so in cons[i] if not so) or i in grads)}
    ph_read = _ph_readers(eg)
    prologue = [f"    ph{j} = PH[{j}]" for j in range(len(eg.placeholders)) if ph_read[j]]
    walk = sorted(range(n), key=lambda i: (int(order[i]), i))
    reduced_for: dict[int, set[int]] = {i: {c for c, so in cons[i] if not so and roles[c] == REPLICATED} for i in reduce}

    def namer(consumer: int) -> Any:
        so = is_shape_only(eg.instrs[consumer].target)

        def name_of(ref: Ref) -> str:
            if ref.kind == "p":
                return f"ph{ref.index}"
            i = ref.index
            if so:
                nm = f"s{i}"
                if nm not in e.standins:
                    body.append(f"    {nm} = _empty_strided({e.const(eg.instrs[i].out)})")
                    e.standins.add(nm)
                return nm
            if i in reduce and consumer in reduced_for[i]:
                return f"g{i}"
            return f"v{i}"

        return name_of

    for i in walk:
        e.call(f"v{i}", i, namer(i))
        if i in reduce:
            private = all(c in reduced_for[i] for c, so in cons[i] if not so)
            meta = eg.instrs[i].out
            perm = meta.dense_perm() if isinstance(meta, TensorMeta) else None
            inv = None if perm is None else tuple(int(x) for x in np.argsort(perm))
            # reduced in a contiguous buffer (the traced layout, permuted), a private copy when
            # batched consumers still read the local value
            body.append(f"    g{i} = _own(v{i}, {perm!r}, {not private}); hg{i} = _allreduce(g{i})")
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

    pat = re.compile(r"\b([vmsg])(\d+)\b")
    last: dict[str, int] = {}
    for ln, line in enumerate(lines):
        for kind, num in pat.findall(line):
            last[kind + num] = ln
    dels: dict[int, list[str]] = {}
    for name, ln in last.items():
        num = int(name[1:])
        if name[0] == "v" and num in keep_nodes:
            continue
        if name[0] == "g" and keep_g is not None and num in keep_g:
            continue
        dels.setdefault(ln, []).append(name)
    for ln in sorted(dels, reverse=True):
        lines.insert(ln + 1, "    del " + ", ".join(sorted(dels[ln])))


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


def _cores(world: int, threads: int) -> tuple[list[list[int]], bool]:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    need = world * threads
    cores = [[allowed[(r * threads + t) % len(allowed)] for t in range(threads)] for r in range(world)]
    return cores, need > len(allowed)


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
        self.job_dir = job_dir
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
            sub = Strategy(strategy.device[keep], strategy.order[keep], strategy.config_id[keep], strategy.configs)
            try:
                devs = _uniform_sample_config(sub, f"{what} (layer graph)", [n for n, k in zip(graph.names, keep) if k])
            except RealRunError as e:
                raise RealRunError(f"{e}. Of layer-graph (OptCNN / PaSE) strategies only pure data parallelism runs for real; "
                                   "channel-parallel layers (OWT, model parallelism) and other configs are simulated only") from None
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
        progs = placement_programs(eg, dev, order, num_devices, home)
        return self._job("placement", eg, progs, num_devices, collect, [], int(aten.meta["batch_size"]))

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

    def _dp_job(self, devs: tuple[int, ...], num_devices: int, collect: bool, granularity: str, B: int, order: np.ndarray | None) -> Job:
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
        prog = dp_program(eg, np.asarray(order), g.batch_role, k)
        progs = []
        idle = RankProgram(0, "def step(PH, RB, W):\n    return 0.0, {}", [], [], [], 0, 0, 0)
        for r in range(num_devices):
            p = copy.copy(prog if r in devs else idle)
            p.rank = r
            progs.append(p)
        return self._job("data_parallel", eg, progs, num_devices, collect, list(devs), B)

    def _job(self, mode: str, eg: ExecGraph, progs: list[RankProgram], world: int, collect: bool, dp: list[int], full_batch: int) -> Job:
        device = self._device()
        backend = self.backend if self.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
        cores, _ = _cores(world, self.threads)
        return Job(world, mode, backend, device, self.threads, self.warmup, self.steps, self.seed, self.source, eg, progs, cores,
                   dp, full_batch, collect, self.timeout_s)

    # ------------------------------------------------------------------ run
    def execute(self, graph: Any, strategy: Strategy, num_devices: int, collect: bool = False) -> "Measured":
        """Prepare, launch and read back a real run of a plan."""
        job = self.prepare(graph, strategy, num_devices, collect)
        return launch(job, self.launcher, self.job_dir)

    def __call__(self, graph: Any, strategy: Strategy, cluster: Cluster, costs: CostModel) -> SimResult:
        job = self.prepare(graph, strategy, cluster.num_devices)  # refuse before spending time
        res = simulate(graph, strategy, cluster, costs, self.order)
        if self.launcher == "prepare":
            d = write_job(job, self.job_dir)
            res.extras = {**getattr(res, "extras", {}), "realrun_job_dir": str(d)}
            return res
        m = launch(job, self.launcher, self.job_dir)
        extras = m.summary()
        extras["sim_relative_error"] = (res.step_time_s / extras["measured_step_time_s"] - 1.0) if extras["measured_step_time_s"] > 0 else None
        res.extras = {**getattr(res, "extras", {}), **extras}
        return res


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


# ---------------------------------------------------------------------------- workers
def _setup_rank(job: Job, rank: int, local_rank: int) -> tuple[Any, Any]:
    import torch

    if job.device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(job.cores[local_rank % len(job.cores)]))  # this host's cores: by local rank
    torch.set_num_threads(job.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if job.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device()), torch
    return torch.device("cpu"), torch


def _compile(prog: RankProgram, device: Any, dist: Any, pg: Any, dp_group: Any, k: int) -> Any:
    import torch

    W: list[Any] = []

    def _send(t: Any, dst: int, tag: int, perm: Any = None) -> None:
        if perm is not None:
            t = t.permute(perm)
        c = t if t.is_contiguous() else t.contiguous()
        W.append(dist.isend(c, dst, group=pg, tag=tag))
        W.append(c)

    def _irecv(t: Any, src: int, tag: int) -> Any:
        return dist.irecv(t, src, group=pg, tag=tag)

    def _drain(w: list[Any]) -> None:
        for x in w:
            if hasattr(x, "wait"):
                x.wait()
        w.clear()

    def _empty(meta: TensorMeta) -> Any:
        return torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=device)

    def _empty_strided(meta: TensorMeta) -> Any:
        return meta.empty_strided(device)

    def _own(t: Any, perm: Any, copy: bool) -> Any:
        p = t.permute(perm) if perm is not None else t
        if p.is_contiguous() and t._base is None and not copy:
            return p
        return p.clone(memory_format=torch.contiguous_format)

    def _allreduce(t: Any) -> Any:
        return dist.all_reduce(t, group=dp_group, async_op=True)

    ns: dict[str, Any] = {
        "K": prog.consts, "DEV": device, "_pc": time.perf_counter, "_send": _send, "_irecv": _irecv, "_drain": _drain,
        "_empty": _empty, "_empty_strided": _empty_strided, "_own": _own, "_allreduce": _allreduce,
    }
    for i, t in enumerate(prog.targets):
        ns[f"F{i}"] = resolve(t)
    exec(compile(prog.code, f"<realrun rank {prog.rank}>", "exec"), ns)
    step = ns["step"]
    return lambda PH, RB: step(PH, RB, W)


def _run_job(job: Job, rank: int, device: Any, out_dir: str) -> None:
    """Build this rank's state and program for one job, run and time its steps, save the record."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    dp_group = None
    if job.mode == "data_parallel":
        dp_group = pg if sorted(job.dp_devices) == list(range(job.world)) else dist.new_group(sorted(job.dp_devices))
    prog = job.programs[rank]
    if job.mode == "data_parallel":
        shard = (job.dp_devices.index(rank), len(job.dp_devices)) if rank in job.dp_devices else (0, len(job.dp_devices))
        PH = initial_state(job.source, job.eg, job.seed, device, batch=job.full_batch, shard=shard)
    else:
        PH = initial_state(job.source, job.eg, job.seed, device)
    RB = {j: job.eg.placeholders[j].meta.empty(device) for j in prog.recv_params}
    step = _compile(prog, device, dist, pg, dp_group, len(job.dp_devices))
    starts, ends, busy = [], [], []
    outputs: dict[str, Any] | None = None
    for s in range(job.warmup + job.steps):
        dist.barrier()
        t0 = time.perf_counter()
        b, outs = step(PH, RB)
        if job.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        starts.append(t0)
        ends.append(t1)
        busy.append(b)
        if s == 0 and job.collect:
            outputs = {k: (v.detach().cpu().clone() if hasattr(v, "detach") else v) for k, v in outs.items()}
            if job.mode == "data_parallel" and "loss" in outs and rank in job.dp_devices:
                loss = outs["loss"].detach().clone()
                dist.all_reduce(loss, group=dp_group)
                outputs["loss"] = (loss / len(job.dp_devices)).cpu()
        del outs
    dist.barrier()
    rec = {"rank": rank, "start": starts, "end": ends, "busy": busy, "host": socket.gethostname(), "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
           "threads": torch.get_num_threads(), "outputs": outputs, "nodes": prog.nodes, "sends": prog.sends, "recvs": prog.recvs}
    torch.save(rec, os.path.join(out_dir, f"rank{rank}.pt"))


def run_rank(jobs: Sequence[Job], out_dirs: Sequence[str], rank: int, local_rank: int, init_method: str) -> None:
    """One rank: pin, join the group once, then run each job in turn (they share world size,
    backend, device and threads); a failing job leaves ``rank<r>.error`` in its directory."""
    import datetime

    import torch.distributed as dist

    first = jobs[0]
    device, _ = _setup_rank(first, rank, local_rank)
    dist.init_process_group(first.backend, init_method=init_method, rank=rank, world_size=first.world,
                            timeout=datetime.timedelta(seconds=max(j.timeout_s for j in jobs)))
    try:
        for job, d in zip(jobs, out_dirs):
            try:
                _run_job(job, rank, device, d)
            except Exception:
                Path(d, f"rank{rank}.error").write_text(traceback.format_exc())
                raise
    finally:
        dist.destroy_process_group()


def _spawn_entry(local_rank: int, jobs: Sequence[Job], init_method: str, out_dirs: Sequence[str]) -> None:
    run_rank(jobs, out_dirs, local_rank, local_rank, init_method)


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

    @property
    def step_time_s(self) -> float:
        return float(self.step_s.mean())

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
            "measured_span_s": float(self.span_s.mean()) if len(self.span_s) else None,
            "measured_steps": self.steps,
            "measured_warmup": self.warmup,
            "measured_rank_step_s": self.rank_step_s.tolist(),
            "measured_rank_busy_s": self.rank_busy_s.tolist(),
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
    _, over = _cores(job.world, job.threads)
    return Measured(job.mode, job.backend, job.device, job.world, job.threads, job.warmup, job.steps, step, (end - start).mean(axis=1),
                    busy.mean(axis=1), [list(r["cores"]) for r in recs], over if job.device == "cpu" else False, launcher, recs, span)


def launch_many(jobs: Sequence[Job], launcher: str = "spawn", job_dir: str | None = None) -> list[Measured]:
    """Run jobs one after the other on one set of local ranks (``spawn``: torch.multiprocessing,
    one process start for all of them; ``torchrun``: ``python -m torch.distributed.run
    --standalone`` per job) and read back what they measured."""
    import torch.multiprocessing as mp

    if not jobs:
        return []
    j0 = jobs[0]
    for j in jobs[1:]:
        if (j.world, j.backend, j.device, j.threads) != (j0.world, j0.backend, j0.device, j0.threads):
            raise RealRunError("jobs launched together must share world size, backend, device and threads per rank")
    root = Path(job_dir) if job_dir else Path(tempfile.mkdtemp(prefix="realrun-"))
    dirs = [write_job(j, str(root if len(jobs) == 1 else root / f"job{k}")) for k, j in enumerate(jobs)]
    env_backup = os.environ.get("GLOO_SOCKET_IFNAME")
    if j0.backend == "gloo" and env_backup is None:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # single host: loopback, whatever the host name resolves to
    try:
        if launcher == "spawn":
            rdzv = root / "rdzv"
            if rdzv.exists():
                rdzv.unlink()
            try:
                mp.start_processes(_spawn_entry, args=(list(jobs), f"file://{rdzv}", [str(d) for d in dirs]), nprocs=j0.world,
                                   join=True, start_method="spawn")
            except Exception as e:  # noqa: BLE001 - report the rank's own traceback
                errs = sorted(p for d in dirs for p in d.glob("rank*.error"))
                detail = errs[0].read_text()[-4000:] if errs else str(e)
                raise RealRunError(f"real run ({j0.world} ranks) failed:\n{detail}") from e
        elif launcher == "torchrun":
            for d, j in zip(dirs, jobs):
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={j.world}", "-m", "simulators.realrun", str(d)]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=j.timeout_s * 2)
                if p.returncode != 0:
                    errs = sorted(d.glob("rank*.error"))
                    detail = errs[0].read_text()[-4000:] if errs else p.stderr[-4000:]
                    raise RealRunError(f"torchrun real run failed (exit {p.returncode}):\n{detail}")
        else:
            raise RealRunError(f"unknown launcher {launcher!r}")
    finally:
        if env_backup is None and j0.backend == "gloo":
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
    return [read_results(j, d, launcher) for j, d in zip(jobs, dirs)]


def launch(job: Job, launcher: str = "spawn", job_dir: str | None = None) -> Measured:
    """Run one job (see :func:`launch_many`)."""
    return launch_many([job], launcher, job_dir)[0]


def main(argv: list[str] | None = None) -> int:
    """``torchrun [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT] --nproc-per-node P -m simulators.realrun JOB_DIR``

    Runs one rank of a job written by ``sim.launcher=prepare sim.job_dir=JOB_DIR`` (or by any
    launch), with ``env://`` rendezvous (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT as torchrun
    sets them); each rank writes ``JOB_DIR/rank<r>.pt``.  ``python -m simulators.realrun --summary
    JOB_DIR`` then prints the measured figures as JSON.  JOB_DIR must be shared by the hosts.
    """
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0
    if args[0] == "--summary":
        d = Path(args[1])
        job = pickle.loads((d / "job.pkl").read_bytes())
        print(json.dumps(read_results(job, d, "torchrun").summary(), indent=1))
        return 0
    d = Path(args[0])
    job = pickle.loads((d / "job.pkl").read_bytes())
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != job.world:
        raise RealRunError(f"the job needs {job.world} ranks, torchrun started {world}")
    run_rank([job], [str(d)], rank, int(os.environ.get("LOCAL_RANK", rank)), "env://")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
