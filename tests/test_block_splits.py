"""One transformer block as a layer graph, split over a TP group by PaSE's DP and OptCNN's
elimination, against Megatron's column/row split (algorithms/block_graph.py, block_splits.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.block_graph import ATTENTION_PAIR, MLP_PAIR, block_layer_graph, megatron_degrees
from algorithms.block_splits import (
    SOLVERS, block_cost, block_split_cost, layer_cost, search, solve_block, solver_tables, split_label, split_parts, tp_group,
)
from algorithms.layer_tables import config_index
from algorithms.optcnn import branch_and_bound
from algorithms.pase import vertex_elimination
from harness.core.errors import OptionError
from harness.core.llm.flops import core_flops, mlp_flops, projection_flops
from harness.core.llm.plan import PlanError
from tests.helpers import make_cluster, preset_cluster, refused
from tests.stack_helpers import toy_spec


def tiny(**kw: object):
    """A block small enough for an exact depth-first search over every layer."""
    shape = dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, seq_len=8, vocab=100)
    shape.update(kw)
    return toy_spec(**shape)


def megatron_index(bg, tables, tp: int, sp: bool) -> np.ndarray:
    idx = [config_index(tables, v, d) for v, d in enumerate(megatron_degrees(bg, tp, sp))]
    assert all(i is not None for i in idx)
    return np.asarray(idx, dtype=np.int64)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("kv_heads", [16, 4])
def test_block_graph_has_the_blocks_flops_and_weights(gated: bool, kv_heads: int) -> None:
    spec = toy_spec(gated_mlp=gated, kv_heads=kv_heads)
    b, blocks = 3, 2
    bg = block_layer_graph(spec, b, "amp_bf16", blocks=blocks)
    lg = bg.graph
    gemm = [v for v in range(lg.num_nodes) if lg.kinds[v] == "matmul"]
    per_token = projection_flops(spec) + core_flops(spec, spec.seq_len) + mlp_flops(spec, False)
    assert float(lg.flops_fwd[gemm].sum()) == pytest.approx(blocks * b * spec.seq_len * per_token, rel=1e-12)
    weights = spec.attention_params() + spec.mlp_params(spec.ffn_hidden)  # no biases in the toy
    assert int(lg.param_bytes[gemm].sum()) == blocks * 2 * weights
    assert bg.nodes_of(-1) == [v for v in range(lg.num_nodes) if bg.block[v] == blocks - 1]
    assert lg.meta["dtype"] == "bfloat16"


def test_moe_block_is_its_attention_half() -> None:
    spec = toy_spec(experts=4, top_k=2)
    bg = block_layer_graph(spec, 1, "fp32", blocks=1)
    assert set(bg.layer) == {"x", *ATTENTION_PAIR, "attn_norm", "attn_residual"}
    assert bg.moe


def test_megatron_split_moves_nothing_inside_its_pairs() -> None:
    """Shoeybi et al.'s split: column then row, no communication between them, in both cost models."""
    spec, tp = tiny(), 2
    bg = block_layer_graph(spec, 2, "fp32")
    group = tp_group(make_cluster(4), tp)
    lg = bg.graph
    for solver in ("pase", "optcnn"):
        tables, _ = solver_tables(bg, group, solver, "fp32")
        idx = megatron_index(bg, tables, tp, sp=False)
        for pair in (ATTENTION_PAIR, MLP_PAIR):
            inside = [e for e in range(lg.num_edges) if bg.layer[int(lg.src[e])] in pair and bg.layer[int(lg.dst[e])] in pair
                      and bg.block[int(lg.src[e])] == bg.block[int(lg.dst[e])]]
            assert inside
            assert all(float(tables.edge_cost[e][idx[lg.src[e]], idx[lg.dst[e]]]) == 0.0 for e in inside)


@pytest.mark.parametrize("tp", [2, 4])
def test_pase_prices_megatron_at_four_allreduces_per_block(tp: int) -> None:
    """In PaSE's model Megatron's split communicates the four all-reduces of b s h words per block
    (QKV's and MLP-up's input gradients, the two row-parallel outputs): 2 (t-1)/t b s h r each."""
    spec, b, blocks = tiny(kv_heads=4), 2, 2
    bg = block_layer_graph(spec, b, "fp32", blocks=blocks)
    group = tp_group(make_cluster(4), tp)
    tables, bare = solver_tables(bg, group, "pase", "fp32")
    idx = megatron_index(bg, tables, tp, sp=False)
    _, comm = split_parts(tables, bare, idx, list(range(bg.graph.num_nodes)))
    peak = group.devices[0].spec.peak("float32")
    r = peak / (group.ring_bandwidth(list(range(tp))) / 8.0)
    words = b * spec.seq_len * spec.hidden
    assert comm == pytest.approx(blocks * 4 * 2 * (tp - 1) / tp * words * r / peak, rel=1e-6)


@pytest.mark.parametrize("solver", ["pase", "optcnn", "optcnn_table1"])
def test_solvers_are_exact_on_a_small_block(solver: str) -> None:
    """PaSE's DP and OptCNN's elimination return the optimum of an exhaustive depth-first search
    (branch and bound, exact) on the same tables, and never more than Megatron's split."""
    spec, tp = tiny(), 2
    bg = block_layer_graph(spec, 2, "fp32", blocks=1)
    tables, _ = solver_tables(bg, tp_group(make_cluster(4), tp), solver, "fp32")
    idx, complete, _ = search(tables, solver, None)
    assert complete
    n = tables.num_nodes
    _, best, done, _, _ = branch_and_bound(list(range(n)), dict(enumerate(tables.node_cost)), tables.merged_edges(), None)
    assert done
    assert tables.objective(idx) == pytest.approx(best, rel=1e-9)
    other, _, _ = vertex_elimination(tables)  # the other algorithm on the same tables
    assert tables.objective(other) == pytest.approx(best, rel=1e-9)
    if solver != "optcnn_table1":
        assert tables.objective(idx) <= tables.objective(megatron_index(bg, tables, tp, sp=False)) * (1 + 1e-12)


@settings(max_examples=6, deadline=None)
@given(heads=st.sampled_from([2, 4]), group=st.sampled_from([1, 2]), ffn=st.sampled_from([16, 48]), seq=st.sampled_from([4, 8]),
       batch=st.sampled_from([1, 2]), tp=st.sampled_from([2, 4]), gated=st.booleans())
def test_pase_and_optcnn_agree_with_exhaustive_search_on_random_blocks(heads: int, group: int, ffn: int, seq: int, batch: int,
                                                                        tp: int, gated: bool) -> None:
    """Both eliminations are exact: on random small blocks each returns the optimum of an exact
    depth-first search over every layer, on either cost model's tables."""
    spec = tiny(hidden=8 * heads, heads=heads, kv_heads=heads // group, ffn_hidden=ffn, seq_len=seq, gated_mlp=gated)
    bg = block_layer_graph(spec, batch, "fp32", blocks=1)
    for solver in ("pase", "optcnn"):
        tables, _ = solver_tables(bg, tp_group(make_cluster(4), tp), solver, "fp32")
        n = tables.num_nodes
        _, best, done, _, _ = branch_and_bound(list(range(n)), dict(enumerate(tables.node_cost)), tables.merged_edges(), None)
        assert done
        pase_idx, _, _ = vertex_elimination(tables)
        optcnn_idx, _, _ = search(tables, "optcnn", None)
        assert tables.objective(pase_idx) == pytest.approx(best, rel=1e-9)
        assert tables.objective(optcnn_idx) == pytest.approx(best, rel=1e-9)


def test_table1_space_has_no_row_split() -> None:
    bg = block_layer_graph(tiny(), 2, "fp32", blocks=1)
    tables, _ = solver_tables(bg, tp_group(make_cluster(4), 2), "optcnn_table1", "fp32")
    out = bg.layer.index("out_proj")
    assert config_index(tables, out, {"g": 2}) is None
    sol = solve_block(tiny(), 2, 2, make_cluster(4), "optcnn_table1", "fp32")
    assert sol.megatron_s is None and not sol.rediscovers_megatron and "outside the space" in sol.why()


def test_one_gpu_is_megatron_trivially() -> None:
    sol = solve_block(tiny(), 1, 2, make_cluster(4), "pase", "fp32")
    assert sol.rediscovers_megatron and sol.pairs_communication_free
    assert all(c.label == "unsplit" for c in sol.layers)
    assert sol.comm_s == 0.0 and sol.objective_s == pytest.approx(sol.megatron_s)


def test_solution_reports_the_last_block_layer_by_layer() -> None:
    spec, tp = tiny(), 2
    cluster = make_cluster(4)
    for solver in ("pase", "optcnn"):
        sol = solve_block(spec, tp, 2, cluster, solver, "fp32")
        assert sol.stats["graph_nodes"] == 1 + 3 * 15  # three blocks of 15 layers
        assert [c.layer for c in sol.layers][:2] == ["attn_norm", "qkv_proj"] and sol.layers[-1].layer == "mlp_residual"
        assert sol.megatron_graph_s is not None and sol.graph_objective_s <= sol.megatron_graph_s * (1 + 1e-12)
        assert sol.compute_s + sol.comm_s == pytest.approx(sol.objective_s)
        assert sol.megatron_compute_s + sol.megatron_comm_s == pytest.approx(sol.megatron_s)
        assert sol.megatron_s == min(x for x in (sol.megatron_plain_s, sol.megatron_sp_s) if x is not None)
        assert sol.gain == pytest.approx(1 - sol.objective_s / sol.megatron_s)
        assert isinstance(sol.why(), str) and sol.why()
        verdict = sol.pairs_communication_free and all(c.matches for c in sol.layers if c.role not in ("norm", "residual"))
        assert sol.rediscovers_megatron == verdict
        assert all(c.megatron_cost_s is not None and c.cost_s >= 0 for c in sol.layers)


def test_layer_costs_add_up_to_the_objective() -> None:
    bg = block_layer_graph(tiny(), 2, "fp32")
    tables, _ = solver_tables(bg, tp_group(make_cluster(4), 2), "optcnn", "fp32")
    idx, _, _ = search(tables, "optcnn", None)
    assert sum(layer_cost(tables, idx, v) for v in range(tables.num_nodes)) == pytest.approx(tables.objective(idx))
    blocks = [bg.nodes_of(b) for b in range(bg.blocks)]
    assert bg.middle == 1 and sum(block_cost(tables, idx, n) for n in blocks) == pytest.approx(tables.objective(idx))


def test_split_labels_name_column_and_row() -> None:
    bg = block_layer_graph(tiny(), 2, "fp32", blocks=1)
    qkv, out = bg.layer.index("qkv_proj"), bg.layer.index("out_proj")
    assert split_label(bg, qkv, {"g": 2}) == "column (KV heads 2)"
    assert split_label(bg, out, {"g": 2}) == "row (KV heads 2)"
    assert split_label(bg, qkv, {"g": 2, "e": 2}) == "column (KV heads 2) + row (hidden 2)"
    assert split_label(bg, qkv, {"l": 2}) == "data (sequence 2)"
    assert split_label(bg, out, {}) == "unsplit"


def test_block_split_cost_is_memoised_and_jsonable() -> None:
    cluster = preset_cluster("cluster=superpod_a100", "cluster.nodes=1")
    spec = toy_spec()
    a = block_split_cost(spec, 4, 1, cluster)
    assert block_split_cost(spec, 4, 1, cluster) is a
    half = block_split_cost(spec, 4, 1, cluster, seq_len=spec.seq_len // 2)  # a context-parallel rank's tokens
    assert half is not a and half.solutions["pase"].compute_s < a.solutions["pase"].compute_s
    d = json.loads(json.dumps(a.describe()))
    assert set(d["solvers"]) == {"pase", "optcnn"} and d["tp"] == 4
    assert a.expressible == a.megatron_optimal
    assert a.reason()


def test_refusals_are_one_line() -> None:
    cluster = make_cluster(4)
    refused(lambda: solve_block(tiny(), 3, 1, cluster), "tp=3", kind=PlanError)
    refused(lambda: solve_block(tiny(), 2, 1, cluster, "alpa"), "solver", kind=OptionError)
    assert set(SOLVERS) == {"pase", "optcnn", "optcnn_table1"}
