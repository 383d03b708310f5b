"""PaSE's cost functions of a layer graph's configurations (``costs=pase``): t_V per node and
t_E per edge of :class:`harness.core.pase_costs.PaseCostModel`, in FLOPs divided by its peak FLOP/s
so that the tables hold seconds like OptCNN's (:mod:`algorithms.layer_optcnn_costs`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from algorithms.layer_configs import SpaceOptions
from harness.core.cluster import Cluster
from harness.core.layer_shards import ShardGrid
from harness.core.layergraph import LayerGraph
from harness.core.pase_costs import PaseCostModel


class PaseLayerCosts:
    """t_V per node and t_E per edge of one (layer graph, PaSE cost model)."""

    #: ``LayerCostTables.model``
    model = "pase"
    #: the edge part's key in :func:`algorithms.layer_costs.evaluate`
    edge_part = "t_E"

    def __init__(self, lg: LayerGraph, cluster: Cluster, costs: PaseCostModel) -> None:
        self.lg = lg
        self.cluster = cluster
        self.costs = costs
        #: edges PaSE's graph drops: of several edges between one pair of layers, only the last
        #: input port's is kept (its public code stores edges in a networkx DiGraph)
        self.shadowed = np.zeros(lg.num_edges, dtype=bool)
        if costs.parallel_edges == "last":
            last: dict[tuple[int, int], int] = {}
            for e in np.lexsort((lg.dst_port, lg.dst, lg.src)).tolist():
                key = (int(lg.src[e]), int(lg.dst[e]))
                if key in last:
                    self.shadowed[last[key]] = True
                last[key] = e

    @classmethod
    def default_options(cls, lg: LayerGraph, costs: PaseCostModel, space: str | None, product: str | None,
                        cutoff: int | str | None, mapping: str | None) -> SpaceOptions:
        """PaSE's space: its iteration domains, the cost model's product and cutoff (4 for CNNs, 1 else)."""
        space = space or "pase"
        product = product or costs.product
        if cutoff in (None, "auto"):
            cutoff = costs.cutoff_for(lg)
        return SpaceOptions(space, product, int(cutoff), mapping or "linear")

    def table_meta(self) -> dict[str, Any]:
        """What :class:`algorithms.layer_tables.LayerCostTables` records of the build: the FLOP
        rate that turns its seconds back into PaSE's FLOPs, and FLOPs per word."""
        return {"edge_cache_entries": 0, "peak_flops": self.costs.peak_flops, "r": self.costs.r}

    def objective_extras(self, objective_s: float) -> dict[str, Any]:
        """The objective in PaSE's own unit, FLOPs."""
        return {"objective_flops": objective_s * self.costs.peak_flops}

    def node_costs(self, grids: Sequence[ShardGrid]) -> list[dict[str, np.ndarray]]:
        """t_V of every config of each grid's node, in seconds."""
        peak = self.costs.peak_flops
        return [{"t_V": self.costs.vertex_flops(self.lg, g.node, g.dims, g.degrees) / peak} for g in grids]

    def edge_costs(self, grids: Sequence[ShardGrid], progress: Callable[[int], Any] | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """t_E of every edge for every config pair and its words x 8 (bytes), ``[Cu, Cv]`` each,
        telling ``progress(1)`` after each. An edge from an input costs nothing (PaSE's graphs
        have no such edge), nor does one PaSE's graph drops (``costs.parallel_edges``)."""
        lg = self.lg
        t_out, b_out = [], []
        for e in range(lg.num_edges):
            gu, gv = grids[int(lg.src[e])], grids[int(lg.dst[e])]
            if lg.kinds[int(lg.src[e])] == "input" or self.shadowed[e]:
                t_out.append(np.zeros((gu.num_configs, gv.num_configs)))
                b_out.append(np.zeros((gu.num_configs, gv.num_configs)))
                continue
            fl = self.costs.edge_flops(lg, e, gu.dims, gu.degrees, gv.dims, gv.degrees)
            t_out.append(fl / self.costs.peak_flops)
            b_out.append(fl / self.costs.r * 8.0)
            if progress is not None:
                progress(1)
        return t_out, b_out
