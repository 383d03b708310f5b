"""Small hand-built layer graphs for the OptCNN / PaSE / layer-simulator tests: random DAGs of
1D convolutions (halos), 1x1 convolutions and elementwise joins over (sample, channel,
length) tensors, chains, and series-parallel graphs, plus hypothesis strategies for them; the
builder example of docs/layer_graphs.md (:func:`tiny_lm`)."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import strategies as st

from harness.core.layer_builder import LayerGraphBuilder, Weight
from harness.core.layergraph import LayerGraph

AXES = ("sample", "channel", "length")


def _node(kind: str, B: int, C: int, L: int, n_in: int, k: int = 3, cin: int | None = None) -> dict:
    cin = C if cin is None else cin
    if kind == "input":
        return dict(kind="input", dims={"sample": B, "channel": C, "length": L}, parallel=AXES, in_dims=[], attrs={},
                    ff=0.0, fb=0.0, pb=0)
    if kind == "conv1d":
        dims = {"sample": B, "channel": C, "length": L, "in_channel": cin, "kernel_l": k}
        ff = 2.0 * B * C * L * cin * k
        return dict(kind="conv1d", dims=dims, parallel=AXES, in_dims=[("sample", "in_channel", "length")],
                    attrs={"windows": [{"2": [1, -(k // 2), k]}]}, ff=ff, fb=2 * ff, pb=4 * C * cin * k)
    if kind == "pointwise":  # a 1x1 convolution: channel mixing without a halo
        return _node("conv1d", B, C, L, n_in, k=1, cin=cin)
    if kind == "elementwise":
        e = float(B * C * L)
        return dict(kind="elementwise", dims={"sample": B, "channel": C, "length": L}, parallel=AXES,
                    in_dims=[AXES] * n_in, attrs={}, ff=e * max(1, n_in - 1), fb=e, pb=0)
    raise ValueError(kind)


def build(kinds: list[str], edges: list[tuple[int, int]], B: int = 8, C: int = 8, L: int = 12, name: str = "case") -> LayerGraph:
    """A LayerGraph over nodes ``kinds`` (ids = topological order) and ``edges`` (src < dst, in
    port order per consumer). Every tensor is (B, C, L) float32."""
    n = len(kinds)
    indeg = [sum(1 for _, d in edges if d == v) for v in range(n)]
    specs = [_node(kinds[v], B, C, L, indeg[v]) for v in range(n)]
    port = [0] * n
    src, dst, dport = [], [], []
    for s, d in edges:
        assert s < d
        src.append(s)
        dst.append(d)
        dport.append(port[d])
        port[d] += 1
    out_bytes = 4 * B * C * L
    attrs = []
    for v, sp in enumerate(specs):
        a = dict(sp["attrs"])
        if sp["pb"]:
            a["params"] = {f"{name}.{v}.weight": sp["pb"]}
        attrs.append(a)
    return LayerGraph(
        names=[f"{kinds[v]}{v}" for v in range(n)], kinds=[sp["kind"] for sp in specs], dims=[sp["dims"] for sp in specs],
        parallel_dims=[sp["parallel"] for sp in specs], flops_fwd=[sp["ff"] for sp in specs],
        flops_bwd=[sp["fb"] for sp in specs], param_bytes=[sp["pb"] for sp in specs],
        out_shape=[(B, C, L)] * n, out_bytes=[out_bytes] * n, out_dims=[AXES] * n,
        in_dims=[sp["in_dims"] for sp in specs], attrs=attrs, src=src, dst=dst, nbytes=[out_bytes] * len(src),
        dst_port=dport, meta={"model": name, "batch_size": B, "dtype": "float32"},
    )


def _kind_for(indeg: int, rng: np.random.Generator) -> str:
    if indeg == 0:
        return "input"
    if indeg == 1:
        return ["conv1d", "pointwise", "elementwise"][int(rng.integers(0, 3))]
    return "elementwise"


def random_dag(seed: int, n: int, extra: float = 0.5, B: int = 8, C: int = 8, L: int = 12) -> LayerGraph:
    """A random connected DAG: node v > 0 reads 1 earlier node, plus another with probability ``extra``."""
    rng = np.random.default_rng(seed)
    edges = []
    for v in range(1, n):
        preds = [int(rng.integers(0, v))]
        if v > 1 and rng.random() < extra:
            preds.append(int(rng.integers(0, v)))
        edges += [(p, v) for p in sorted(preds)]
    indeg = [sum(1 for _, d in edges if d == v) for v in range(n)]
    kinds = [_kind_for(indeg[v], rng) for v in range(n)]
    return build(kinds, edges, B, C, L, name=f"dag{seed}")


def chain(seed: int, n: int, B: int = 8, C: int = 8, L: int = 12) -> LayerGraph:
    rng = np.random.default_rng(seed)
    kinds = ["input"] + [_kind_for(1, rng) for _ in range(n - 1)]
    return build(kinds, [(v, v + 1) for v in range(n - 1)], B, C, L, name=f"chain{seed}")


def series_parallel(seed: int, steps: int, B: int = 8, C: int = 8, L: int = 12) -> LayerGraph:
    """A two-terminal series-parallel graph grown from one edge by random series subdivisions,
    parallel branches (u -> w -> v beside u -> v) and doubled edges (x * x)."""
    rng = np.random.default_rng(seed)
    g = nx.MultiDiGraph()
    g.add_edge(0, 1)
    nxt = 2
    for _ in range(steps):
        es = list(g.edges(keys=True))
        u, v, k = es[int(rng.integers(0, len(es)))]
        r = rng.random()
        if r < 0.45:
            g.remove_edge(u, v, k)
            g.add_edge(u, nxt)
            g.add_edge(nxt, v)
            nxt += 1
        elif r < 0.9:
            g.add_edge(u, nxt)
            g.add_edge(nxt, v)
            nxt += 1
        else:
            g.add_edge(u, v)
    order = list(nx.topological_sort(g))
    rank = {x: i for i, x in enumerate(order)}
    edges = sorted((rank[u], rank[v]) for u, v, _ in g.edges(keys=True))
    n = len(order)
    indeg = [sum(1 for _, d in edges if d == v) for v in range(n)]
    kinds = [_kind_for(indeg[v], rng) for v in range(n)]
    return build(kinds, edges, B, C, L, name=f"sp{seed}")


@st.composite
def small_dags(draw: st.DrawFn, max_nodes: int = 5) -> LayerGraph:
    seed = draw(st.integers(0, 10_000))
    n = draw(st.integers(2, max_nodes))
    extra = draw(st.sampled_from([0.0, 0.5, 1.0]))
    B = draw(st.sampled_from([4, 6, 8]))
    C = draw(st.sampled_from([4, 8, 12]))
    L = draw(st.sampled_from([6, 8, 16]))
    return random_dag(seed, n, extra, B, C, L)


def tiny_lm(batch_size: int = 32) -> LayerGraph:
    """docs/layer_graphs.md's example, line for line."""
    b = LayerGraphBuilder("tiny_lm", batch_size)
    ids = b.input("tokens", (batch_size, 64), dtype="int64", axes=("sample", "length"))
    x = b.embedding(ids, vocab=1000, units=128)
    h = b.einsum("ble,ef->blf", x, Weight((128, 512)), pw=1)
    h = b.einsum("blf,fe->ble", h, Weight((512, 128)))
    x = b.layernorm(b.elementwise(x, h))
    logits = b.linear(x, 1000)
    b.softmax_cross_entropy(logits)
    return b.build()

