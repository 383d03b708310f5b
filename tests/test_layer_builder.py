"""The layer-graph builder (harness.core.layer_builder) and PaSE's cost model on what it builds:
multi-index GEMM / einsum splits, vocabulary splits, the fused pointwise term, softmax-cross-
entropy, contiguous reshapes, PaSE's one-edge-per-pair rule; optimality against brute force;
layer graphs from files and from code through the CLI; hostile inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.layer_configs import SpaceOptions, enumerate_configs
from algorithms.layer_tables import brute_force, build_tables
from algorithms.pase import vertex_elimination
from harness.core.layer_builder import LayerGraphBuilder, Weight
from harness.core.layergraph import LayerGraph, LayerGraphError
from harness.core.pase_costs import PaseCostModel
from harness.core.zoo import pase_graphs
from tests.helpers import make_cluster, run_harness
from tests.layer_cases import tiny_lm

R = 5000.0  # PaSE's FLOPs per word at its defaults


def ar(words: float, procs: float) -> float:
    """PaSE's all-reduce cost in FLOPs."""
    return R * 2.0 * (procs - 1) * words / procs


def gemm(m: float, n: float, k: float, dm: float, dn: float, dk: float, pw: float = 0.0, batches: float = 1.0) -> float:
    """PaSE's ComputeGemmCosts for per-processor sizes, written out by hand."""
    return batches * (3 * m * n * k + 3 * pw * m * n + ar(m * n, dk) + ar(m * k, dn) + ar(n * k, dm))


def cost(lg: LayerGraph, v: int, **degrees: int) -> float:
    """t_V (FLOPs) of node v under costs=pase at the given degrees (others 1)."""
    pc = PaseCostModel(make_cluster(64))
    dims = tuple(degrees)
    return float(pc.vertex_flops(lg, v, dims, np.array([[degrees[d] for d in dims]]))[0])


# ---------------------------------------------------------------------- what the builder writes
def test_an_einsum_groups_its_indices_as_pase_does_and_each_index_is_a_dim():
    b = LayerGraphBuilder("t", 8)
    x = b.stack([b.input("q", (8, 16, 32)), b.input("k", (8, 16, 32)), b.input("v", (8, 16, 32))])
    y = b.einsum("sble,shek->sbhlk", x, Weight((3, 4, 32, 8)))
    lg = b.build()
    v = y.node
    assert lg.attrs[v]["gemm"] == {"batch": ["s"], "m": ["sample", "l"], "n": ["h", "k"], "k": ["e"]}
    assert lg.dims[v] == {"s": 3, "sample": 8, "h": 4, "l": 16, "k": 8, "e": 32}
    m, n, k = lg.gemm_mnk(v)
    assert 2 * m * n * k == lg.flops_fwd[v] and lg.param_bytes[v] == 3 * 4 * 32 * 8 * 4
    # every index may be split, the reduction e too: per-processor GEMM and all-reduces by hand
    want = gemm(8 * 16 / 2, 4 * 8 / 2, 32 / 2, 2, 2, 2, batches=3)
    assert cost(lg, v, sample=2, h=2, e=2) == pytest.approx(want, rel=1e-12)


def test_the_embedding_vocabulary_is_a_dim_pase_may_split():
    b = LayerGraphBuilder("t", 4)
    e = b.embedding(b.input("ids", (4, 8), dtype="int64", axes=("sample", "length")), vocab=1000, units=16)
    lg = b.build()
    assert lg.dims[e.node]["vocab"] == 1000 and "vocab" not in lg.parallel_dims[e.node]
    assert cost(lg, e.node, vocab=4) == pytest.approx(gemm(32, 16, 250, 1, 1, 4), rel=1e-12)
    dims, deg = enumerate_configs(lg, e.node, 8, SpaceOptions("pase", "at_most", 1))
    assert "vocab" in dims and deg[:, dims.index("vocab")].max() == 8


def test_fused_pointwise_ops_add_three_flops_per_output_element():
    b = LayerGraphBuilder("t", 8)
    x = b.input("x", (8, 64))
    plain, fused = b.linear(x, 32), b.linear(x, 32, pw=2)
    lg = b.build()
    assert cost(lg, fused.node) - cost(lg, plain.node) == pytest.approx(3 * 2 * 8 * 32)
    assert cost(lg, fused.node, channel=2) - cost(lg, plain.node, channel=2) == pytest.approx(3 * 2 * 8 * 16)


def test_a_linear_layer_splits_each_leading_axis_of_its_input():
    b = LayerGraphBuilder("t", 4)
    y = b.linear(b.input("x", (4, 6, 10)), 12)
    lg = b.build()
    assert lg.attrs[y.node]["gemm"]["m"] == ["sample", "length"]
    assert cost(lg, y.node, length=3, in_channel=2) == pytest.approx(gemm(4 * 6 / 3, 12, 10 / 2, 3, 1, 2), rel=1e-12)


def test_softmax_cross_entropy_pays_a_label_broadcast_only_when_the_classes_are_split():
    b = LayerGraphBuilder("t", 8)
    loss = b.softmax_cross_entropy(b.input("logits", (8, 16, 100)))
    lg = b.build()
    v = loss.node
    assert lg.kinds[v] == "loss" and lg.attrs[v]["class_dim"] == "a2"
    rows = 8 * 16 / 2
    assert cost(lg, v, sample=2) == pytest.approx(4 * rows * 100 + 2 * rows)
    rows_split = 8 * 16
    assert cost(lg, v, a2=4) == pytest.approx(4 * rows_split * 25 + 2 * rows_split + R * 2 * rows_split)


def test_a_reshape_is_a_ravel_and_an_unravel_that_split_only_contiguously():
    b = LayerGraphBuilder("t", 4)
    y = b.reshape(b.input("x", (4, 2, 3)), (4, 6))
    lg = b.build()
    ravel = lg.index("reshape0.ravel")
    assert y.node == lg.index("reshape0.unravel") and lg.kinds[ravel] == lg.kinds[y.node] == "view"
    dims, deg = enumerate_configs(lg, ravel, 8, SpaceOptions("pase", "at_most", 1))
    got = {tuple(int(d) for d in row) for row in deg}
    # whole splits of the leading dims, then one partial split, then none (2 * 1 * 3 is not contiguous)
    assert got == {(1, 1, 1), (2, 1, 1), (4, 1, 1), (4, 2, 1)}, (dims, got)


def test_of_two_edges_between_one_pair_of_layers_pase_counts_the_last():
    b = LayerGraphBuilder("t", 8)
    x = b.linear(b.input("x", (8, 64)), 64)
    b.elementwise(x, x)
    lg = b.build()
    cl = make_cluster(4)
    last = build_tables(lg, cl, PaseCostModel(cl, cutoff=1))
    every = build_tables(lg, cl, PaseCostModel(cl, cutoff=1, parallel_edges="all"))
    e0, e1 = (int(e) for e in lg.in_edges(2))
    assert not last.edge_cost[e0].any() and last.edge_cost[e1].any()
    assert np.array_equal(every.edge_cost[e0], every.edge_cost[e1])


@pytest.mark.parametrize("call, fragment", [
    (lambda b, x: b.conv2d(b.linear(x, 4), 8, 3), "conv2d takes a rank-4 tensor"),
    (lambda b, x: b.einsum("ab,cd->ad", x, Weight((5, 4))), "index 'b' is in one operand only"),
    (lambda b, x: b.einsum("ab,bc->ac", x, Weight((7, 4))), "index 'b' is 16 and 7"),
    (lambda b, x: b.einsum("ab,bc", x, Weight((16, 4))), "is not of the form"),
    (lambda b, x: b.reshape(x, (3, 5)), "reshape of (8, 16)"),
    (lambda b, x: b.elementwise(x, b.linear(x, 4)), "must match"),
    (lambda b, x: b.concat([x], 1), "at least two"),
    (lambda b, x: b.linear(x, 4, name="x"), "node name 'x' is used twice"),
])
def test_a_builder_mistake_is_one_line_naming_the_call(call, fragment):
    b = LayerGraphBuilder("t", 8)
    x = b.input("x", (8, 16))
    with pytest.raises(LayerGraphError) as info:
        call(b, x)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_built_graph_saves_and_loads_unchanged(tmp_path: Path):
    lg = pase_graphs.transformer(8)
    lg.save(tmp_path / "g.json")
    assert LayerGraph.load(tmp_path / "g.json").to_dict() == lg.to_dict()


# ---------------------------------------------------------------------- optimality
@st.composite
def small_lms(draw: st.DrawFn) -> LayerGraph:
    """ids -> embedding -> einsum with a weight (pw drawn) -> softmax-cross-entropy, small sizes."""
    B, S, V, D, C = (draw(st.sampled_from(s)) for s in ((2, 4), (1, 2, 4), (4, 8, 12), (2, 4, 8), (4, 6, 8)))
    b = LayerGraphBuilder("lm", B)
    x = b.embedding(b.input("ids", (B, S), dtype="int64", axes=("sample", "length")), V, D)
    x = b.einsum("ble,ec->blc", x, Weight((D, C)), pw=draw(st.integers(0, 2)))
    b.softmax_cross_entropy(x)
    return b.build()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lg=small_lms(), p=st.sampled_from([2, 4]))
def test_vertex_elimination_is_optimal_on_multi_index_graphs(lg, p):
    cl = make_cluster(p)
    T = build_tables(lg, cl, PaseCostModel(cl, cutoff=1))
    _, best = brute_force(T)
    idx, value, _ = vertex_elimination(T)
    assert value == pytest.approx(best, rel=1e-12) and T.objective(idx) == pytest.approx(best, rel=1e-12)


# ---------------------------------------------------------------------- from files and from code, end to end
def objective_flops(run_dir: Path) -> float:
    return json.loads((run_dir / "result.json").read_text())["algo_info"]["objective_flops"]


def test_a_layer_graph_file_runs_under_pase_and_optcnn(tmp_path: Path):
    path = tmp_path / "alexnet_layers.json"
    pase_graphs.alexnet(128).save(path)
    out = tmp_path / "pase"
    r = run_harness(f"model.path={path}", "model=from_file", "algo=pase", "costs=pase", "cluster=parametric", "cluster.gpus=8",
                    f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    built = tmp_path / "built"
    r2 = run_harness("model=built", "model.fn=harness.core.zoo.pase_graphs.alexnet", "model.batch_size=128", "algo=pase",
                     "costs=pase", "cluster=parametric", "cluster.gpus=8", f"hydra.run.dir={built}")
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert objective_flops(out) == objective_flops(built)
    r3 = run_harness(f"model.path={path}", "model=from_file", "algo=optcnn", "cluster=parametric", "cluster.gpus=4",
                     f"hydra.run.dir={tmp_path / 'optcnn'}")
    assert r3.returncode == 0, r3.stderr[-2000:]


def test_an_operator_graph_algorithm_on_a_layer_graph_file_is_one_line(tmp_path: Path):
    path = tmp_path / "g.json"
    pase_graphs.rnnlm(4).save(path)
    r = run_harness("model=from_file", f"model.path={path}", "algo=m_topo", "cluster=p100x4", f"hydra.run.dir={tmp_path / 'o'}")
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert "holds a layer graph" in line and "algo=pase" in line


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.pop("kinds"), "missing field 'kinds'"),
    (lambda d: d.update(colour=1), "unknown field 'colour'"),
    (lambda d: d.update(src=d["src"][:-1]), "LayerGraph.dst has length"),
    (lambda d: d.update(format="harness.layergraph/9"), "format is 'harness.layergraph/9'"),
])
def test_a_hostile_layer_graph_file_is_one_line_naming_the_file_and_field(tmp_path: Path, edit, fragment):
    d = pase_graphs.alexnet(4).to_dict()
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    r = run_harness("model=from_file", f"model.path={path}", "algo=pase", "costs=pase", "cluster=p100x4",
                    f"hydra.run.dir={tmp_path / 'o'}")
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert fragment in line and str(path) in line, line


def test_the_documented_example_file_is_what_the_documented_code_builds_and_it_runs(tmp_path: Path):
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_layer_graph.json"
    assert json.loads(example.read_text()) == json.loads(json.dumps(tiny_lm(8).to_dict()))
    r = run_harness("model=from_file", f"model.path={example}", "algo=pase", "costs=pase", "cluster=p100x4",
                    f"hydra.run.dir={tmp_path / 'o'}")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_harness("model=built", "model.fn=tests.layer_cases.tiny_lm", "model.batch_size=8", "algo=optcnn",
                    "cluster=p100x4", f"hydra.run.dir={tmp_path / 'b'}")
    assert r.returncode == 0, r.stderr[-2000:]
