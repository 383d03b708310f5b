"""``costs=pase``: PaSE's own FLOP-denominated cost model (Elango 2021, public code
baidu-research/PaSE, ``nn_ops.py``), written from its facts so that our searches can be run on
the problem the public PaSE solves.

Everything is in FLOPs. Communication of ``w`` words costs ``r * w`` FLOPs with
``r = peak FLOP/s / (bandwidth / 8 bytes per word)``; the defaults, 10 TFLOP/s and 16 GB/s,
give r = 5000. ``AR(w, P) = 2 (P - 1) w / P`` words is a ring all-reduce of ``w`` words over
P processors. Sizes are per processor: a dim of size d split e ways is d / e (PaSE divides
as floats).

Per layer (t_V), with our layer kinds mapped onto PaSE's operators:

* GEMM with per-processor sizes m, n, k (``conv*``, ``linear``, ``matmul``, ``embedding``):
  ``3 m n k + 3 pw m n`` (one GEMM forward, two backward; ``pw`` = ``attrs["pw"]``, PaSE's
  ``pw_op_cnt``, the pointwise ops fused into the layer) plus ``AR(m n, k-split) + AR(m k,
  n-split) + AR(n k, m-split)`` words. A node with ``attrs["gemm"]`` (the builder's einsum,
  linear and embedding, the traced embedding) is PaSE's Einsum: every index its own dim, the
  batch indices multiplying the cost, the m, n and k indices multiplied into the GEMM's sizes
  and splits. Otherwise batch dims of a ``matmul`` multiply both. A convolution is the GEMM
  (b h_out w_out, n, c r s) and its h and w are never split; an ``embedding`` is PaSE's one-hot
  Einsum, the GEMM (tokens, embedding dim, vocabulary), the vocabulary a dim PaSE may split.
  Traced graphs keep ReLUs as their own ``elementwise`` layers, so their pw is 0.
* ``pool*``: the output elements per processor, plus the ghost (halo) elements of the input:
  along a split spatial axis the per-processor extent grows by the kernel size.
* ``batchnorm``: PaSE's ``Norm`` over the sample axis (``BatchNorm = Norm(x, 0)``);
  ``layernorm``: ``Norm`` over the normalised axis. ``Norm(axis)``: ``16 e`` for e elements
  per processor, plus ``4 AR(e / d_axis, axis split)`` (mean and variance) and
  ``4 AR(d_axis, other splits)`` (scale and bias).
* ``softmax`` (over axis a): ``4 e + e * d_a`` compute, plus ``AR(e', P_a) + AR(e' d_a, P_a)
  + AR(e', P_a)`` with e' the per-processor elements without axis a.
* ``reduce`` (PaSE's ReduceMean): ``AR(e, product of the splits of the reduced dims)``.
* ``loss`` with ``attrs["loss"] == "softmax_cross_entropy"`` (PaSE's SoftmaxCrossEntropy, the
  class axis last): ``4 e + 2 e'`` with e' the per-processor rows, plus ``2 r e'`` when the
  classes are split (each label broadcast along the class split).
* ``elementwise`` (``(1 + pw) e``), ``norm`` (local response normalisation): e.
* ``lstm`` / ``gru`` / ``rnn`` modules: PaSE's LSTM, the GEMM (layers; seq * batch,
  gates * n, k + n) with 3 pointwise ops per element, plus the reshape of every cell's output
  (b, n) into the next cell's input (b, k), ``layers * seq`` times.
* ``input``, ``view``, ``concat``: 0 (PaSE's Reshape, Transpose, Concat and Split cost 0; its
  graphs have no vertex for inputs and no edge from one).
* other kinds (not in PaSE): their FLOPs over the processors.

Per edge (t_E): ``2 * (consumer's per-processor area - overlap with the producer's per-processor
area)`` words, forward and backward; the overlap counts as 0 when the consumer's tensor is
split over more processors than the producer's. Per-processor areas are the tensor's shape
divided by the degree of the dim indexing each axis (our axis maps). Of several edges between
one pair of layers (a layer reading two outputs of another, or one tensor twice) PaSE's code
keeps only the last input port's, as it stores edges in a networkx ``DiGraph``;
``parallel_edges: last`` (the default) does the same, ``all`` counts every edge.

Configurations (PaSE's iteration domains, :func:`pase_domain`): a dim of size d may be split
by any divisor e of d with ``d / e >= cutoff`` (4 for CNNs, 1 for RNNLM and Transformer: the
``auto`` cutoff picks 4 when the graph has a convolution); the splits of a layer multiply to
at most p (``product: at_most``).

Configurations of a reshape written with the builder (``attrs["contiguous"]``: PaSE's Ravel and
Unravel) split contiguously only (:func:`algorithms.layer_configs.enumerate_configs`). On PaSE's
own four graphs, rebuilt with the builder (:mod:`harness.core.zoo.pase_graphs`), our search gives
PaSE's optimum (``python -m experiments pase_parity``). Deviations on traced graphs (our zoo's):
a ``concat`` never splits its concatenation axis (as PaSE); traced views may split any output
dim; a traced linear folds its leading axes into one ``sample`` dim.

For the simulator, ``PaseCostModel`` is the analytical roofline of the cluster (it subclasses
:class:`harness.core.costs.AnalyticalCostModel`), so a PaSE strategy's simulated step time is
comparable with every other strategy's.

Its figures are checked when it is built: ``peak_tflops`` and ``bw_GBps`` > 0, ``cutoff``
``auto`` or an integer >= 1, ``product`` at_most or divides, and the roofline's as
:func:`harness.core.costs.check_roofline`; a bad one is a :class:`harness.core.costs.CostModelError`
naming its key.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from harness.core.cluster import Cluster

from harness.core.checks import positive_int, positive_number
from harness.core.costs import AnalyticalCostModel, CostModelError
from harness.core.layergraph import LayerGraph
from harness.core.layer_shards import output_dim_names

CONV_KINDS = frozenset({"conv1d", "conv2d", "conv3d"})
POOL_KINDS = frozenset({"pool1d", "pool2d", "pool3d"})
RNN_KINDS = {"lstm": 4, "gru": 3, "rnn": 1}
SPATIAL = ("depth", "height", "width", "length")
ZERO_KINDS = frozenset({"input", "view", "concat"})


def pase_domain(lg: LayerGraph, v: int) -> tuple[str, ...]:
    """The dims of v's iteration domain PaSE may split (see the module docstring)."""
    kind, d = lg.kinds[v], lg.dims[v]
    if kind == "input":
        return ()
    if kind in CONV_KINDS:
        return tuple(x for x in d if x not in SPATIAL and not x.startswith("d"))
    if kind in POOL_KINDS:
        return tuple(x for x in d if not x.startswith("kernel_"))
    if kind == "concat":
        axis = lg.attrs[v].get("dim")
        cat = lg.out_dims[v][int(axis)] if axis is not None and int(axis) < len(lg.out_dims[v]) else None
        return tuple(x for x in d if x != cat)
    if kind in RNN_KINDS:
        return tuple(x for x in ("layer", "sample", "channel", "in_channel") if x in d)
    if kind == "loss" and lg.attrs[v].get("loss") == "softmax_cross_entropy":
        return tuple(d)
    if kind in ("view", "other", "loss"):
        return tuple(lg.parallel_dims[v])
    return tuple(d)


def auto_cutoff(lg: LayerGraph) -> int:
    """PaSE's cutoff: 4 for CNNs, 1 for RNNLM and Transformer."""
    return 4 if any(k in CONV_KINDS for k in lg.kinds) else 1


class PaseCostModel(AnalyticalCostModel):
    """PaSE's cost model for the search (FLOPs), the cluster's roofline for the simulator."""

    #: the cost model's name (``LayerCostTables.model``)
    model = "pase"

    def __init__(self, cluster: Cluster, peak_tflops: float = 10.0, bw_GBps: float = 16.0, cutoff: int | str = "auto",
                 product: str = "at_most", parallel_edges: str = "last", **roofline: Any) -> None:
        super().__init__(cluster, **roofline)
        if product not in ("at_most", "divides"):
            raise CostModelError(f"costs.product must be 'at_most' or 'divides', got {product!r}")
        if parallel_edges not in ("last", "all"):
            raise CostModelError(f"costs.parallel_edges must be 'last' or 'all', got {parallel_edges!r}")
        self.parallel_edges = parallel_edges
        self.peak_flops = positive_number(peak_tflops, "costs.peak_tflops", CostModelError) * 1e12
        self.word_bw = positive_number(bw_GBps, "costs.bw_GBps", CostModelError) * 1e9 / 8.0
        #: FLOPs per word communicated (PaSE's WordsToFlops factor)
        self.r = self.peak_flops / self.word_bw
        self.cutoff = cutoff if cutoff in (None, "auto") else positive_int(cutoff, "costs.cutoff", CostModelError)
        self.product = product

    def cutoff_for(self, lg: LayerGraph) -> int:
        return auto_cutoff(lg) if self.cutoff in (None, "auto") else int(self.cutoff)

    # ------------------------------------------------------------------ helpers
    def _ar(self, words: np.ndarray, procs: np.ndarray) -> np.ndarray:
        """FLOPs of a ring all-reduce of ``words`` over ``procs`` (0 when procs == 1)."""
        procs = np.asarray(procs, dtype=np.float64)
        return self.r * 2.0 * (procs - 1.0) * np.asarray(words, dtype=np.float64) / procs

    def _gemm(self, batches: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
              dm: np.ndarray, dn: np.ndarray, dk: np.ndarray, pw: float = 0.0) -> np.ndarray:
        """PaSE's ComputeGemmCosts on per-processor sizes (m, n, k) and splits (dm, dn, dk)."""
        comp = 3.0 * m * n * k + 3.0 * pw * m * n
        comm = self._ar(m * n, dk) + self._ar(m * k, dn) + self._ar(n * k, dm)
        return batches * (comp + comm)

    def _norm(self, size: dict[str, float], deg: dict[str, np.ndarray], axis: str, C: int) -> np.ndarray:
        dpp = {x: size[x] / deg[x] for x in size}
        elems = np.prod(np.stack(list(dpp.values())), axis=0) if dpp else np.ones(C)
        cost = 16.0 * elems
        if axis in dpp:
            others = np.prod(np.stack([deg[x] for x in size if x != axis]), axis=0) if len(size) > 1 else np.ones(C)
            cost = cost + 4.0 * self._ar(elems / dpp[axis], deg[axis]) + 4.0 * self._ar(dpp[axis], others)
        return cost

    # ------------------------------------------------------------------ t_V
    def vertex_flops(self, lg: LayerGraph, v: int, dims: Sequence[str], degrees: np.ndarray) -> np.ndarray:
        """t_V of node v for every config (rows of ``degrees`` over ``dims``), in FLOPs."""
        degrees = np.asarray(degrees, dtype=np.float64)
        degrees = degrees if degrees.ndim == 2 else degrees.reshape(-1, len(dims)) if len(dims) else degrees.reshape(1, 0)
        C = len(degrees)
        kind, d = lg.kinds[v], lg.dims[v]
        ones = np.ones(C)
        deg = {x: ones.copy() for x in d}
        for i, x in enumerate(dims):
            deg[x] = degrees[:, i]
        size = {x: float(s) for x, s in d.items()}

        def g(*names: str) -> np.ndarray:
            out = ones.copy()
            for x in names:
                if x in deg:
                    out = out * deg[x]
            return out

        pw = float(lg.attrs[v].get("pw", 0) or 0)
        if kind in ZERO_KINDS:
            return np.zeros(C)
        groups = lg.attrs[v].get("gemm")
        if groups:
            bpp = ones.copy()
            for x in groups.get("batch", ()):
                bpp = bpp * (size[x] / deg[x])
            mnk = [(float(np.prod([size[x] for x in groups.get(key, ())])), g(*groups.get(key, ()))) for key in "mnk"]
            (m, dm), (n, dn), (k, dk) = mnk
            return self._gemm(bpp, m / dm, n / dn, k / dk, dm, dn, dk, pw)
        if kind in CONV_KINDS:
            m, n, k = lg.gemm_mnk(v)
            spatial = [x for x in d if x in SPATIAL]
            kern = [x for x in d if x.startswith("kernel_")]
            dm, dn, dk = g("sample", *spatial), g("channel"), g("in_channel", *kern)
            return self._gemm(ones, m / dm, n / dn, k / dk, dm, dn, dk, pw)
        if kind == "linear":
            m, n, k = lg.gemm_mnk(v)
            dm, dn, dk = g("sample"), g("channel"), g("in_channel")
            return self._gemm(ones, m / dm, n / dn, k / dk, dm, dn, dk, pw)
        if kind == "matmul":
            batch = [x for x in d if x not in ("m", "n", "k")]
            bpp = ones.copy()
            for x in batch:
                bpp = bpp * (size[x] / deg[x])
            m, n, k = size.get("m", 1.0), size.get("n", 1.0), size.get("k", 1.0)
            dm, dn, dk = g("m"), g("n"), g("k")
            return self._gemm(bpp, m / dm, n / dn, k / dk, dm, dn, dk, pw)
        if kind == "embedding":
            vocab = float(lg.attrs[v].get("num_embeddings") or 1)
            m, n = size.get("sample", 1.0), size.get("channel", 1.0)
            dm, dn = g("sample"), g("channel")
            return self._gemm(ones, m / dm, n / dn, ones * vocab, dm, dn, ones)
        if kind in RNN_KINDS:
            gates = RNN_KINDS[kind]
            layers, seq, b = size.get("layer", 1.0), size.get("length", 1.0), size.get("sample", 1.0)
            n, kin = size.get("channel", 1.0), size.get("in_channel", 1.0)
            dl, db, dn, dk = g("layer"), g("sample", "length"), g("channel"), g("in_channel")
            cost = self._gemm(layers / dl, seq * b / db, gates * n / dn, (kin + n) / dk, db, dn, dk, pw=3.0)
            # each cell's output (b, n) becomes the next cell's input (b, k): GetAreaNeeded
            out_pp = np.stack([b / g("sample"), n / dn], axis=1)
            in_pp = np.stack([b / g("sample"), kin / dk], axis=1)
            p_out, p_in = g("sample") * dn, g("sample") * dk
            area = np.prod(in_pp, axis=1)
            inter = np.where(p_in > p_out, 0.0, np.prod(np.minimum(in_pp, out_pp), axis=1))
            return cost + layers * seq * self.r * np.clip(area - inter, 0.0, None)
        if kind in POOL_KINDS:
            dom = [x for x in d if not x.startswith("kernel_")]
            elems = np.prod(np.stack([size[x] / deg[x] for x in dom]), axis=0)
            return elems + self._ghost(lg, v, deg, C)
        if kind in ("batchnorm", "layernorm"):
            axis = lg.attrs[v].get("norm_dim")
            if axis not in d:
                if kind == "batchnorm":
                    axis = "sample"
                else:
                    normed = [x for x in d if x not in lg.parallel_dims[v]]
                    axis = normed[-1] if normed else list(d)[-1]
            return self._norm(size, deg, axis, C)
        if kind == "loss" and lg.attrs[v].get("loss") == "softmax_cross_entropy":
            cls = lg.attrs[v].get("class_dim") or list(d)[-1]
            elems = np.prod(np.stack([size[x] / deg[x] for x in d]), axis=0)
            rows = np.prod(np.stack([size[x] / deg[x] for x in d if x != cls]), axis=0) if len(d) > 1 else ones.copy()
            return 4.0 * elems + 2.0 * rows + np.where(deg[cls] > 1, self.r * 2.0 * rows, 0.0)
        if kind == "softmax":
            pos = lg.attrs[v].get("dim")
            axes = lg.out_dims[v]
            if pos is not None and -len(axes) <= int(pos) < len(axes) and axes[int(pos)]:
                axis = axes[int(pos)]
            else:
                rest = [x for x in d if x not in lg.parallel_dims[v]]
                axis = rest[-1] if rest else list(d)[-1]
            dpp = {x: size[x] / deg[x] for x in d}
            elems_all = np.prod(np.stack(list(dpp.values())), axis=0)
            wo = np.prod(np.stack([dpp[x] for x in d if x != axis]), axis=0) if len(d) > 1 else ones.copy()
            pa = deg[axis]
            return (4.0 * elems_all + elems_all * size[axis]
                    + self._ar(wo, pa) + self._ar(wo * size[axis], pa) + self._ar(wo, pa))
        if kind == "reduce":
            kept = output_dim_names(lg, v)
            elems = np.prod(np.stack([size[x] / deg[x] for x in d]), axis=0)
            return self._ar(elems, g(*[x for x in d if x not in kept]))
        if kind in ("elementwise", "norm"):
            return (1.0 + pw) * (np.prod(np.stack([size[x] / deg[x] for x in d]), axis=0) if d else ones.copy())
        # not one of PaSE's operators: its FLOPs over its processors
        return (float(lg.flops_fwd[v]) + float(lg.flops_bwd[v])) / g(*dims)

    def _ghost(self, lg: LayerGraph, v: int, deg: dict[str, np.ndarray], C: int) -> np.ndarray:
        """PaSE's ComputeGhostCommCosts: ghost elements of a pooling input, in FLOPs."""
        e = int(lg.in_edges(v)[0])
        shape = lg.edge_shape(e)
        axes = lg.in_dims[v][0]
        win = (lg.attrs[v].get("windows") or [{}])[0]
        inner = np.ones(C)
        outer = np.ones(C)
        for i, (name, n) in enumerate(zip(axes, shape)):
            dg = deg.get(name, np.ones(C)) if name else np.ones(C)
            pp = n / dg
            w = win.get(str(i))
            if w is not None and name in SPATIAL:
                outer = outer * np.where(dg > 1, pp + float(w[2]), pp)
            else:
                outer = outer * pp
            inner = inner * pp
        return self.r * (outer - inner)

    # ------------------------------------------------------------------ t_E
    def edge_flops(self, lg: LayerGraph, e: int, dims_u: Sequence[str], deg_u: np.ndarray,
                   dims_v: Sequence[str], deg_v: np.ndarray) -> np.ndarray:
        """t_E of edge e for every (producer config, consumer config): ``[Cu, Cv]`` FLOPs."""
        u = int(lg.src[e])
        deg_u = np.asarray(deg_u, dtype=np.float64)
        deg_v = np.asarray(deg_v, dtype=np.float64)
        Cu, Cv = len(deg_u), len(deg_v)
        if lg.kinds[u] == "input":
            return np.zeros((Cu, Cv))
        shape = np.asarray(lg.edge_shape(e), dtype=np.float64)
        src_axes = lg.edge_src_dims(e)
        dst_axes = lg.edge_dst_dims(e)

        def per_axis(axes: Sequence[str], dims: Sequence[str], deg: np.ndarray) -> np.ndarray:
            out = np.ones((len(deg), len(axes)))
            for a, name in enumerate(axes):
                if name and name in dims:
                    out[:, a] = deg[:, list(dims).index(name)]
            return out

        su = per_axis(src_axes, dims_u, deg_u)  # [Cu, A]
        sv = per_axis(dst_axes, dims_v, deg_v)  # [Cv, A]
        src_pp = shape / su
        tgt_pp = shape / sv
        src_procs = np.prod(su, axis=1)
        tgt_procs = np.prod(sv, axis=1)
        area = np.prod(tgt_pp, axis=1)  # [Cv]
        inter = np.prod(np.minimum(src_pp[:, None, :], tgt_pp[None, :, :]), axis=2)  # [Cu, Cv]
        inter = np.where(tgt_procs[None, :] > src_procs[:, None], 0.0, inter)
        return self.r * 2.0 * np.clip(area[None, :] - inter, 0.0, None)
