"""Tests of the layer graph (harness.core.layergraph, built by harness.core.layerfx): structure, iteration domains
(OptCNN Table 1, PaSE's GEMM view), FLOPs, axis maps / halos, serialisation, fake-tensor building and errors."""

from __future__ import annotations

import importlib
import json
import math
import resource
import time
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.core.layerfx import InputSpec, build_layer_graph
from harness.core.layergraph import GEMM_KINDS, LayerGraph, LayerGraphError, part

# ---------------------------------------------------------------------- models


class TinyCNN(nn.Module):
    """conv(3->8, 3x3, pad 1) -> BN -> ReLU -> maxpool 2 -> flatten -> linear(512 -> 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class InceptionLike(nn.Module):
    """Three branches (1x1 conv, 3x3 conv, 3x3/1 max-pool) concatenated on channels."""

    def __init__(self) -> None:
        super().__init__()
        self.b1 = nn.Conv2d(4, 6, 1)
        self.b3 = nn.Conv2d(4, 10, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b1(x), self.b3(x), F.max_pool2d(x, 3, stride=1, padding=1)], dim=1)


class TinyLSTM(nn.Module):
    """2-layer LSTM language model written with nn.Linear gates and a Python loop over time."""

    def __init__(self, vocab: int = 50, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, hidden)
        self.ih = nn.ModuleList(nn.Linear(hidden, 4 * hidden) for _ in range(layers))
        self.hh = nn.ModuleList(nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        h = [x.new_zeros(x.shape[0], self.hidden) for _ in self.ih]
        c = [x.new_zeros(x.shape[0], self.hidden) for _ in self.ih]
        outputs = []
        for t in range(x.shape[1]):  # unrolled for the given sequence length
            inp = x[:, t]
            for layer in range(len(self.ih)):
                gates = self.ih[layer](inp) + self.hh[layer](h[layer])
                i, f, g, o = gates.chunk(4, dim=1)
                c[layer] = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
                h[layer] = torch.sigmoid(o) * torch.tanh(c[layer])
                inp = h[layer]
            outputs.append(inp)
        return self.out(torch.stack(outputs, dim=1))


class TinyAttention(nn.Module):
    """Single multi-head self-attention block written with matmul and softmax."""

    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        split = lambda t: t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, d)
        return self.norm(x + self.o(ctx))


def _check_invariants(g: LayerGraph) -> None:
    """Properties every layer graph has, whatever the model."""
    assert len(set(g.names)) == g.num_nodes
    assert np.all(g.src < g.dst)
    for e in range(g.num_edges):
        shape = g.edge_shape(e)
        assert g.nbytes[e] == math.prod(shape) * _itemsize(g, int(g.src[e]), int(g.src_port[e]))
        assert len(g.edge_src_dims(e)) == len(shape) == len(g.edge_dst_dims(e))
    for v in range(g.num_nodes):
        assert set(g.parallel_dims[v]) <= set(g.dims[v])
        assert len(g.in_dims[v]) == len(g.predecessors(v))
        if g.kinds[v] in GEMM_KINDS:
            m, n, k = g.gemm_mnk(v)
            assert 2 * m * n * k == g.flops_fwd[v]
            assert g.flops_bwd[v] == 2 * g.flops_fwd[v]
    assert np.all(g.flops_fwd >= 0) and np.all(g.flops_bwd >= 0)


def _itemsize(g: LayerGraph, v: int, port: int) -> int:
    outs = g.attrs[v].get("outputs")
    dtype = outs[port]["dtype"] if outs else g.attrs[v]["dtype"]
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


# ---------------------------------------------------------------------- tests


def test_tiny_cnn_structure_dims_and_flops() -> None:
    g = build_layer_graph(TinyCNN(), [((4, 3, 16, 16), torch.float32)], name="tiny_cnn")
    _check_invariants(g)
    assert g.names == ["x", "conv1", "bn1", "relu", "pool", "flatten", "fc"]
    assert g.kinds == ["input", "conv2d", "batchnorm", "elementwise", "pool2d", "view", "linear"]
    assert (g.num_nodes, g.num_edges) == (7, 6)
    assert g.src.tolist() == [0, 1, 2, 3, 4, 5] and g.dst.tolist() == [1, 2, 3, 4, 5, 6]
    assert g.src.dtype == np.int32 and g.nbytes.dtype == np.int64 and g.flops_fwd.dtype == np.float64

    conv = g.index("conv1")
    assert g.dims[conv] == {"sample": 4, "channel": 8, "height": 16, "width": 16, "in_channel": 3,
                            "kernel_h": 3, "kernel_w": 3}
    assert g.parallel_dims[conv] == ("sample", "channel", "height", "width")  # OptCNN Table 1, 2D conv
    assert g.out_dims[conv] == ("sample", "channel", "height", "width")
    assert g.in_dims[conv] == [("sample", "in_channel", "height", "width")]
    assert g.attrs[conv]["kernel"] == [3, 3] and g.attrs[conv]["stride"] == [1, 1] and g.attrs[conv]["padding"] == [1, 1]
    assert g.flops_fwd[conv] == 2 * 4 * 8 * 16 * 16 * 3 * 3 * 3
    assert g.flops_bwd[conv] == 2 * g.flops_fwd[conv]
    assert g.out_shape[conv] == (4, 8, 16, 16)
    assert g.out_bytes[conv] == 4 * 8 * 16 * 16 * 4
    assert g.param_bytes[conv] == (8 * 3 * 3 * 3 + 8) * 4
    assert g.gemm_mnk(conv) == (4 * 16 * 16, 8, 3 * 3 * 3)

    fc = g.index("fc")
    assert g.dims[fc] == {"sample": 4, "channel": 10, "in_channel": 512}
    assert g.parallel_dims[fc] == ("sample", "channel")  # OptCNN Table 1, fully-connected
    assert g.gemm_mnk(fc) == (4, 10, 512)
    assert g.flops_fwd[fc] == 2 * 4 * 10 * 512
    assert g.param_bytes[fc] == (512 * 10 + 10) * 4

    assert g.parallel_dims[g.index("bn1")] == ("sample", "channel", "height", "width")
    assert g.parallel_dims[g.index("pool")] == ("sample", "channel", "height", "width")
    assert g.flops_fwd[g.index("flatten")] == 0 and g.flops_fwd[0] == 0
    # the edge carries the producer's output
    assert all(g.nbytes[e] == g.out_bytes[g.src[e]] for e in range(g.num_edges))
    assert g.meta["model"] == "tiny_cnn" and g.meta["batch_size"] == 4 and g.meta["dtype"] == "float32"
    assert g.meta["outputs"] == [fc]
    assert g.unique_param_bytes == sum(p.numel() * 4 for p in TinyCNN().parameters())


def test_conv_and_pool_halos_and_flatten_axis_map() -> None:
    g = build_layer_graph(TinyCNN(), [((4, 3, 16, 16), "float32")])
    conv, pool, flat = g.index("conv1"), g.index("pool"), g.index("flatten")
    # 3x3 conv, pad 1: output rows [8, 16) read input rows [7, 16), rows [0, 8) read [0, 9)
    assert g.in_region(conv, 0, {"height": (8, 16)}) == ((0, 4), (0, 3), (7, 16), (0, 16))
    assert g.in_region(conv, 0, {"height": (0, 8), "sample": (2, 4)}) == ((2, 4), (0, 3), (0, 9), (0, 16))
    # a channel split of a conv needs every input channel (in_channel is not parallel)
    assert g.in_region(conv, 0, {"channel": (0, 4)})[1] == (0, 3)
    # 2x2/2 max-pool: output rows [4, 8) read input rows [8, 16), no halo
    assert g.in_region(pool, 0, {"height": (4, 8)})[2] == (8, 16)
    # flatten (B, 8, 8, 8) -> (B, 512): a split of the flat channel dim reads whole channels
    assert g.in_dims[flat] == [("sample", "channel", "", "")]
    assert g.in_region(flat, 0, {"channel": (0, 256)}) == ((0, 4), (0, 4), (0, 8), (0, 8))
    # linear over the flat input: a channel (output feature) split reads the whole input
    assert g.in_region(g.index("fc"), 0, {"channel": (0, 5)}) == ((0, 4), (0, 512))
    assert g.out_region(conv, g.shard_ranges(conv, {"sample": 2, "channel": 2}, {"sample": 1, "channel": 0})) == (
        (2, 4), (0, 4), (0, 16), (0, 16))
    assert part(10, 4, 3) == (7, 10)


def test_residual_block_add_has_two_ports() -> None:
    g = build_layer_graph(ResidualBlock(), [((2, 8, 8, 8), "float32")])
    _check_invariants(g)
    # the Identity shortcut is an alias, not a node: the add reads the input directly
    assert g.kinds == ["input", "conv2d", "batchnorm", "elementwise", "conv2d", "batchnorm", "elementwise", "elementwise"]
    assert (g.num_nodes, g.num_edges) == (8, 8)
    add = g.index("add")
    assert sorted(g.predecessors(add).tolist()) == [0, g.index("bn2")]
    assert g.in_dims[add] == [("sample", "channel", "height", "width")] * 2
    assert g.parallel_dims[add] == ("sample", "channel", "height", "width")
    assert g.flops_fwd[add] == 2 * 8 * 8 * 8
    assert sorted(g.dst_port[g.in_edges(add)].tolist()) == [0, 1]
    assert g.successors(0).tolist() == [g.index("conv1"), add]


def test_inception_like_concat_offsets() -> None:
    g = build_layer_graph(InceptionLike(), [((2, 4, 8, 8), "float32")])
    _check_invariants(g)
    assert sorted(g.kinds) == sorted(["input", "conv2d", "conv2d", "pool2d", "concat"])
    assert (g.num_nodes, g.num_edges) == (5, 6)
    cat = g.index("cat")
    assert g.out_shape[cat] == (2, 20, 8, 8)
    assert g.kinds[g.index("max_pool2d")] == "pool2d"
    assert g.attrs[g.index("max_pool2d")]["kernel"] == [3, 3]
    assert [g.names[p] for p in g.predecessors(cat)] == ["b1", "b3", "max_pool2d"]
    # channels [6, 16) of the concat come from the 3x3 branch only
    regions = [g.in_region(cat, p, {"channel": (6, 16)}) for p in range(3)]
    assert regions[0][1][0] == regions[0][1][1]  # empty: 1x1 branch not needed
    assert regions[1][1] == (0, 10)
    assert regions[2][1][0] == regions[2][1][1]
    assert g.in_region(cat, 2, {"channel": (14, 20)})[1] == (0, 4)


def test_lstm_unrolled_one_node_per_cell_op_per_step() -> None:
    steps, layers = 3, 2
    g = build_layer_graph(TinyLSTM(layers=layers), [((4, steps), torch.int64)])
    _check_invariants(g)
    # per (step, layer): ih, hh, add, 4 gate pieces, 6 ops for c, 3 ops for h = 16; per step x[:, t];
    # plus input, embedding, stack, output projection
    assert g.num_nodes == 4 + steps * (1 + layers * 16)
    kinds = {k: g.kinds.count(k) for k in set(g.kinds)}
    assert kinds["linear"] == steps * layers * 2 + 1
    assert kinds["embedding"] == 1 and kinds["input"] == 1 and kinds["concat"] == 1
    assert [n for n in g.names if n.startswith("ih.0")] == ["ih.0", "ih.0@1", "ih.0@2"]
    ih = g.index("ih.0@1")
    assert g.dims[ih] == {"sample": 4, "channel": 64, "in_channel": 16}
    assert g.parallel_dims[ih] == ("sample", "channel")
    # the first step's recurrent layer reads the constant zero state: a source node with parameters
    assert len(g.predecessors(g.index("hh.0"))) == 0 and g.param_bytes[g.index("hh.0")] == 64 * 16 * 4
    assert len(g.predecessors(g.index("hh.0@1"))) == 1
    emb = g.index("embed")
    assert g.dims[emb] == {"sample": 4 * steps, "channel": 16, "vocab": 50}  # the vocabulary: PaSE may split it
    assert g.out_dims[emb] == ("sample", "", "channel")
    assert g.meta["inputs"][0]["dtype"] == "int64"
    # x[:, t] reads one time step of the embedding output
    step1 = [v for v in g.successors(emb) if g.kinds[v] == "view"][1]
    assert g.in_region(int(step1), 0) == ((0, 4), (1, 2), (0, 16))
    # the gate pieces of chunk(4) read their quarter of the gates
    pieces = sorted(g.in_region(int(v), 0)[1] for v in g.successors(g.index("add")) if g.kinds[v] == "view")
    assert pieces == [(0, 16), (16, 32), (32, 48), (48, 64)]
    # output projection folds (B, T) into sample
    out = g.index("out")
    assert g.dims[out]["sample"] == 4 * steps and g.out_dims[out] == ("sample", "", "channel")


def test_attention_matmul_softmax() -> None:
    b, s, d, heads = 2, 5, 32, 4
    # a float (B, S, D) input is named like a 1D image (sample, channel, length) unless told
    g = build_layer_graph(TinyAttention(d, heads), [((b, s, d), "float32", ("sample", "length", "channel"))])
    _check_invariants(g)
    mm = [v for v in range(g.num_nodes) if g.kinds[v] == "matmul"]
    assert len(mm) == 2
    scores = mm[0]
    assert g.dims[scores] == {"sample": b, "channel": heads, "m": s, "n": s, "k": d // heads}
    assert g.parallel_dims[scores] == ("sample", "channel", "m", "n")
    assert g.in_dims[scores] == [("sample", "channel", "m", "k"), ("sample", "channel", "k", "n")]
    assert g.gemm_mnk(scores) == (b * heads * s, s, d // heads)
    assert g.flops_fwd[scores] == 2 * b * heads * s * s * (d // heads)
    sm = g.kinds.index("softmax")
    assert g.out_shape[sm] == (b, heads, s, s)
    assert len(g.parallel_dims[sm]) == 3 and g.out_dims[sm][-1] not in g.parallel_dims[sm]
    ln = g.kinds.index("layernorm")
    assert g.parallel_dims[ln] == ("sample", "channel")[:1] + (g.out_dims[ln][1],)
    q = g.index("q")
    assert g.dims[q] == {"sample": b * s, "channel": d, "in_channel": d}
    assert g.in_dims[q] == [("sample", "", "in_channel")]
    # reshape (B, S, D) -> (B, S, H, D/H): a split over heads reads whole heads of D
    rs = g.successors(q)[0]
    assert g.kinds[rs] == "view" and g.out_shape[rs] == (b, s, heads, d // heads)
    assert g.in_region(int(rs), 0, {g.out_dims[rs][2]: (1, 2)}) == ((0, b), (0, s), (8, 16))


def test_multi_output_module_edges_carry_src_port() -> None:
    class Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.fc = nn.Linear(16, 3)

        def forward(self, x: Tensor) -> dict[str, Tensor]:
            out, (h, c) = self.lstm(x)
            return {"logits": self.fc(out), "state": h + c}

    g = build_layer_graph(Seq(), [((3, 7, 8), "float32", ("sample", "length", "channel"))])
    _check_invariants(g)
    lstm = g.index("lstm")
    assert g.kinds[lstm] == "lstm" and g.parallel_dims[lstm] == ("sample",)
    assert g.dims[lstm] == {"sample": 3, "length": 7, "channel": 16, "in_channel": 8, "layer": 2}
    assert g.flops_fwd[lstm] == 2 * 7 * 3 * 4 * 16 * ((8 + 16) + (16 + 16))
    assert [o["shape"] for o in g.attrs[lstm]["outputs"]] == [[3, 7, 16], [2, 3, 16], [2, 3, 16]]
    assert g.out_bytes[lstm] == (3 * 7 * 16 + 2 * 2 * 3 * 16) * 4
    add = g.index("add")
    es = g.in_edges(add)
    assert g.src[es].tolist() == [lstm, lstm] and g.src_port[es].tolist() == [1, 2]
    assert g.edge_shape(int(es[0])) == (2, 3, 16) and g.edge_src_dims(int(es[0])) == ("", "sample", "channel")
    assert g.nbytes[es].tolist() == [2 * 3 * 16 * 4] * 2
    assert g.src_port[g.in_edges(g.index("fc"))].tolist() == [0]
    assert sorted(g.meta["outputs"]) == sorted([g.index("fc"), add])


def test_json_round_trip(tmp_path: Path) -> None:
    g = build_layer_graph(TinyLSTM(), [((2, 3), "int64")], name="tiny_lstm")
    path = tmp_path / "g.json"
    g.save(path)
    assert json.loads(path.read_text())["format"] == "harness.layergraph/1"
    h = LayerGraph.load(path)
    assert h.to_dict() == g.to_dict()
    for key in ("flops_fwd", "flops_bwd", "param_bytes", "out_bytes", "src", "dst", "nbytes", "dst_port", "src_port"):
        a, b = getattr(g, key), getattr(h, key)
        assert a.dtype == b.dtype and np.array_equal(a, b), key
    for key in ("names", "kinds", "dims", "parallel_dims", "out_shape", "out_dims", "in_dims", "attrs", "meta"):
        assert getattr(g, key) == getattr(h, key), key
    with pytest.raises(LayerGraphError, match="format"):
        LayerGraph.from_dict({**g.to_dict(), "format": "harness.opgraph/1"})


def test_networkx_export() -> None:
    g = build_layer_graph(InceptionLike(), [((2, 4, 8, 8), "float32")])
    nxg = g.to_networkx()
    assert isinstance(nxg, nx.DiGraph) and nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_nodes() == g.num_nodes and nxg.number_of_edges() == g.num_edges
    cat = g.index("cat")
    assert nxg.nodes[cat]["kind"] == "concat" and nxg.nodes[cat]["out_shape"] == (2, 20, 8, 8)
    assert sum(d["nbytes"] for _, _, d in nxg.edges(data=True)) == int(g.nbytes.sum())

    # a layer reading the same tensor twice: two edges, merged in a DiGraph, kept in a MultiDiGraph
    class Square(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * x

    sq = build_layer_graph(Square(), [((3, 4), "float32")])
    assert sq.num_edges == 2 and sorted(sq.dst_port.tolist()) == [0, 1]
    d = sq.to_networkx()
    assert d.number_of_edges() == 1 and d.edges[0, 1]["ports"] == [0, 1] and d.edges[0, 1]["nbytes"] == 96
    assert sq.to_networkx(multigraph=True).number_of_edges() == 2


def test_csr_and_dim_table() -> None:
    g = build_layer_graph(ResidualBlock(), [((2, 8, 8, 8), "float32")])
    ptr, succ, eid = g.succ_csr()
    assert len(ptr) == g.num_nodes + 1 and ptr[-1] == g.num_edges
    for v in range(g.num_nodes):
        for w, e in zip(succ[ptr[v]:ptr[v + 1]], eid[ptr[v]:ptr[v + 1]]):
            assert g.src[e] == v and g.dst[e] == w
    ptr, pred, eid = g.pred_csr()
    for v in range(g.num_nodes):
        es = eid[ptr[v]:ptr[v + 1]]
        assert np.all(g.dst[es] == v) and g.dst_port[es].tolist() == list(range(len(es)))
        assert np.array_equal(pred[ptr[v]:ptr[v + 1]], g.src[es])
    names, sizes, par = g.dim_table()
    assert sizes.shape == par.shape == (g.num_nodes, len(names))
    conv = g.index("conv1")
    assert sizes[conv, names.index("kernel_h")] == 3 and not par[conv, names.index("kernel_h")]
    assert par[conv, names.index("height")] and not par[0, names.index("in_channel")]
    assert np.all(g.io_bytes >= g.out_bytes)


def test_fake_tensors_make_huge_batches_free() -> None:
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    g = build_layer_graph(model, [((4096, 3, 224, 224), torch.float32)])
    elapsed = time.perf_counter() - start
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    act = 4096 * 64 * 224 * 224 * 4  # 52.6 GB per activation
    assert g.out_bytes[1] == act and g.nbytes[1] == act
    assert g.meta["batch_size"] == 4096
    assert elapsed < 10
    assert grown_kib < 512 * 1024  # far below one real activation
    # the module is untouched: BatchNorm statistics did not move
    assert int(model[1].num_batches_tracked) == 0 and torch.all(model[1].running_mean == 0)


def test_untraceable_model_gives_clear_error_and_leaf_fix() -> None:
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: Tensor) -> Tensor:
            if x.sum() > 0:  # data-dependent control flow
                return self.fc(x)
            return x

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(4, 4)
            self.gate = Gate()

        def forward(self, x: Tensor) -> Tensor:
            return self.gate(self.inp(x))

    with pytest.raises(LayerGraphError) as err:
        build_layer_graph(Net(), [((2, 4), "float32")], name="gated")
    msg = str(err.value)
    assert "'gated'" in msg and "control flow" in msg and "'gate' (Gate)" in msg and "leaf_modules=(Gate,)" in msg

    g = build_layer_graph(Net(), [((2, 4), "float32")], leaf_modules=(Gate,))
    assert g.names == ["x", "inp", "gate"] and g.kinds[2] == "other"
    assert g.param_bytes[2] == (16 + 4) * 4 and g.parallel_dims[2] == ("sample",)

    class Top(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(LayerGraphError, match="cannot trace model 'Top'.*leaf"):
        build_layer_graph(Top(), [((2, 4), "float32")])


def test_input_spec_forms_and_errors() -> None:
    model = TinyCNN()
    a = build_layer_graph(model, [torch.empty(2, 3, 16, 16)])
    b = build_layer_graph(model, {"x": InputSpec((2, 3, 16, 16), "float32")})
    c = build_layer_graph(model, [(2, 3, 16, 16)])
    assert a.to_dict() == b.to_dict() == c.to_dict()
    named = build_layer_graph(model, [((2, 3, 16, 16), "float32", ("sample", "channel", "height", "width"))])
    assert named.dims[0] == {"sample": 2, "channel": 3, "height": 16, "width": 16}
    with pytest.raises(LayerGraphError, match="shape propagation failed at call_module 'fc'"):
        build_layer_graph(model, [((2, 3, 32, 32), "float32")])
    with pytest.raises(LayerGraphError, match="no input given"):
        build_layer_graph(model, [])
    with pytest.raises(LayerGraphError, match="input spec"):
        build_layer_graph(model, ["image"])


def test_constructor_validation() -> None:
    g = build_layer_graph(TinyCNN(), [((2, 3, 16, 16), "float32")])
    d = g.to_dict()
    d.pop("format")
    bad = {**d, "src": [1, 1, 2, 3, 4, 5], "dst": [0, 2, 3, 4, 5, 6]}
    with pytest.raises(LayerGraphError, match="topological"):
        LayerGraph(**bad)
    with pytest.raises(LayerGraphError, match="parallel dim"):
        LayerGraph(**{**d, "parallel_dims": [("nope",)] + d["parallel_dims"][1:]})
    with pytest.raises(LayerGraphError, match="input ports"):
        LayerGraph(**{**d, "dst_port": [1] + d["dst_port"][1:]})


def test_layergraph_works_without_torch() -> None:
    """Algorithms on a LayerGraph need numpy only: load one in a process where torch cannot be imported."""
    import subprocess
    import sys

    import harness.core.layergraph as lg

    g = build_layer_graph(TinyCNN(), [((4, 3, 16, 16), "float32")])
    code = (
        "import importlib.util, json, sys\n"
        "sys.modules['torch'] = None\n"  # makes any `import torch` fail
        f"spec = importlib.util.spec_from_file_location('layergraph_no_torch', {lg.__file__!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "sys.modules[spec.name] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "g = mod.LayerGraph.from_dict(json.loads(sys.stdin.read()))\n"
        "print(json.dumps([g.num_nodes, g.gemm_mnk(1), g.in_region(1, 0, {'height': (8, 16)}), g.summary()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(g.to_dict()), capture_output=True, text=True,
                         check=True)
    n, mnk, region, summary = json.loads(out.stdout)
    assert n == 7 and tuple(mnk) == g.gemm_mnk(1)
    assert [tuple(r) for r in region] == list(g.in_region(1, 0, {"height": (8, 16)}))
    assert summary == g.summary()


# ---------------------------------------------------------------------- the zoo

_ZOO: list[tuple[str, str, dict, list]] = [
    ("lenet", "lenet5", {}, [((2, 1, 32, 32), "float32")]),
    ("alexnet", "alexnet", {}, [((2, 3, 227, 227), "float32")]),
    ("vgg", "vgg16", {}, [((2, 3, 224, 224), "float32")]),
    ("inception", "inception_v3", {}, [((2, 3, 299, 299), "float32")]),
    ("resnet", "resnet50", {}, [((2, 3, 224, 224), "float32")]),
    ("holography", "tensor_holography", {"num_layers": 6}, [((2, 4, 32, 32), "float32")]),
    ("nasnet", "nasnet_large", {"cells_per_stack": 1, "penultimate_filters": 96}, [((2, 3, 331, 331), "float32")]),
    ("pnasnet", "pnasnet_mobile", {"num_cells": 3}, [((2, 3, 224, 224), "float32")]),
    ("transformer", "transformer", {"vocab_size": 100, "d_model": 64, "num_heads": 4, "d_ff": 128,
                                    "num_encoder_layers": 2, "num_decoder_layers": 2},
     [((2, 7), "int64"), ((2, 6), "int64")]),
    ("nmt", "nmt", {"vocab_size": 100, "hidden_size": 32, "embed_dim": 32}, [((2, 5), "int64"), ((2, 4), "int64")]),
    ("rnnlm", "rnnlm", {"vocab_size": 100, "hidden_size": 32, "embed_dim": 32}, [((2, 6), "int64")]),
]


@pytest.mark.slow
@pytest.mark.parametrize("module_name,factory,kwargs,inputs", _ZOO, ids=[z[0] for z in _ZOO])
def test_zoo_models_build(module_name: str, factory: str, kwargs: dict, inputs: list) -> None:
    try:
        mod = importlib.import_module(f"harness.core.zoo.{module_name}")
    except ImportError:
        pytest.skip(f"harness.core.zoo.{module_name} is not there")
    if not hasattr(mod, factory):
        pytest.skip(f"harness.core.zoo.{module_name}.{factory} is not there")
    model = getattr(mod, factory)(**kwargs)
    g = build_layer_graph(model, inputs, name=factory)
    _check_invariants(g)
    assert g.meta["outputs"] and g.num_nodes > len(inputs)
    assert "other" not in g.kinds, [g.attrs[v].get("op") for v in range(g.num_nodes) if g.kinds[v] == "other"]
    # the GEMM layers' FLOPs are exactly what torch's flop counter measures on the whole model
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        xs = [torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in inputs]
        with FlopCounterMode(display=False) as counter:
            model(*xs)
    gemm = sum(g.flops_fwd[v] for v in range(g.num_nodes) if g.kinds[v] in GEMM_KINDS)
    assert gemm == counter.get_total_flops()
    assert g.unique_param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    # every shard region of a 2-way split of each parallel dim lies inside its tensor
    for v in range(g.num_nodes):
        for dim in g.parallel_dims[v]:
            ranges = g.shard_ranges(v, {dim: 2}, {dim: 1})
            for p, e in enumerate(g.in_edges(v)):
                for (lo, hi), n in zip(g.in_region(v, p, ranges), g.edge_shape(int(e))):
                    assert 0 <= lo <= hi <= n
    assert LayerGraph.from_dict(json.loads(json.dumps(g.to_dict()))).to_dict() == g.to_dict()
