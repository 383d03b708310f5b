"""OptCNN's cost functions of a layer graph's configurations (OptCNN Eq. 1), computed with the
job's time cost model (``costs=analytical``, and every cost model but ``costs=pase``).

Node cost vectors and edge cost matrices, in seconds, for every configuration (pair) of every
layer at once:

* t_C(v, c): the slowest shard's forward + backward time from the CostModel
  (:meth:`harness.core.costs.AnalyticalCostModel.layer_times`, one call for every layer and
  configuration); a shard does the fraction of the iteration domain its ranges cover.
* t_S(v, c): parameter synchronisation after back propagation. Shards that cover the same
  part of the weights (they differ only in dims that do not index the weights: sample,
  height, width, length) hold replicas; each replica group synchronises its part of the
  parameters through a parameter server (OptCNN) or a ring all-reduce (``costs.sync``); the
  groups run concurrently, t_S is the slowest. A parameter shared by r layers (an unrolled
  RNN) counts 1/r at each.
* t_R(v, c): only for splits of reduction dims (PaSE's space under analytical costs): the
  all-reduce that completes the partial sums of each output part, forward.
* t_X(e, c_u, c_v): :mod:`algorithms.layer_transfers`.

The replica groups of a configuration depend only on its degrees and devices, which most
layers share, so they are found once per distinct grid, and the all-reduces of every layer
over one group of devices are one vectorised call of the cost model.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from algorithms.layer_configs import SpaceOptions
from algorithms.layer_transfers import TransferCosts
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layer_shards import OUTPUT, REDUCTION, REPLICATED, ShardGrid, param_dim_names, sync_bytes
from harness.core.layergraph import LayerGraph



class OptCNNLayerCosts:
    """t_C + t_S (+ t_R) per node and t_X per edge of one (layer graph, cluster, cost model),
    with the caches that make the tables of one problem cheap to fill (see the module docstring)."""

    #: ``LayerCostTables.model``
    model = "analytical"
    #: the edge part's key in :func:`algorithms.layer_costs.evaluate`
    edge_part = "t_X"

    def __init__(self, lg: LayerGraph, cluster: Cluster, costs: CostModel) -> None:
        self.lg = lg
        self.cluster = cluster
        self.costs = costs
        self.sync = sync_bytes(lg)
        self.transfers = TransferCosts(lg, cluster)
        #: a representative device of each device kind, and each device's kind number
        self.kinds: dict[str, int] = {}
        for d in range(cluster.num_devices):
            self.kinds.setdefault(cluster.devices[d].spec.kind, d)
        names = list(self.kinds)
        self.kind_of = np.array([names.index(dev.spec.kind) for dev in cluster.devices], dtype=np.int64)
        self.group_cache: dict[tuple, dict[tuple[int, ...], np.ndarray]] = {}
        self.config_group_cache: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self.frac_cache: dict[tuple, np.ndarray] = {}
        self.share_cache: dict[tuple, tuple] = {}

    @classmethod
    def default_options(cls, lg: LayerGraph, costs: CostModel, space: str | None, product: str | None,
                        cutoff: int | str | None, mapping: str | None) -> SpaceOptions:
        """OptCNN's space (divisors, no cutoff); in PaSE's space, its CNN cutoff of 4."""
        space = space or "optcnn"
        product = product or "divides"
        if cutoff in (None, "auto"):
            cutoff = 4 if space == "pase" and any(k.startswith("conv") for k in lg.kinds) else 1
        return SpaceOptions(space, product, int(cutoff), mapping or "linear")

    def table_meta(self) -> dict[str, Any]:
        """What :class:`algorithms.layer_tables.LayerCostTables` records of the build."""
        return self.transfers.meta()

    def objective_extras(self, objective_s: float) -> dict[str, Any]:
        """Nothing beyond seconds."""
        return {}

    # ------------------------------------------------------------------ node costs
    def node_costs(self, grids: Sequence[ShardGrid]) -> list[dict[str, np.ndarray]]:
        """t_C, t_S and t_R of every config of each grid's node, in seconds."""
        lg = self.lg
        t_c = self.compute_times(grids)
        sync_nb: list[np.ndarray | None] = []
        sync_keys: list[np.ndarray] = []
        red_nb: list[np.ndarray | None] = []
        red_keys: list[np.ndarray] = []
        for g in grids:
            v = g.node
            pk, P, outk, split, part = self.shard_shares(g, param_dim_names(lg, v))
            # t_S: replica groups over the dims that do not index the weights, each syncing its 1/P
            sb = float(self.sync[v])
            sync_nb.append(sb / P if sb > 0 else None)
            sync_keys.append(pk)
            # t_R: a REDUCTION split's partial sums, completed per output part
            red_nb.append(None if split is None else np.where(split, float(lg.out_bytes[v]) * part, 0.0))
            red_keys.append(outk)
        t_s = self.max_group_allreduce(grids, sync_keys, sync_nb)
        t_r = self.max_group_allreduce(grids, red_keys, red_nb)
        return [{"t_C": a, "t_S": b, "t_R": c} for a, b, c in zip(t_c, t_s, t_r)]

    def shard_shares(self, g: ShardGrid, pdims: frozenset[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """Per config of ``g``: the positions of the weight-indexing dims ``pdims`` and the parts
        P the weights are split into; the positions of the OUTPUT dims, which configs split a
        REDUCTION dim (None if none does) and the fraction of the output a part is. Cached
        per grid key."""
        ck = (g.key, pdims) if g.key else None
        hit = self.share_cache.get(ck) if ck is not None else None
        if hit is not None:
            return hit
        pk = np.array([k for k, d in enumerate(g.dims) if d in pdims], dtype=np.int64)
        P = np.prod(g.degrees[:, pk], axis=1) if len(pk) else np.ones(g.num_configs, dtype=np.int64)
        red = g.roles == REDUCTION
        outk = np.flatnonzero(g.roles == OUTPUT)
        split = (g.degrees[:, red] > 1).any(axis=1) if red.any() else None
        if split is not None and not split.any():
            split = None
        part = np.ones(g.num_configs)
        if split is not None and len(outk):
            osizes = np.array([self.lg.dims[g.node].get(g.dims[k], 1) for k in outk], dtype=np.float64)
            part = np.prod(np.ceil(osizes / g.degrees[:, outk]) / osizes, axis=1)
        hit = (pk, P, outk, split, part)
        if ck is not None:
            self.share_cache[ck] = hit
        return hit

    def slowest_fraction(self, g: ShardGrid) -> np.ndarray:
        """Per config, the largest fraction of the node's domain a shard covers (REPLICATED
        dims do the whole of it)."""
        hit = self.frac_cache.get(g.key) if g.key else None
        if hit is not None:
            return hit
        sizes = np.array([self.lg.dims[g.node].get(d, 1) for d in g.dims], dtype=np.float64)
        split = g.roles != REPLICATED
        if len(sizes):
            frac_s = np.prod(np.where(split[None, None, :], (g.hi - g.lo) / sizes[None, None, :], 1.0), axis=2)
        else:
            frac_s = np.ones(g.valid.shape)
        frac = np.where(g.valid, frac_s, 0.0).max(axis=1)
        if g.key:
            self.frac_cache[g.key] = frac
        return frac

    def compute_times(self, grids: Sequence[ShardGrid]) -> list[np.ndarray]:
        """t_C of every config of each grid: one :meth:`CostModel.layer_times` call per device
        kind for all of them; on a mixed cluster, the slowest kind a config's shards use."""
        counts = [g.num_configs for g in grids]
        if not grids:
            return []
        frac = np.concatenate([self.slowest_fraction(g) for g in grids])
        nodes = np.repeat(np.array([g.node for g in grids], dtype=np.int64), counts)
        if len(self.kinds) == 1:
            f, b = self.costs.layer_times(self.lg, next(iter(self.kinds.values())), frac, nodes=nodes)
            t = f + b
        else:
            t = np.zeros(len(frac))
            for k, rep in enumerate(self.kinds.values()):
                uses = np.concatenate([((self.kind_of[np.maximum(g.devices, 0)] == k) & (g.devices >= 0)).any(axis=1) for g in grids])
                f, b = self.costs.layer_times(self.lg, rep, frac, nodes=nodes)
                t = np.maximum(t, np.where(uses, f + b, 0.0))
        return np.split(t, np.cumsum(counts)[:-1])

    def replica_groups(self, g: ShardGrid, keydims: np.ndarray) -> dict[tuple[int, ...], np.ndarray]:
        """The groups of shards with equal coordinates on the dims ``keydims`` (positions in
        ``g.dims``), as ``{devices of the group: the configs that have it}``; groups of one
        shard are left out. Cached per grid layout, and per config by its degrees and devices."""
        ck = (g.layout, keydims.tobytes()) if g.layout else None
        hit = self.group_cache.get(ck) if ck is not None else None
        if hit is not None:
            return hit
        out: dict[tuple[int, ...], list[int]] = {}
        kd = tuple(int(k) for k in keydims)
        for c in range(g.num_configs):
            s = int(g.nshards[c])
            if s <= 1:
                continue
            deg = tuple(int(x) for x in g.degrees[c])
            devs = tuple(int(x) for x in g.devices[c, :s])
            for grp in self.config_groups(deg, kd, devs):
                out.setdefault(grp, []).append(c)
        res = {devs: np.array(cs, dtype=np.int64) for devs, cs in out.items()}
        if ck is not None:
            self.group_cache[ck] = res
        return res

    def config_groups(self, deg: tuple[int, ...], keydims: tuple[int, ...], devs: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The devices of each group of more than one shard of the config with degrees ``deg``
        whose shards (row-major over the dims) run on ``devs``, grouped by their coordinates on
        ``keydims``; memoised."""
        ck = (deg, keydims, devs)
        hit = self.config_group_cache.get(ck)
        if hit is None:
            s = len(devs)
            if keydims and int(np.prod([deg[k] for k in keydims])) == s:
                hit = ()  # every shard its own group
            else:
                coords = np.stack(np.unravel_index(np.arange(s), deg), axis=1) if deg else np.zeros((s, 0), dtype=np.int64)
                radix = np.ones(len(keydims), dtype=np.int64)
                for i in range(len(keydims) - 2, -1, -1):
                    radix[i] = radix[i + 1] * deg[keydims[i + 1]]
                gid = coords[:, list(keydims)] @ radix if keydims else np.zeros(s, dtype=np.int64)
                arr = np.asarray(devs)
                groups = (tuple(int(x) for x in arr[gid == k]) for k in sorted(set(gid.tolist())))
                hit = tuple(grp for grp in groups if len(grp) > 1)
            self.config_group_cache[ck] = hit
        return hit

    def max_group_allreduce(self, grids: Sequence[ShardGrid], keydims: list[np.ndarray],
                            nbytes: list[np.ndarray | None]) -> list[np.ndarray]:
        """Per grid and config c: the slowest all-reduce of ``nbytes[i][c]`` among the groups of
        config c's shards with equal coordinates on ``keydims[i]`` (0 where ``nbytes[i]`` is
        None). Grids with one key are taken together, and every all-reduce over one group of
        devices is a single call of the cost model."""
        counts = [g.num_configs for g in grids]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        together: dict[tuple, list[int]] = {}
        for i, g in enumerate(grids):
            if nbytes[i] is not None:
                together.setdefault((g.layout or id(g), keydims[i].tobytes()), []).append(i)
        requests: dict[tuple[int, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
        for members in together.values():
            first = grids[members[0]]
            base = offsets[members]
            nb = np.stack([nbytes[i] for i in members])  # type: ignore[misc]
            for devs, cs in self.replica_groups(first, keydims[members[0]]).items():
                requests.setdefault(devs, []).append(((base[:, None] + cs[None, :]).reshape(-1), nb[:, cs].reshape(-1)))
        out = np.zeros(int(offsets[-1]))
        for devs, parts in requests.items():
            idx = np.concatenate([p[0] for p in parts])
            nb_all = np.concatenate([p[1] for p in parts])
            np.maximum.at(out, idx, np.asarray(self.costs.allreduce_time(nb_all, devs), dtype=np.float64))
        return np.split(out, offsets[1:-1])

    # ------------------------------------------------------------------ edge costs
    def edge_costs(self, grids: Sequence[ShardGrid], progress: Callable[[int], Any] | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """t_X of every edge for every config pair and the bytes it moves forward (``[Cu, Cv]``
        each): :meth:`algorithms.layer_transfers.TransferCosts.tables`."""
        return self.transfers.tables(grids, progress)
