"""Code generation: each rank's straight-line ``step`` function (and ``post``, which posts the
step's early receives) for an operator placement (:func:`placement_programs`) and for data
parallelism, with or without channel-parallel layers (:func:`dp_program`); see
:mod:`simulators.realrun` for what they do.  The generated code calls the helpers that
:mod:`simulators.realrun.worker` binds when it compiles it (``_send``, ``_irecv``, ``_allreduce``,
the conversions of :data:`CONVERSIONS`...)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.graph import PARTIAL, REPLICATED
from simulators.realrun.execgraph import DEVICE, ExecGraph, Ref, TensorMeta, consumers, is_shape_only
from simulators.realrun.job import RankProgram, RealRunError

if TYPE_CHECKING:
    from simulators.realrun.channel import ChannelPlan

#: (have, want) -> the collective of the compiled program (:mod:`simulators.realrun.worker`) that
#: converts a value between representations (:class:`~simulators.realrun.channel.ChannelPlan`)
CONVERSIONS = {("L", "R"): "_ag_rows", ("L", "C"): "_a2a_lc", ("C", "L"): "_a2a_cl", ("C", "R"): "_ag_cols", ("P", "R"): "_ar"}


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
    cons = consumers(eg)
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


def dp_program(eg: ExecGraph, order: np.ndarray, roles: np.ndarray, k: int, chan: ChannelPlan | None = None) -> RankProgram:
    """The program every data-parallel rank runs (the graph at batch B/k, gradient all-reduce).

    With ``chan`` (a :class:`ChannelPlan`), the nodes of channel-parallel layers hold other
    representations than the local batch shard and values are converted between
    representations where a consumer needs another one (see :mod:`simulators.realrun`)."""
    n = eg.num_nodes
    cons = consumers(eg)
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
        elif (have, want) in CONVERSIONS:
            line = f"{nm} = {CONVERSIONS[(have, want)]}({src})"
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

