"""The kernel table of an operator graph (``harness/core/kernels.py``) and the rewrites that carry it.

Pins: the table reproduces torch's FLOP counter node by node on zoo graphs (and where it
deliberately does not: the weight gradient of a grouped convolution); which nodes have rows;
the batch column of each row (``bdim``) and ``with_fraction``; the table operations (``take``,
``remap``, ``split_rows``, ``concat``, ``to_dict`` / ``from_dict``, ``ptr``, ``node_math``);
the extra passes of multi-pass memory kernels (``EXTRA_READS``); recurrent-cell GEMMs
(``is_rnn_layer``); and that saving, renumbering (``from_unordered``), layer coarsening,
Celeritas's coarsening and FD-DPS's operator split keep every row on its node and every FLOP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from algorithms.celeritas import Celeritas
from algorithms.opsplit import split_dim_of, split_graph
from harness.app.compose import compose
from harness.core.capture import TensorSpec, capture
from harness.core.graph_rewrites import coarsen_runs
from harness.core.graph import BATCHED, FORWARD, PARTIAL, GraphError, OpGraph
from harness.core.kernels import (
    CONV_BWD_DATA, CONV_BWD_FILTER, CONV_FWD, EXTRA_READS, GEMM, MEM, NCOLS, KernelError, KernelTable, is_rnn_layer,
)
from harness.core.precision import BF16, FP16, FP32, TF32
from harness.app.run import build

ZOO: dict[str, list[str]] = {
    "lenet5": ["model=lenet5", "model.batch_size=8"],
    "alexnet": ["model=alexnet", "model.batch_size=8"],
    "resnet50": ["model=resnet50", "model.batch_size=4"],
    "nmt": ["model=nmt", "model.batch_size=4", "model.module.hidden_size=32", "model.module.embed_dim=32",
            "model.vocab=64", "model.src_len=3", "model.tgt_len=3", "model.module.num_layers=2"],
    "transformer": ["model=transformer", "model.batch_size=2", "model.module.d_model=32", "model.module.num_heads=2",
                    "model.module.d_ff=64", "model.module.num_encoder_layers=1", "model.module.num_decoder_layers=1",
                    "model.vocab=64", "model.src_len=4", "model.tgt_len=4"],
}


def zoo_graph(name: str, precision: str = "fp32") -> OpGraph:
    cfg = compose(ZOO[name] + [f"precision={precision}"])
    source = build(cfg)[0]
    return source.op_graph(**cfg.graph)  # memoised per configuration by TorchModel


@pytest.fixture(scope="module")
def zoo() -> dict[str, OpGraph]:
    out = {name: zoo_graph(name) for name in ZOO}
    out["resnet50/amp_fp16"] = zoo_graph("resnet50", "amp_fp16")
    return out


def row(dims: list[int]) -> list[int]:
    return list(dims) + [0] * (NCOLS - len(dims))


def kernel_flops_per_node(g: OpGraph) -> np.ndarray:
    assert g.kernels is not None
    return np.bincount(g.kernels.node, weights=g.kernels.flops(), minlength=g.num_nodes)


def assert_rows_fit(g: OpGraph) -> None:
    """Every row on an existing node, rows exactly on the non-free nodes, FLOPs node by node."""
    kt = g.kernels
    assert kt is not None
    assert len(kt) and kt.node.min() >= 0 and kt.node.max() < g.num_nodes
    has = np.bincount(kt.node, minlength=g.num_nodes) > 0
    np.testing.assert_array_equal(has, ~g.free)
    np.testing.assert_allclose(kernel_flops_per_node(g), g.flops, rtol=1e-9, atol=0)


# ---------------------------------------------------------------------------- captured tables
@pytest.mark.parametrize("name", [*ZOO, "resnet50/amp_fp16"])
def test_kernel_flops_reproduce_torchs_flop_counter(zoo: dict[str, OpGraph], name: str) -> None:
    g = zoo[name]
    assert g.flops.sum() > 0
    assert_rows_fit(g)
    kt = g.kernels
    # FLOP-heavy nodes launch GEMM / convolution kernels, the rest memory-bound ones
    heavy = np.unique(kt.node[kt.kind != MEM])
    assert (g.flops[heavy] > 0).all()
    light = np.setdiff1d(np.flatnonzero(~g.free), heavy)
    assert (g.flops[light] == 0).all()
    # a memory-bound node's one row moves at least the node's bytes
    mem = (kt.kind == MEM) & ~np.isin(kt.node, heavy)
    assert (np.bincount(kt.node[mem], minlength=g.num_nodes)[light] == 1).all()
    assert (kt.dims[mem, 0] >= g.work_bytes[kt.node[mem]]).all()
    # the extra memory-bound row of a FLOP-heavy node: a convolution's bias gradient
    extra = (kt.kind == MEM) & np.isin(kt.node, heavy)
    assert {g.targets[v] for v in kt.node[extra].tolist()} <= {"aten.convolution_backward.default"}


def test_grouped_convolution_weight_gradient_counts_its_own_channels() -> None:
    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Conv2d(3, 8, 1)
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
            self.fc = nn.Linear(8 * 6 * 6, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.dw(self.pre(x)).flatten(1))

    g = capture(Depthwise, [TensorSpec((3, 6, 6))], TensorSpec((), "int64", 10), batch_size=2)
    kt = g.kernels
    dw = g.layer_names.index("dw")
    fwd = next(v for v, t in enumerate(g.targets) if t == "aten.convolution.default" and g.layer[v] == dw)
    bwd = next(v for v, t in enumerate(g.targets) if t == "aten.convolution_backward.default" and g.layer[v] == dw)
    per_pass = 2 * 2 * 8 * 6 * 6 * (8 // 8) * 3 * 3  # 2 N K P Q (C / groups) R S
    assert kt.dims[kt.node == fwd].tolist() == [row([2, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8])]
    assert g.flops[fwd] == kernel_flops_per_node(g)[fwd] == per_pass
    assert kt.kind[kt.node == bwd].tolist() == [CONV_BWD_DATA, CONV_BWD_FILTER]
    assert kt.flops()[kt.node == bwd].tolist() == [per_pass, per_pass]
    # torch's FLOP formula counts a grouped convolution's weight gradient over all C input
    # channels (groups times the work); capture takes the kernels' count instead
    assert g.flops[bwd] == 2 * per_pass


def test_batch_columns_of_captured_rows(zoo: dict[str, OpGraph]) -> None:
    for name, g in zoo.items():
        kt = g.kernels
        scaled = g.batch_scaled()
        b = int(g.meta["batch_size"])
        # rows of nodes whose work does not shrink with the batch have no batch column, the others one
        assert (kt.bdim[~scaled[kt.node]] == -1).all(), name
        assert (kt.bdim[scaled[kt.node]] >= 0).all(), name
        conv = np.isin(kt.kind, (CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER))
        assert (kt.bdim[conv] == 0).all() and (kt.dims[conv, 0] == b).all(), name
        # a weight gradient x^T dy reduces over the batch: its k column
        wgrad = (kt.kind == GEMM) & (g.batch_role[kt.node] == PARTIAL)
        assert wgrad.any(), name
        assert (kt.bdim[wgrad] == 3).all(), name
        if name in ("lenet5", "alexnet", "resnet50"):  # a linear layer's rows: m is the batch
            assert (kt.dims[wgrad, 3] == b).all()
            fwd = (kt.kind == GEMM) & (g.phase[kt.node] == FORWARD)
            assert (kt.bdim[fwd] == 1).all() and (kt.dims[fwd, 1] == b).all()
        # memory-bound rows of batched nodes: their bytes
        mem_b = (kt.kind == MEM) & (g.batch_role[kt.node] == BATCHED)
        assert (kt.bdim[mem_b] == 0).all()


@pytest.mark.parametrize("name", ["resnet50", "transformer"])
def test_multi_pass_memory_kernels_charge_their_extra_reads(zoo: dict[str, OpGraph], name: str) -> None:
    g = zoo[name]
    kt = g.kernels
    checked = set()
    for v, t in enumerate(g.targets):
        rows = np.flatnonzero(kt.node == v)
        if t in EXTRA_READS:
            assert kt.kind[rows].tolist() == [MEM]
            extra = int(kt.dims[rows[0], 0]) - int(g.work_bytes[v])
            x_bytes = int(np.prod(g.out_shapes[v][0])) * 4  # the input has the shape of the first output
            assert extra == EXTRA_READS[t] * x_bytes > 0, t
            checked.add(t)
        elif t in ("aten.relu.default", "aten.add.Tensor", "aten.threshold_backward.default") and len(rows):
            assert kt.dims[rows, 0].tolist() == [int(g.work_bytes[v])]
    expected = {"resnet50": {"aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"},
                "transformer": {"aten._softmax.default", "aten._softmax_backward_data.default",
                                "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"}}[name]
    assert expected <= checked


def test_recurrent_cell_gemms_are_marked(zoo: dict[str, OpGraph]) -> None:
    from harness.core.zoo.nmt import GNMT

    with torch.device("meta"):
        module = GNMT(vocab_size=64, hidden_size=32, embed_dim=32, num_layers=2)
    types = {(p or "model"): type(m).__name__ for p, m in module.named_modules()}
    assert types["enc_fw"] == "LSTMCell" and types["enc_fw.gates"] == "Linear"
    assert is_rnn_layer("enc_fw.gates", types) and is_rnn_layer("dec_layers.1.gates", types)
    assert is_rnn_layer("enc_fw", types)
    for path in ("projection", "attention.query_layer", "attention", "model", "loss", "src_embed"):
        assert not is_rnn_layer(path, types), path
    # the class-name rule: recurrent modules and cells, not any name with RNN in it
    assert is_rnn_layer("a.b", {"a": "LSTM", "a.b": "Linear"})
    assert is_rnn_layer("a", {"a": "MyGRUCell"}) and is_rnn_layer("a", {"a": "RNN"})
    assert not is_rnn_layer("a", {"a": "RNNLM"}) and not is_rnn_layer("a", {"a": "LSTMish"})
    assert not is_rnn_layer("a.b", {})

    g = zoo["nmt"]
    kt = g.kernels
    gemm = np.flatnonzero(kt.kind == GEMM)
    layer = [g.layer_names[g.layer[kt.node[r]]] for r in gemm]
    in_cell = np.array([name.split(".")[0] in ("enc_fw", "enc_bw", "enc_layers", "dec_layers") for name in layer])
    assert in_cell.sum() >= 20 and (~in_cell).sum() >= 10
    np.testing.assert_array_equal(kt.rnn[gemm], in_cell)
    assert not kt.rnn[[r for r, name in zip(gemm, layer) if name == "projection"]].any()
    assert not kt.rnn[kt.kind != GEMM].any()
    # a CNN has none
    assert not zoo["resnet50"].kernels.rnn.any()


# ---------------------------------------------------------------------------- table operations
def small_table() -> KernelTable:
    """Rows given out of node order: GEMM (m batched), MEM (bytes batched), conv (N batched),
    GEMM without a batch column, weight-gradient GEMM (k batched)."""
    return KernelTable(
        node=[3, 0, 1, 2, 0],
        kind=[GEMM, MEM, CONV_FWD, GEMM, GEMM],
        dims=[row([1, 10, 8, 6]), row([1001]), row([3, 4, 8, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2]),
              row([2, 7, 7, 7]), row([1, 16, 12, 5])],
        bdim=[1, 0, 0, -1, 3], math=[FP32, FP32, TF32, FP16, BF16], rnn=[True, False, False, False, False],
    )


def test_table_is_sorted_by_node_and_has_a_csr_pointer() -> None:
    kt = small_table()
    assert kt.node.tolist() == [0, 0, 1, 2, 3]
    assert kt.kind.tolist() == [MEM, GEMM, CONV_FWD, GEMM, GEMM]  # stable: node 0's rows keep their order
    assert kt.rnn.tolist() == [False, False, False, False, True]
    assert kt.ptr(5).tolist() == [0, 2, 3, 4, 5, 5]
    assert len(KernelTable.empty()) == 0 and KernelTable.empty().ptr(2).tolist() == [0, 0, 0]


def test_flops_and_convolution_geometry() -> None:
    kt = small_table()
    p, q = kt.conv_out()
    assert (p[2], q[2]) == (4, 4)  # (8 + 2 - 2 - 1) // 2 + 1
    expected = [0.0, 2 * 16 * 12 * 5, 2 * 3 * 6 * 4 * 4 * (4 / 2) * 3 * 3, 2 * 2 * 7 * 7 * 7, 2 * 10 * 8 * 6]
    np.testing.assert_allclose(kt.flops(), expected)
    assert kt.node_math(5).tolist() == [BF16, TF32, FP16, FP32, FP32]  # node 4: no rows, the default


def test_with_fraction_scales_only_the_batch_column() -> None:
    kt = small_table()  # rows now: MEM 1001 (b0), wgrad k=5 (b3), conv N=3 (b0), GEMM (-1), GEMM m=10 (b1)
    half = kt.with_fraction(0.5)
    assert half[0, 0] == 500.5  # memory bytes exactly
    assert half[1, 3] == 3.0  # 2.5 rounded up (the largest shard of an uneven split), at least 1
    assert half[2, 0] == 2.0  # 1.5 rounded up
    assert half[4, 1] == 5.0
    np.testing.assert_array_equal(half[3], kt.dims[3])  # no batch column: whole
    changed = half != kt.dims
    assert changed.sum() == 4 and changed[[0, 1, 2, 4], [0, 3, 0, 1]].all()
    tiny = kt.with_fraction(0.01)
    assert tiny[1, 3] == tiny[2, 0] == tiny[4, 1] == 1.0  # never below one
    assert tiny[0, 0] == pytest.approx(10.01)
    per_row = kt.with_fraction(np.array([1.0, 1.0, 1.0, 0.1, 0.2]))
    assert per_row[4, 1] == 2.0 and per_row[3, 3] == 7 and per_row[0, 0] == 1001
    np.testing.assert_array_equal(kt.with_fraction(1.0), kt.dims)
    assert kt.dims.dtype == np.int64 and kt.dims[0, 0] == 1001  # the table itself is untouched


def test_take_remap_split_rows_and_concat() -> None:
    kt = small_table()
    t = kt.take(np.array([4, 2]), np.array([0, 1]))
    assert t.node.tolist() == [0, 1] and t.kind.tolist() == [GEMM, CONV_FWD] and t.rnn.tolist() == [True, False]
    # a contraction: nodes 0, 1 -> 0 and 2, 3 -> 1
    c = kt.remap(np.array([0, 0, 1, 1]))
    assert c.node.tolist() == [0, 0, 0, 1, 1]
    np.testing.assert_allclose(np.bincount(c.node, weights=c.flops()), [kt.flops()[:3].sum(), kt.flops()[3:].sum()])
    # a renumbering keeps the rows with their node
    r = kt.remap(np.array([3, 2, 1, 0]))
    assert r.node.tolist() == [0, 1, 2, 3, 3]
    assert r.dims[0, 1] == 10 and r.kind[1] == GEMM and r.dims[1, 0] == 2 and r.kind[2] == CONV_FWD
    # split: the GEMM's n and the memory row's bytes halved (rounded), the conv whole (col -1)
    s = kt.split_rows(np.array([4, 0, 2]), np.array([7, 7, 8]), np.array([2, 0, -1]), np.array([0.5, 0.5, 0.5]))
    assert s.node.tolist() == [7, 7, 8]
    assert s.dims[0, 2] == 4 and s.dims[1, 0] == 500  # 8 / 2, round(500.5) = 500 (to even)
    np.testing.assert_array_equal(s.dims[2], kt.dims[2])
    assert s.kind.tolist() == [GEMM, MEM, CONV_FWD]
    tiny = kt.split_rows(np.array([3, 0]), np.array([0, 1]), np.array([1, 0]), np.array([0.01, 0.0001]))
    assert tiny.dims[0, 1] == 1 and tiny.dims[1, 0] == 0  # a GEMM dim stays >= 1, memory bytes may vanish
    both = KernelTable.concat([kt.take(np.array([3]), np.array([5])), KernelTable.empty(), kt.take(np.array([0]), np.array([1]))])
    assert both.node.tolist() == [1, 5] and both.kind.tolist() == [MEM, GEMM]
    assert len(KernelTable.concat([KernelTable.empty()])) == 0 and len(KernelTable.concat([])) == 0


def test_dict_round_trip_and_malformed_tables() -> None:
    kt = small_table()
    d = json.loads(json.dumps(kt.to_dict()))
    back = KernelTable.from_dict(d)
    for name in ("node", "kind", "dims", "bdim", "math", "rnn"):
        np.testing.assert_array_equal(getattr(back, name), getattr(kt, name))
    assert back.dims.dtype == np.int64 and back.rnn.dtype == bool
    with pytest.raises(KernelError, match="malformed"):
        KernelTable.from_dict({k: v for k, v in d.items() if k != "bdim"})
    with pytest.raises(KernelError, match="malformed"):
        KernelTable.from_dict({**d, "dims": [[1, 2, 3]]})
    with pytest.raises(KernelError, match="bdim has length 1, expected 2"):
        KernelTable([0, 1], [GEMM, MEM], [row([1, 1, 1, 1]), row([1])], [0], [0, 0], [False, False])
    with pytest.raises(KernelError, match="rnn"):
        KernelTable([0], [GEMM], [row([1, 1, 1, 1])], [0], [0], [False, True])


def plain_graph(n: int, edges: list[tuple[int, int]], kernels: Any = None, names: list[str] | None = None) -> dict[str, Any]:
    return dict(
        names=names or [f"v{i}" for i in range(n)], targets=["aten.mm.default"] * n, phase=[FORWARD] * n,
        layer=[0] * n, layer_names=["l"], flops=[0.0] * n, out_bytes=[4] * n, work_bytes=[8] * n, free=[False] * n,
        batch_role=[BATCHED] * n, coloc=[-1] * n, src=[a for a, _ in edges], dst=[b for _, b in edges],
        nbytes=[4] * len(edges), kernels=kernels, meta={"model": "hand"},
    )


def test_opgraph_rejects_rows_outside_the_graph() -> None:
    bad = KernelTable([3], [MEM], [row([4])], [-1], [FP32], [False])
    with pytest.raises(KernelError, match="node 3, outside 0..2"):
        OpGraph(**plain_graph(3, [(0, 1)], bad))
    neg = KernelTable([-1], [MEM], [row([4])], [-1], [FP32], [False])
    with pytest.raises(KernelError):
        OpGraph(**plain_graph(3, [(0, 1)], neg))
    ok = OpGraph(**plain_graph(3, [(0, 1)], KernelTable([2], [MEM], [row([4])], [-1], [FP32], [False]).to_dict()))
    assert isinstance(ok.kernels, KernelTable) and ok.kernels.node.tolist() == [2]  # a dict is read as a table


def test_from_unordered_moves_kernel_rows_with_their_nodes() -> None:
    # "late" (0) reads "mid" (2), which reads "early" (1): the topological numbering is 1, 2, 0
    kt = KernelTable([0, 1, 2, 2], [GEMM, MEM, CONV_FWD, MEM],
                     [row([1, 10, 20, 30]), row([111]), row([2, 3, 4, 4, 5, 1, 1, 1, 1, 0, 0, 1, 1, 1]),
                      row([222])], [1, 0, 0, -1], [FP32, FP32, TF32, FP16], [True, False, False, False])
    fields = plain_graph(3, [(2, 0), (1, 2)], kt, names=["late", "early", "mid"])
    with pytest.raises(GraphError, match="topological"):
        OpGraph(**fields)
    g = OpGraph.from_unordered(**fields)
    assert g.names == ["early", "mid", "late"] and g.meta["renumbered_from"] == [1, 2, 0]
    k = g.kernels
    by_name = {g.names[v]: [(int(k.kind[r]), int(k.dims[r, 0]), bool(k.rnn[r]), int(k.math[r]))
                            for r in np.flatnonzero(k.node == v)] for v in range(3)}
    assert by_name == {"early": [(MEM, 111, False, FP32)], "mid": [(CONV_FWD, 2, False, TF32), (MEM, 222, False, FP16)],
                       "late": [(GEMM, 1, True, FP32)]}
    # given as a dict (a loaded file) it is remapped the same way
    g2 = OpGraph.from_unordered(**{**fields, "kernels": kt.to_dict()})
    np.testing.assert_array_equal(g2.kernels.node, k.node)
    np.testing.assert_array_equal(g2.kernels.dims, k.dims)


def test_save_load_keeps_the_kernel_table(zoo: dict[str, OpGraph], tmp_path: Path) -> None:
    g = zoo["nmt"]
    path = tmp_path / "nmt.json"
    g.save(path)
    back = OpGraph.load(path)
    for name in ("node", "kind", "dims", "bdim", "math", "rnn"):
        np.testing.assert_array_equal(getattr(back.kernels, name), getattr(g.kernels, name))
    assert_rows_fit(back)
    # a file written before kernel tables existed loads without one
    d = json.loads(path.read_text())
    del d["kernels"]
    path.write_text(json.dumps(d))
    assert OpGraph.load(path).kernels is None


# ---------------------------------------------------------------------------- graph rewrites
@pytest.mark.parametrize("name", ["resnet50", "nmt", "resnet50/amp_fp16"])
def test_layer_coarsening_carries_the_kernels(zoo: dict[str, OpGraph], name: str) -> None:
    g = zoo[name]
    c = coarsen_runs(g)
    assert c.num_nodes < g.num_nodes / 2
    assert len(c.kernels) == len(g.kernels)
    assert_rows_fit(c)
    assert kernel_flops_per_node(c).sum() == pytest.approx(g.flops.sum(), rel=1e-12)
    assert np.array_equal(np.sort(c.kernels.kind), np.sort(g.kernels.kind))


def test_layer_granularity_capture_has_kernels() -> None:
    cfg = compose(ZOO["lenet5"] + ["graph.granularity=layer"])
    g = build(cfg)[0].op_graph(**cfg.graph)
    assert g.meta["granularity"] == "layer" and g.meta["coarsened_from"] > g.num_nodes
    assert_rows_fit(g)


@pytest.mark.parametrize("name", ["lenet5", "alexnet"])
def test_celeritas_coarsening_carries_the_kernels(zoo: dict[str, OpGraph], name: str) -> None:
    g = zoo[name]
    cfg = compose(ZOO[name] + ["cluster=dgx1_v100"])
    _, cluster, costs, _, _ = build(cfg)
    co, _, _ = Celeritas(R=8).coarsen(g, cluster, costs)
    cg = co.graph
    assert 1 < cg.num_nodes < g.num_nodes
    assert len(cg.kernels) == len(g.kernels)
    assert_rows_fit(cg)
    # each cluster holds exactly its members' kernels
    for k in range(0, co.num_clusters, max(1, co.num_clusters // 10)):
        members = co.members(k)
        assert np.isin(g.kernels.node, members).sum() == (cg.kernels.node == k).sum()


def test_fddps_split_carries_the_kernels(zoo: dict[str, OpGraph]) -> None:
    g = zoo["lenet5"]
    decisions: dict[int, str] = {}
    for v, t in enumerate(g.targets):
        if t == "aten.addmm.default":
            d = split_dim_of(g, v, "channel")
        elif t in ("aten.convolution.default", "aten.convolution_backward.default", "aten.mm.default"):
            d = split_dim_of(g, v, "batch")
        else:
            continue
        if d is not None:
            decisions[v] = d
    assert set(decisions.values()) == {"batch", "channel"}
    assert sum(1 for v in decisions if g.targets[v] == "aten.convolution_backward.default") == 2
    res = split_graph(g, decisions)
    s = res.graph
    assert res.info["split_ops"] == len(decisions) and res.info["gather_nodes"] + res.info["aggregate_nodes"] > 0
    assert s.flops.sum() == pytest.approx(g.flops.sum(), rel=1e-12)
    assert_rows_fit(s)
    kt, k0 = s.kernels, g.kernels
    for new, old in enumerate(res.origin.tolist()):
        rows_new = np.flatnonzero(kt.node == new)
        if old < 0:  # gather / aggregate: one memory-bound kernel of its bytes, in FP32
            assert kt.kind[rows_new].tolist() == [MEM] and kt.dims[rows_new[0], 0] == s.work_bytes[new]
            continue
        if old not in decisions or s.free[new]:
            continue
        rows_old = np.flatnonzero(k0.node == old)
        assert kt.kind[rows_new].tolist() == k0.kind[rows_old].tolist()
        if decisions[old] == "batch":  # the batch column halved
            cols = k0.bdim[rows_old]
            assert (cols >= 0).all()
            np.testing.assert_array_equal(kt.dims[rows_new, cols] * 2, k0.dims[rows_old, cols])
        else:  # a GEMM's n halved
            assert k0.kind[rows_old].tolist() == [GEMM]
            assert kt.dims[rows_new[0], 2] * 2 == k0.dims[rows_old[0], 2]


def test_fddps_algorithm_keeps_kernel_flops() -> None:
    from harness.app.run import run

    cfg = compose(ZOO["alexnet"] + ["algo=fddps", "cluster=dgx1_v100", "algo.min_time_ms=0.05", "output.trace=false",
                                    "output.gantt=false"])
    result = run(cfg)
    plan_graph = result.plan.graph
    assert plan_graph.meta["split"]["split_ops"] > 0
    assert_rows_fit(plan_graph)
    assert plan_graph.flops.sum() == pytest.approx(zoo_graph("alexnet").flops.sum(), rel=1e-12)
