"""Channel-parallel layers in a real run: which layers of a layer-graph strategy run
``{channel: k}`` (:func:`layer_channel_split`), and the representation each node's value has
on a rank of the data-parallel program that runs them (:class:`ChannelPlan`,
:func:`channel_plan`); see :mod:`simulators.realrun` for the scheme."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from harness.core.graph import OpGraph
from harness.core.strategy import Strategy
from simulators.realrun.execgraph import ExecGraph, Ref, TensorMeta, consumers, is_shape_only, short_target
from simulators.realrun.job import RealRunError

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
    from harness.core.graph import BACKWARD, FORWARD

    n = eg.num_nodes
    rep = ["L"] * n
    needs: dict[int, dict[Ref, str]] = {}
    scale: set[int] = set()
    shape_args: dict[int, list[int]] = {}
    axis: dict[Ref, int] = {}  # W values: the axis that holds the output features
    preset: set[int] = set()
    cons = consumers(eg)
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



def split_dims(cfg: Any) -> dict[str, int]:
    """The dims a config splits (degree > 1); {} for a placed node."""
    return {} if cfg is None else {d: n for d, n in cfg.dims if n > 1}


def layer_channel_split(lg: Any, strategy: Strategy, what: str) -> tuple[tuple[int, ...], list[int], list[int]]:
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
        split = split_dims(cfg)
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

