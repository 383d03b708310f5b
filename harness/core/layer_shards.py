"""Shards of a layer under a parallel configuration: the geometry that cost tables and the
layer-graph simulator share.

A configuration of layer ``v`` (OptCNN Sec. 4, PaSE's "parallelization configuration") is a
degree per dim of ``v``'s iteration domain (:class:`harness.core.strategy.ParallelConfig`). Its
shards are the points of the degree grid in row-major order over the config's dims; shard
``k`` covers :func:`harness.core.layergraph.part` ``(size, degree, coord)`` of every split dim
(OptCNN's equal partitioning) and runs on device ``devices[k]``.

A split dim plays one of three roles for a layer (:func:`dim_roles`):

* ``OUTPUT``: it indexes an axis of the layer's output (sample, channel, height, ...): the
  shards write disjoint parts of the output;
* ``REDUCTION``: it is in the iteration domain but indexes no output axis (a GEMM's k, a
  convolution's input channels and kernel positions, PaSE's configurations): shards compute
  partial sums of the same output part, which an all-reduce among them completes;
* ``REPLICATED``: the dim is not in the layer's domain at all (a uniform configuration such as
  data parallelism applied to a layer without a sample dim): every shard computes the whole
  part, nothing is split.

Everything here is vectorised over *all configurations of a node at once*: a
:class:`ShardGrid` pads the shards of C configs to ``Smax`` so that per-axis intervals are
``[C, Smax]`` arrays, and the overlap of a producer's output boxes with a consumer's input
boxes is one broadcast product over the tensor's axes (:func:`overlap_elements`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from harness.core.layergraph import LayerGraph
from harness.core.strategy import Strategy, StrategyError

OUTPUT, REDUCTION, REPLICATED = 0, 1, 2

#: dims that never index a layer's weights: a split along them replicates the weights, whose
#: gradients must then be synchronised (OptCNN's t_S)
NON_PARAM_DIMS = frozenset({"sample", "height", "width", "length", "depth", "m"})

#: device mappings of shard k of a config with S shards on D devices
MAPPINGS = ("linear", "spread")


def shard_devices(num_shards: int, num_devices: int, mapping: str = "linear") -> np.ndarray:
    """Devices of the shards of a config with ``num_shards`` shards.

    ``linear``: shard k on device k (OptCNN: "shard k runs on device k"). ``spread``: shard k
    on device ``k * (D // S)``, spreading a small config over the hosts of a cluster.
    """
    if num_shards > num_devices:
        raise ValueError(f"a config with {num_shards} shards does not fit on {num_devices} devices")
    if mapping == "linear":
        return np.arange(num_shards, dtype=np.int64)
    if mapping == "spread":
        return np.arange(num_shards, dtype=np.int64) * (num_devices // num_shards)
    raise ValueError(f"unknown shard mapping {mapping!r}: use one of {MAPPINGS}")


def output_dim_names(lg: LayerGraph, v: int) -> frozenset[str]:
    """Dims of v that index an axis of one of its outputs."""
    names = set(lg.out_dims[v])
    for o in lg.attrs[v].get("outputs", []) or []:
        names.update(o.get("dims", ()))
    names.discard("")
    return frozenset(names)


def param_dim_names(lg: LayerGraph, v: int) -> frozenset[str]:
    """Dims of v that index its weights: ``attrs["param_dims"]`` where the builder names them (an
    einsum with a weight), else every dim but the batch and spatial ones."""
    named = lg.attrs[v].get("param_dims")
    if named is not None:
        return frozenset(named)
    return frozenset(d for d in lg.dims[v] if d not in NON_PARAM_DIMS)


def dim_roles(lg: LayerGraph, v: int, dims: Sequence[str]) -> np.ndarray:
    """Role (OUTPUT / REDUCTION / REPLICATED) of each config dim of node v."""
    out = output_dim_names(lg, v)
    return np.array([OUTPUT if d in out else REDUCTION if d in lg.dims[v] else REPLICATED for d in dims], dtype=np.int8)


def sync_bytes(lg: LayerGraph) -> np.ndarray:
    """Parameter bytes each node synchronises: a parameter shared by r readers (an unrolled RNN's
    gate) counts 1/r at each, so that the model's parameters are synchronised once in total."""
    readers: dict[str, int] = {}
    for a in lg.attrs:
        for name in (a.get("params") or {}):
            readers[name] = readers.get(name, 0) + 1
    out = np.zeros(lg.num_nodes)
    for v, a in enumerate(lg.attrs):
        named = a.get("params")
        if named:
            out[v] = sum(b / readers[name] for name, b in named.items())
        else:
            out[v] = float(lg.param_bytes[v])
    return out


@dataclass(eq=False)
class ShardGrid:
    """The shards of C configurations of one node, padded to ``Smax`` shards each.

    ``degrees[c, k]`` is the degree of ``dims[k]`` in config c; ``lo/hi[c, s, k]`` the range of
    ``dims[k]`` shard s covers (in units of that dim); ``devices[c, s]`` its device (-1 pads).
    ``group[c, s]`` numbers the shards of config c by the output part they write (shards that
    differ only in REDUCTION / REPLICATED dims share a group), ``first[c, s]`` marks the
    lowest-numbered shard of each group.
    """

    node: int
    dims: tuple[str, ...]
    degrees: np.ndarray
    nshards: np.ndarray
    valid: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    devices: np.ndarray
    group: np.ndarray
    first: np.ndarray
    roles: np.ndarray
    #: the dims, their roles, the degrees and the devices: what groups, devices and coordinates
    #: are a function of (``()`` for a grid made without a memo)
    layout: tuple = ()
    #: ``layout`` and the dims' sizes: two grids with equal keys have equal arrays, whichever
    #: node they belong to
    key: tuple = ()

    @property
    def num_configs(self) -> int:
        return len(self.degrees)

    @property
    def smax(self) -> int:
        return self.valid.shape[1]


def make_grid(lg: LayerGraph, v: int, dims: Sequence[str], degrees: np.ndarray, devices: np.ndarray | Sequence[Sequence[int]],
              memo: dict[tuple, ShardGrid] | None = None) -> ShardGrid:
    """Shard grid of configs ``degrees`` [C, len(dims)] of node v; ``devices`` [C, Smax] (or ragged
    lists). With ``memo``, a grid whose key is there shares that grid's (read-only) arrays."""
    dims = tuple(dims)
    deg = np.asarray(degrees, dtype=np.int64)
    if deg.ndim != 2:
        deg = deg.reshape(-1, len(dims)) if len(dims) else deg.reshape(1, 0)
    roles = dim_roles(lg, v, dims)
    sizes = np.array([lg.dims[v].get(d, 1) for d in dims], dtype=np.int64)
    layout: tuple = ()
    key: tuple = ()
    if memo is not None and isinstance(devices, np.ndarray) and devices.ndim == 2:
        layout = (dims, roles.tobytes(), deg.shape, deg.tobytes(), devices.shape, devices.tobytes())
        key = (layout, sizes.tobytes())
        hit = memo.get(key)
        if hit is not None:
            grid = copy.copy(hit)  # a shallow copy shares the read-only arrays
            grid.node = v
            return grid
    grid = _grid_arrays(v, dims, deg.copy() if key else deg, sizes, roles, devices, layout, key)
    if key:
        for arr in (grid.degrees, grid.nshards, grid.valid, grid.lo, grid.hi, grid.devices, grid.group, grid.first):
            arr.setflags(write=False)
        memo[key] = grid  # type: ignore[index]
    return grid


def _grid_arrays(v: int, dims: tuple[str, ...], deg: np.ndarray, sizes: np.ndarray, roles: np.ndarray,
                 devices: np.ndarray | Sequence[Sequence[int]], layout: tuple, key: tuple) -> ShardGrid:
    C, nd = deg.shape
    ns = np.prod(deg, axis=1) if nd else np.ones(C, dtype=np.int64)
    smax = int(ns.max()) if C else 1
    s = np.arange(smax)
    valid = s[None, :] < ns[:, None]
    # row-major coordinates: the last dim varies fastest
    coords = np.zeros((C, smax, nd), dtype=np.int64)
    rem = np.broadcast_to(s[None, :], (C, smax)).copy()
    for k in range(nd - 1, -1, -1):
        coords[:, :, k] = rem % deg[:, k:k + 1]
        rem //= deg[:, k:k + 1]
    coords[~valid] = 0
    lo = coords * sizes // np.maximum(deg[:, None, :], 1)
    hi = (coords + 1) * sizes // np.maximum(deg[:, None, :], 1)
    # REPLICATED dims do not split anything: every shard covers the whole (size-1) range
    rep = roles == REPLICATED
    if rep.any():
        lo[:, :, rep] = 0
        hi[:, :, rep] = 1
    dev = np.full((C, smax), -1, dtype=np.int64)
    if isinstance(devices, np.ndarray) and devices.ndim == 2:
        w = min(devices.shape[1], smax)
        dev[:, :w] = devices[:, :w]
    else:
        for c, row in enumerate(devices):
            dev[c, : len(row)] = list(row)
    dev[~valid] = -1
    # output groups: shards with the same coordinates on OUTPUT dims
    outk = np.flatnonzero(roles == OUTPUT)
    if len(outk) == nd:
        group = np.broadcast_to(s[None, :], (C, smax)).copy()
        first = valid.copy()
    else:
        mult = np.ones((C, nd), dtype=np.int64)
        # mixed-radix number of the OUTPUT coordinates
        acc = np.ones(C, dtype=np.int64)
        for k in outk[::-1]:
            mult[:, k] = acc
            acc = acc * deg[:, k]
        group = (coords[:, :, outk] * mult[:, None, outk]).sum(axis=2) if len(outk) else np.zeros((C, smax), dtype=np.int64)
        first = np.zeros((C, smax), dtype=bool)
        for c in range(C):
            _, idx = np.unique(group[c, : ns[c]], return_index=True)
            first[c, idx] = True
    group[~valid] = 0
    return ShardGrid(v, dims, deg, ns, valid, lo, hi, dev, group, first, roles, layout, key)


def mapped_devices(nshards: np.ndarray, num_devices: int, mapping: str = "linear") -> np.ndarray:
    """``[C, Smax]`` devices of configs with ``nshards[c]`` shards under a mapping (-1 pads)."""
    smax = int(nshards.max()) if len(nshards) else 1
    out = np.full((len(nshards), smax), -1, dtype=np.int64)
    cache: dict[int, np.ndarray] = {}
    for c, s in enumerate(nshards.tolist()):
        if s not in cache:
            cache[s] = shard_devices(s, num_devices, mapping)
        out[c, :s] = cache[s]
    return out


def strategy_rows(lg: LayerGraph, strategy: Strategy, num_devices: int) -> tuple[list[tuple[str, ...]], list[np.ndarray], list[np.ndarray]]:
    """Per node, the strategy's ``(dims, degrees [1, nd], devices [1, S])``; checks degrees against sizes."""
    dims, degs, devs = [], [], []
    for v in range(lg.num_nodes):
        cfg = strategy.config_of(v)
        if lg.kinds[v] == "input":
            dims.append(())
            degs.append(np.ones((1, 0), dtype=np.int64))
            devs.append(np.zeros((1, 1), dtype=np.int64))
            continue
        if cfg is None:
            d = int(strategy.device[v])
            dims.append(())
            degs.append(np.ones((1, 0), dtype=np.int64))
            devs.append(np.array([[d]], dtype=np.int64))
            continue
        for name, x in cfg.dims:
            if name in lg.dims[v] and x > lg.dims[v][name]:
                raise StrategyError(f"layer {lg.names[v]}: config {cfg} splits {name} (size {lg.dims[v][name]}) {x} ways")
        dims.append(tuple(n for n, _ in cfg.dims))
        degs.append(np.array([[x for _, x in cfg.dims]], dtype=np.int64).reshape(1, len(cfg.dims)))
        devs.append(np.array([cfg.devices], dtype=np.int64))
    return dims, degs, devs


# ---------------------------------------------------------------------------- tensor boxes
def _axis_box(grid: ShardGrid, size: int | None, name: str, n: int, window: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    """``[C, Smax]`` interval of one tensor axis of length n each shard touches (the rules of
    :func:`harness.core.layergraph._axis_range`, vectorised)."""
    C, S = grid.valid.shape
    if name and name in grid.dims:
        k = grid.dims.index(name)
        dlo, dhi = grid.lo[:, :, k], grid.hi[:, :, k]
        if grid.roles[k] == REPLICATED:
            dlo = np.zeros((C, S), dtype=np.int64)
            dhi = np.full((C, S), size if size is not None else n, dtype=np.int64)
    elif name:
        dlo = np.zeros((C, S), dtype=np.int64)
        dhi = np.full((C, S), size if size is not None else n, dtype=np.int64)
    else:
        dlo = np.zeros((C, S), dtype=np.int64)
        dhi = np.ones((C, S), dtype=np.int64)
    if window is not None:
        stride, offset, extent = (int(x) for x in window)
        a = np.maximum(0, dlo * stride + offset)
        b = np.minimum(n, (dhi - 1) * stride + offset + extent)
        empty = (dhi <= dlo) | (a >= b)
        a = np.minimum(a, n)
        return a, np.where(empty, a, b)
    if not name:
        return np.zeros((C, S), dtype=np.int64), np.full((C, S), n, dtype=np.int64)
    if size is None or n == size:
        return dlo, dhi
    return dlo * n // size, -(-dhi * n // size)


def out_boxes(lg: LayerGraph, grid: ShardGrid, port: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``lo, hi [C, Smax, A]`` of output ``port`` written by every shard of every config."""
    v = grid.node
    if port == 0:
        shape, axes = lg.out_shape[v], lg.out_dims[v]
    else:
        o = lg.attrs[v]["outputs"][port]
        shape, axes = tuple(o["shape"]), tuple(o["dims"])
    return _stack([_axis_box(grid, lg.dims[v].get(a) if a else None, a, n, None) for a, n in zip(axes, shape)], grid)


def in_boxes(lg: LayerGraph, grid: ShardGrid, port: int) -> tuple[np.ndarray, np.ndarray]:
    """``lo, hi [C, Smax, A]`` of input ``port`` read by every shard (halos included; an empty
    box where a shard does not need the input, as :meth:`LayerGraph.in_region`)."""
    v = grid.node
    e = int(lg.in_edges(v)[port])
    shape = lg.edge_shape(e)
    axes = lg.in_dims[v][port]
    a = lg.attrs[v]
    windows = a.get("windows")
    win = windows[port] if windows else {}
    lo, hi = _stack([_axis_box(grid, lg.dims[v].get(name) if name else None, name, n, win.get(str(i)))
                     for i, (name, n) in enumerate(zip(axes, shape))], grid)
    select = a.get("select")
    if select and select[port] is not None:
        name, idx = select[port]
        if name in grid.dims:
            k = grid.dims.index(name)
            need = (grid.lo[:, :, k] <= idx) & (idx < grid.hi[:, :, k])
            hi = np.where(need[:, :, None], hi, lo)
    return lo, hi


def _stack(boxes: list[tuple[np.ndarray, np.ndarray]], grid: ShardGrid) -> tuple[np.ndarray, np.ndarray]:
    C, S = grid.valid.shape
    if not boxes:
        return np.zeros((C, S, 0), dtype=np.int64), np.zeros((C, S, 0), dtype=np.int64)
    return np.stack([b[0] for b in boxes], axis=2), np.stack([b[1] for b in boxes], axis=2)


def box_volume(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Elements in boxes ``[..., A]``."""
    return np.prod(np.maximum(hi - lo, 0), axis=-1).astype(np.float64)


def overlap_elements(plo: np.ndarray, phi: np.ndarray, qlo: np.ndarray, qhi: np.ndarray) -> np.ndarray:
    """Elements shared by producer boxes ``[..., Cu, Su, A]`` and consumer boxes ``[..., Cv, Sv, A]``
    (the same leading axes, one per edge of a batch): ``[..., Cu, Su, Cv, Sv]``, one broadcast
    product over the axes (an axis that one side does not split broadcasts over that side)."""
    lead = plo.shape[:-3]
    Cu, Su, A = plo.shape[-3:]
    Cv, Sv = qlo.shape[-3:-1]
    out = np.ones(lead + (Cu, Su, Cv, Sv), dtype=np.float64)
    for a in range(A):
        pl, ph = plo[..., a], phi[..., a]
        ql, qh = qlo[..., a], qhi[..., a]
        pconst = pl.size and (pl == pl.flat[0]).all() and (ph == ph.flat[0]).all()
        qconst = ql.size and (ql == ql.flat[0]).all() and (qh == qh.flat[0]).all()
        if pconst and qconst:
            out *= max(0, min(int(ph.flat[0]), int(qh.flat[0])) - max(int(pl.flat[0]), int(ql.flat[0])))
            continue
        if pconst:
            ov = np.minimum(ph.flat[0], qh) - np.maximum(pl.flat[0], ql)
            out *= np.maximum(ov, 0)[..., None, None, :, :]
            continue
        if qconst:
            ov = np.minimum(ph, qh.flat[0]) - np.maximum(pl, ql.flat[0])
            out *= np.maximum(ov, 0)[..., None, None]
            continue
        ov = np.minimum(ph.astype(np.int32)[..., None, None], qh.astype(np.int32)[..., None, None, :, :])
        ov -= np.maximum(pl.astype(np.int32)[..., None, None], ql.astype(np.int32)[..., None, None, :, :])
        np.maximum(ov, 0, out=ov)
        out *= ov
    return out


def edge_itemsize(lg: LayerGraph, e: int) -> float:
    """Bytes per element of the tensor on edge e."""
    n = int(np.prod(lg.edge_shape(e))) if lg.edge_shape(e) else 1
    return float(lg.nbytes[e]) / max(n, 1)


def remote_elements(lg: LayerGraph, e: int, gu: ShardGrid, gv: ShardGrid,
                    ov: np.ndarray | None = None, cu_slice: slice | None = None) -> np.ndarray:
    """Elements each producer shard sends each consumer shard over edge e: ``[Cu, Su, Cv, Sv]``
    (:func:`resident_rule` applied to the overlap of the producers' output boxes and the
    consumers' input boxes)."""
    sl = cu_slice or slice(None)
    if ov is None:
        plo, phi = out_boxes(lg, gu, int(lg.src_port[e]))
        qlo, qhi = in_boxes(lg, gv, int(lg.dst_port[e]))
        ov = overlap_elements(plo[sl], phi[sl], qlo, qhi)
    return resident_rule(ov, gu.devices[sl], gu.valid[sl], gu.group[sl], gu.first[sl], gv.devices, gv.valid)


def resident_rule(ov: np.ndarray, dev_u: np.ndarray, valid_u: np.ndarray, group: np.ndarray, first: np.ndarray,
                  dev_v: np.ndarray, valid_v: np.ndarray) -> np.ndarray:
    """What of the overlaps ``ov`` [..., Cu, Su, Cv, Sv] a producer shard sends a consumer shard.

    A consumer shard needs its input box; what a producer shard on its own device wrote is
    resident. Producer shards that write the same part (REDUCTION / REPLICATED splits, one
    ``group``) are replicas: a consumer with a local replica needs nothing from the others,
    otherwise it reads from the group's ``first`` shard. Producer arrays are ``[..., Cu, Su]``,
    consumer arrays ``[..., Cv, Sv]``, with the leading axes of ``ov`` (a batch of edges).
    """
    local = dev_u[..., None, None] == dev_v[..., None, None, :, :]
    T = np.where(local, 0.0, ov * (valid_u[..., None, None] & valid_v[..., None, None, :, :]))
    if not (first | ~valid_u).all():  # some config has replicas
        Su = group.shape[-1]
        member = (group[..., None, :] == np.arange(Su)[:, None]) & valid_u[..., None, :]  # [..., Cu, group, shard]
        has = np.einsum("...gs,...svw->...gvw", member.astype(np.float32), local.astype(np.float32)) > 0
        idx = np.broadcast_to(group[..., None, None], T.shape)
        T *= first[..., None, None] & ~np.take_along_axis(has, idx, axis=-3)
    return T
