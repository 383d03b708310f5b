"""The base of the searches over a layer graph's configurations (OptCNN, its DFS baseline,
PaSE, FlexFlow's MCMC): the space options they share, their cost tables and what their plans
report."""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.layer_configs import PRODUCTS, SPACES, SpaceOptions
from algorithms.layer_costs import resolve_options
from algorithms.layer_fixed import SEEDS
from algorithms.layer_tables import LayerCostTables, cached_tables, seed_strategies
from harness.core.checks import boolean, one_of, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layer_shards import MAPPINGS
from harness.core.layergraph import LayerGraph


class LayerSearch(Algorithm):
    """Base of the searches over a layer graph's configurations (``graph_kind = "layer"``).

    Parameters shared by every search (``None`` takes the cost model's default, see
    :func:`algorithms.layer_costs.resolve_options`): ``space`` (optcnn | pase), ``product``
    (divides | at_most), ``cutoff`` (PaSE's minimum per-processor size of a split dim),
    ``mapping`` (linear | spread: the device of shard k); ``progress`` shows a bar while the
    edge tables are filled (not a parameter of the result).
    """

    graph_kind = "layer"

    def __init__(self, name: str, seed: int = 0, space: str | None = None, product: str | None = None,
                 cutoff: int | str | None = None, mapping: str | None = None, progress: bool = False) -> None:
        super().__init__(name, seed)
        self.space = one_of(space, "algo.space", (None, *SPACES))
        self.product = one_of(product, "algo.product", (None, *PRODUCTS))
        self.cutoff = cutoff if cutoff in (None, "auto") else positive_int(cutoff, "algo.cutoff")
        self.mapping = one_of(mapping, "algo.mapping", (None, *MAPPINGS))
        self.progress = boolean(progress, "algo.progress")

    def describe(self) -> dict[str, Any]:
        """The name, the seed and the space options as configured (``None``: the cost model's)."""
        return {**super().describe(), "space": self.space, "product": self.product, "cutoff": self.cutoff,
                "mapping": self.mapping}

    def options(self, lg: LayerGraph, costs: CostModel) -> SpaceOptions:
        """The configuration space of this search on ``lg`` under ``costs``."""
        return resolve_options(lg, costs, self.space, self.product, self.cutoff, self.mapping)

    def tables(self, lg: LayerGraph, cluster: Cluster, costs: CostModel) -> LayerCostTables:
        """The cost tables of the problem (built once per graph, cluster, cost model and space)."""
        if not isinstance(lg, LayerGraph):
            raise TypeError(f"{self.name} searches a LayerGraph (graph_kind 'layer'), got {type(lg).__name__}")
        return cached_tables(lg, cluster, costs, self.options(lg, costs), self.progress)

    def info(self, tables: LayerCostTables, idx: np.ndarray, search_s: float, complete: bool, **extra: Any) -> dict[str, Any]:
        """``Plan.info``: the objective, completeness and what the search reports, with the
        objective of each baseline in its space (``baseline_objectives_s``): the search promises a
        plan no worse than those in its own objective, and the app ring checks the promise in the
        simulated step (:mod:`harness.app.result_checks`)."""
        obj = tables.objective(idx)
        out = {
            "objective_s": obj,
            "search_complete": bool(complete),
            "search_s": search_s,
            "tables_s": tables.build_seconds,
            "cost_model": tables.model,
            "space": tables.options.space,
            "product": tables.options.product,
            "cutoff": tables.options.cutoff,
            "mapping": tables.options.mapping,
            "configs_total": int(tables.num_configs.sum()),
            "configs_max": int(tables.num_configs.max()),
            "moved_bytes_fwd": tables.moved_bytes(idx),
            "baseline_objectives_s": {name: value for name, _, value in seed_strategies(tables, SEEDS)},
        }
        if tables.model == "pase":
            out["objective_flops"] = obj * float(tables.meta["peak_flops"])
        out.update(extra)
        return out
