"""The intra-operator solver of one transformer block: PaSE's DP and OptCNN's elimination split
the block's layer graph (:mod:`algorithms.block_graph`) over a tensor-parallel group of ``t``
GPUs, and the answer is set beside Megatron's column-then-row split.

The question (issue 35): do the seed algorithms, exact under their own cost models, rediscover
Megatron's split (Shoeybi et al. 2019: QKV and the MLP's first matrix split on their output
channels, the output projection and the MLP's second matrix on their input channels, no
communication inside either pair), and what do they choose where they differ?

Three solvers, each an exact search on the same graph over the first ``t`` GPUs of a node
(:meth:`~harness.core.cluster.Cluster.subset`, NVSwitch on the LLM clusters):

* ``pase``: PaSE's vertex elimination (:func:`algorithms.pase.vertex_elimination`) under PaSE's
  own cost model (:class:`harness.core.pase_costs.PaseCostModel`: FLOPs, an all-reduce of w
  words over P GPUs costing ``2 (P-1)/P w r`` FLOPs, ``r`` = peak / (bandwidth / 8 bytes)), with
  the GPU's peak in the block's dtype and the group's ring bandwidth as PaSE's two figures, in
  PaSE's space (its iteration domains, splits multiplying to at most ``t``, cutoff 1 as for its
  Transformer); every edge between two layers counted (``parallel_edges: all``: the query
  slices from ``qkv_split`` to ``q_stack`` are distinct tensors);
* ``optcnn``: OptCNN's node and edge elimination (:meth:`algorithms.optcnn.OptCNN.search`, its
  exact branch and bound on the final graph) under OptCNN's Eq. 1 with the roofline of the
  group (:class:`harness.core.costs.AnalyticalCostModel`: t_C at the datasheet peak, t_X and t_S
  on the links' alpha-beta, t_R the all-reduce of a reduction split's partial sums), in PaSE's
  iteration domains with degrees dividing ``t``;
* ``optcnn_table1``: the same in OptCNN's own space (Table 1: a layer splits only dims of its
  output), where a row-parallel split (a split of the GEMM's reduction dim) does not exist, so
  Megatron's split is not in it.

Each answer is reported for the middle block of :func:`~algorithms.block_graph.block_layer_graph`
(three chained blocks: the steady state of a stack of blocks) layer by layer: the degrees chosen, what they split
(column: the GEMM's output channels; row: its reduction dims; or the batch, the sequence, the
heads), Megatron's degrees and whether they agree, plus what the block costs under the optimum
and under Megatron's split in the solver's cost model (its layers and the edges into them, the
edges from the previous block included), each split into compute and communication (PaSE: its
FLOPs at ``r = 0`` and the rest; OptCNN: t_C, and t_S + t_R + t_X).  The norms and
residuals, replicated in Megatron-LM (which a layer graph cannot express) are matched against
either "unsplit" or Megatron's sequence parallelism (a split of the sequence).

:func:`block_split_cost` is what a stack search calls: it tells whether Megatron's split is the
optimum of these cost models for the block.  The stack costing (``harness/core/llm/block_work.py``)
models Megatron's split only (with or without SP); where a solver's optimum is another split it
cannot take that answer, and says so (``expressible: false`` with the reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algorithms.block_graph import ATTENTION_PAIR, DIM_MEANING, MLP_PAIR, BlockGraph, block_layer_graph, megatron_degrees
from algorithms.layer_configs import SpaceOptions
from algorithms.layer_tables import LayerCostTables, build_tables, config_index
from algorithms.optcnn import OptCNN
from algorithms.pase import vertex_elimination
from harness.core.checks import one_of, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import AnalyticalCostModel
from harness.core.llm.plan import PlanError, tp_fits
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import activation_dtype
from harness.core.pase_costs import PaseCostModel

#: the solvers: (algorithm, cost model, configuration space)
SOLVERS: dict[str, tuple[str, str, str]] = {
    "pase": ("PaSE's DP (vertex elimination)", "PaSE's FLOPs + r x words", "PaSE's iteration domains, product <= t"),
    "optcnn": ("OptCNN's elimination", "OptCNN's Eq. 1 (roofline t_C; alpha-beta t_X, t_S, t_R)",
               "PaSE's iteration domains, degrees dividing t"),
    "optcnn_table1": ("OptCNN's elimination", "OptCNN's Eq. 1 (roofline t_C; alpha-beta t_X, t_S, t_R)",
                      "OptCNN's Table 1 (output dims only: no row split)"),
}
#: PaSE's bandwidth (GB/s) when only its compute is wanted: r of a few 1e-6 FLOPs per word, words then cost nothing
_NO_COMM_GBPS = 1e12


@dataclass(frozen=True)
class LayerChoice:
    """One layer of the reported block: the degrees a solver chose, what they split, Megatron's
    degrees and whether they agree (for a norm or residual: unsplit or split along the sequence),
    and what the layer costs with the edges into it, under each."""

    layer: str
    role: str
    chosen: dict[str, int]
    label: str
    megatron: dict[str, int]
    megatron_label: str
    matches: bool
    #: the layer's cost and its in-edges' under the choice, and under Megatron's (the solver's seconds)
    cost_s: float = 0.0
    megatron_cost_s: float | None = None


@dataclass(frozen=True)
class BlockSolution:
    """A solver's split of the block over a TP group (see the module docstring).  Costs in
    seconds of the solver's cost model (PaSE's: its FLOPs over the peak), of the middle block
    (``objective_s``) under the optimum of the whole graph (``graph_objective_s``, never above
    Megatron's ``megatron_graph_s``; the middle block alone may be).  Megatron's split is taken
    in its cheaper variant in the solver's model, without (``megatron_plain_s``) or with
    sequence parallelism (``megatron_sp_s``; ``megatron_sp`` says which is ``megatron_s``);
    None where Megatron's split is not in the space.
    ``rediscovers_megatron``: every GEMM and attention layer of the middle block splits as Megatron's
    and nothing moves inside its attention and MLP pairs (the norms and residuals, which
    Megatron replicates, are reported but not judged)."""

    solver: str
    tp: int
    objective_s: float
    graph_objective_s: float
    compute_s: float
    comm_s: float
    megatron_s: float | None
    megatron_graph_s: float | None
    megatron_compute_s: float | None
    megatron_comm_s: float | None
    megatron_sp: bool
    megatron_plain_s: float | None
    megatron_sp_s: float | None
    layers: tuple[LayerChoice, ...]
    rediscovers_megatron: bool
    pairs_communication_free: bool
    search_s: float
    complete: bool
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def gain(self) -> float | None:
        """How much cheaper the optimum is than Megatron's split in the solver's model (0: as cheap)."""
        if not self.megatron_s:
            return None
        return 1.0 - self.objective_s / self.megatron_s

    def differing(self) -> list[LayerChoice]:
        """The layers whose split is not Megatron's."""
        return [c for c in self.layers if not c.matches]

    def why(self) -> str:
        """One sentence: whether the optimum is Megatron's, else by how much and which terms differ."""
        name = SOLVERS[self.solver][0]
        if self.megatron_s is None:
            return (f"{name} in {SOLVERS[self.solver][2]}: Megatron's row split is outside the space; its optimum "
                    f"({_ms(self.objective_s)}) splits " + ", ".join(f"{c.layer} {c.label}" for c in self.layers if c.role in ("column", "row")))
        meg = "Megatron's split with SP" if self.megatron_sp else "Megatron's split"
        if self.rediscovers_megatron:
            return f"{name} returns Megatron's column/row split ({_ms(self.objective_s)} in its model; {meg} {_ms(self.megatron_s)})"
        assert self.megatron_compute_s is not None and self.megatron_comm_s is not None
        diff = "; ".join(f"{c.layer}: {c.label} (Megatron: {c.megatron_label})" for c in self.differing() if c.role not in ("norm", "residual"))
        if not self.pairs_communication_free:
            diff += "; data moves inside a column/row pair"
        return (f"{name} differs, {100 * (self.gain or 0.0):.1f}% below {meg} in its model: communication "
                f"{_ms(self.comm_s)} against {_ms(self.megatron_comm_s)}, compute {_ms(self.compute_s)} against "
                f"{_ms(self.megatron_compute_s)}; {diff}")


def _ms(x: float) -> str:
    return f"{1e3 * x:.3g} ms"


def _label_of(degrees: dict[str, int]) -> str:
    parts = [f"{DIM_MEANING.get(d, d)} {x}" for d, x in degrees.items() if x > 1]
    return " x ".join(parts) if parts else "unsplit"


def split_label(bg: BlockGraph, v: int, degrees: dict[str, int]) -> str:
    """What a configuration of node v splits, in words: for a GEMM, ``column`` (its output
    channels), ``row`` (its reduction dims) or ``data`` (its rows: batch or sequence) with the
    dims; else the dims (``KV heads 8``, ``sequence 8``, ``unsplit``)."""
    split = {d: x for d, x in degrees.items() if x > 1}
    if not split:
        return "unsplit"
    gemm = bg.graph.attrs[v].get("gemm")
    if not gemm or bg.role[v] not in ("column", "row"):
        return _label_of(split)
    kinds = []
    for kind, group in (("column", gemm.get("n", ())), ("row", gemm.get("k", ())), ("data", (*gemm.get("m", ()), *gemm.get("batch", ())))):
        dims = {d: x for d, x in split.items() if d in group}
        if dims:
            kinds.append(f"{kind} ({_label_of(dims)})")
    return " + ".join(kinds)


def tp_group(cluster: Cluster, tp: int) -> Cluster:
    """The first ``tp`` GPUs of ``cluster`` (a node's, on the LLM clusters), with their links."""
    return cluster.subset(positive_int(tp, "tp"))


def solver_tables(bg: BlockGraph, group: Cluster, solver: str, precision: str) -> tuple[LayerCostTables, LayerCostTables | None]:
    """The cost tables a solver searches on the group, and for ``pase`` the same tables at
    ``r = 0`` (its compute alone)."""
    if solver == "pase":
        peak = group.devices[0].spec.peak(activation_dtype(precision)) / 1e12
        bw = group.ring_bandwidth(list(range(group.num_devices))) / 1e9 if group.num_devices > 1 else _NO_COMM_GBPS
        opts = SpaceOptions("pase", "at_most", 1, "linear")
        full = build_tables(bg.graph, group, PaseCostModel(group, peak_tflops=peak, bw_GBps=bw, cutoff=1, parallel_edges="all"), opts)
        bare = build_tables(bg.graph, group, PaseCostModel(group, peak_tflops=peak, bw_GBps=_NO_COMM_GBPS, cutoff=1,
                                                           parallel_edges="all"), opts)
        return full, bare
    space = "pase" if solver == "optcnn" else "optcnn"
    return build_tables(bg.graph, group, AnalyticalCostModel(group), SpaceOptions(space, "divides", 1, "linear")), None


def block_cost(tables: LayerCostTables, idx: np.ndarray, nodes: list[int]) -> float:
    """What ``nodes`` cost under ``idx``: their layers and the edges into them (:func:`layer_cost`)."""
    return sum(layer_cost(tables, idx, v) for v in nodes)


def split_parts(tables: LayerCostTables, bare: LayerCostTables | None, idx: np.ndarray, nodes: list[int]) -> tuple[float, float]:
    """(compute, communication) of ``nodes`` under the strategy ``idx``: PaSE's cost at r = 0 and
    the rest; OptCNN's t_C and the rest (t_S, t_R, t_X)."""
    total = block_cost(tables, idx, nodes)
    if bare is not None:
        comp = block_cost(bare, idx, nodes)
    else:
        comp = sum(float(tables.parts["t_C"][v][int(idx[v])]) for v in nodes)
    return comp, total - comp


def search(tables: LayerCostTables, solver: str, budget_s: float | None) -> tuple[np.ndarray, bool, dict[str, Any]]:
    """The solver's exact search on the tables: (config index per node, complete, statistics)."""
    if solver == "pase":
        idx, _, stats = vertex_elimination(tables)
        return idx, True, stats
    idx, stats = OptCNN(name=solver, budget_s=budget_s).search(tables)
    complete = bool(stats.pop("complete"))
    return idx, complete, stats


def layer_cost(tables: LayerCostTables, idx: np.ndarray, v: int) -> float:
    """Node v's cost plus its in-edges' under the strategy ``idx`` (where a split pays its communication)."""
    lg = tables.lgraph
    total = float(tables.node_cost[v][int(idx[v])])
    for e in np.flatnonzero(lg.dst == v).tolist():
        total += float(tables.edge_cost[e][int(idx[int(lg.src[e])]), int(idx[v])])
    return total


def _pair_free(bg: BlockGraph, tables: LayerCostTables, idx: np.ndarray, nodes: list[int]) -> bool:
    """No edge inside the attention or MLP pair of ``nodes`` (one block) moves data under ``idx``."""
    lg = bg.graph
    inside = {v for v in nodes if bg.layer[v] in ATTENTION_PAIR} , {v for v in nodes if bg.layer[v] in MLP_PAIR}
    for e in range(lg.num_edges):
        u, w = int(lg.src[e]), int(lg.dst[e])
        if any(u in s and w in s for s in inside) and float(tables.edge_cost[e][idx[u], idx[w]]) > 0:
            return False
    return True


def solve_block(spec: TransformerSpec, tp: int, micro_batch: int, cluster: Cluster, solver: str = "pase",
                precision: str = "amp_bf16", blocks: int = 3, seq_len: int | None = None, budget_s: float | None = 60.0) -> BlockSolution:
    """Split ``blocks`` blocks of ``spec`` (micro-batch ``micro_batch``) over the first ``tp`` GPUs
    of ``cluster`` with ``solver`` (:data:`SOLVERS`) and compare with Megatron (module docstring)."""
    solver = one_of(solver, "solver", tuple(SOLVERS))
    tp = positive_int(tp, "tp")
    if not tp_fits(spec, tp):
        raise PlanError(f"tp={tp} does not divide the heads ({spec.heads}), KV heads ({spec.kv_heads}) and FFN ({spec.ffn_hidden}) "
                        f"of {spec.name}: Megatron's split needs it to")
    bg = block_layer_graph(spec, micro_batch, precision, blocks, seq_len)
    group = tp_group(cluster, tp)
    tables, bare = solver_tables(bg, group, solver, precision)
    t0 = time.perf_counter()
    idx, complete, stats = search(tables, solver, budget_s)
    search_s = time.perf_counter() - t0
    nodes = bg.nodes_of(bg.middle)
    comp, comm = split_parts(tables, bare, idx, nodes)
    free = _pair_free(bg, tables, idx, nodes)
    meg = {sp: [config_index(tables, v, d) for v, d in enumerate(megatron_degrees(bg, tp, sp))] for sp in (False, True)}
    meg_idx = {sp: np.asarray(ix, dtype=np.int64) if all(i is not None for i in ix) else None for sp, ix in meg.items()}
    meg_s = {sp: block_cost(tables, ix, nodes) if ix is not None else None for sp, ix in meg_idx.items()}
    use_sp = meg_s[True] is not None and (meg_s[False] is None or meg_s[True] < meg_s[False])
    ref_idx = meg_idx[use_sp]
    m_comp, m_comm = split_parts(tables, bare, ref_idx, nodes) if ref_idx is not None else (None, None)
    plain_deg, sp_deg = megatron_degrees(bg, tp, False), megatron_degrees(bg, tp, True)
    layers = []
    for v in nodes:
        chosen = {d: int(x) for d, x in zip(tables.dims[v], tables.degrees[v][int(idx[v])]) if x > 1}
        if bg.role[v] in ("norm", "residual"):
            ok = chosen in (plain_deg[v], sp_deg[v])
            ref = sp_deg[v] if chosen == sp_deg[v] else plain_deg[v]
        else:
            ok, ref = chosen == plain_deg[v], plain_deg[v]
        layers.append(LayerChoice(bg.layer[v], bg.role[v], chosen, split_label(bg, v, chosen), ref, split_label(bg, v, ref), ok,
                                  layer_cost(tables, idx, v),
                                  layer_cost(tables, ref_idx, v) if ref_idx is not None else None))
    return BlockSolution(
        solver=solver, tp=tp, objective_s=block_cost(tables, idx, nodes), graph_objective_s=tables.objective(idx),
        compute_s=comp, comm_s=comm,
        megatron_s=meg_s[use_sp], megatron_graph_s=tables.objective(ref_idx) if ref_idx is not None else None, megatron_compute_s=m_comp, megatron_comm_s=m_comm, megatron_sp=use_sp,
        megatron_plain_s=meg_s[False], megatron_sp_s=meg_s[True], layers=tuple(layers),
        rediscovers_megatron=free and all(c.matches for c in layers if c.role not in ("norm", "residual")),
        pairs_communication_free=free,
        search_s=search_s, complete=complete, stats={**stats, "tables_s": tables.build_seconds, "configs_total": int(tables.num_configs.sum()),
                                                     "graph_nodes": bg.graph.num_nodes})


@dataclass(frozen=True)
class BlockSplitCheck:
    """:func:`block_split_cost`'s answer: each solver's solution and what the stack costing can take."""

    tp: int
    solutions: dict[str, BlockSolution]

    @property
    def megatron_optimal(self) -> bool:
        """Every solver whose space holds Megatron's split returns it."""
        return all(s.rediscovers_megatron for s in self.solutions.values() if s.megatron_s is not None)

    @property
    def expressible(self) -> bool:
        """The stack costing can take the solvers' answers: they are Megatron's split (the only
        intra-block split ``harness/core/llm/block_work.py`` costs)."""
        return self.megatron_optimal

    def reason(self) -> str:
        """Why the stack search keeps Megatron's split (or what it leaves on the table)."""
        if self.megatron_optimal:
            return f"Megatron's column/row split is the optimum of every solver's cost model at tp={self.tp}"
        return ("the stack costing models Megatron's split only, so it keeps it; the solvers' optima differ: "
                + " | ".join(s.why() for s in self.solutions.values() if s.megatron_s is not None and not s.rediscovers_megatron))

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (for a plan's info)."""
        return {"tp": self.tp, "megatron_optimal": self.megatron_optimal, "expressible": self.expressible, "reason": self.reason(),
                "solvers": {k: {"objective_s": s.objective_s, "megatron_s": s.megatron_s, "gain": s.gain,
                                "rediscovers_megatron": s.rediscovers_megatron, "complete": s.complete,
                                "splits": {c.layer: c.label for c in s.layers}} for k, s in self.solutions.items()}}


_CACHE: dict[tuple, BlockSplitCheck] = {}


def block_split_cost(spec: TransformerSpec, tp: int, micro_batch: int, cluster: Cluster, precision: str = "amp_bf16",
                     solvers: tuple[str, ...] = ("pase", "optcnn"), budget_s: float | None = 60.0,
                     seq_len: int | None = None) -> BlockSplitCheck:
    """The intra-stage solver a stack search calls: PaSE's DP and OptCNN's elimination on the
    block at ``tp`` (:func:`solve_block`; ``seq_len``: the tokens a context-parallel rank holds,
    None: the spec's), memoised per shape, degree, micro-batch, sequence, precision and the
    group's device and bandwidth; whether Megatron's split is their optimum and whether the
    stack costing can take their answer (:class:`BlockSplitCheck`).  A plan's check::

        block_split_cost(graph.spec, plan.tp, plan.micro_batch, cluster, graph.precision,
                         seq_len=graph.seq_len // plan.cp).describe()
    """
    group = tp_group(cluster, tp)
    spec_dev = group.devices[0].spec
    bw = group.ring_bandwidth(list(range(tp))) if tp > 1 else 0.0
    key = (spec, tp, micro_batch, seq_len, precision, solvers, spec_dev.kind, tuple(sorted(spec_dev.peak_flops.items())), bw, budget_s)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = BlockSplitCheck(tp, {s: solve_block(spec, tp, micro_batch, cluster, s, precision, seq_len=seq_len,
                                                                budget_s=budget_s) for s in solvers})
    return hit
