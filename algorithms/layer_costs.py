"""Costs of a layer graph's configurations: which cost model fills the tables, and the
own-objective evaluation of a fixed strategy.

Two cost models, one protocol (:class:`LayerCostModel`):

* OptCNN's Eq. 1 under every time cost model (``costs=analytical``, ``profiled``,
  ``calibrated``): t_C + t_S (+ t_R) per node, t_X per edge, in seconds
  (:class:`algorithms.layer_optcnn_costs.OptCNNLayerCosts`);
* PaSE's t_V + t_E under ``costs=pase`` (:class:`harness.core.pase_costs.PaseCostModel`), in
  FLOPs divided by its peak FLOP/s (:class:`algorithms.layer_pase_costs.PaseLayerCosts`).

The choice is made in one place, :func:`layer_cost_class`, by the cost model's class. It also
sets the configuration space a search takes when it does not name one
(:func:`resolve_options`): PaSE's under ``costs=pase``, OptCNN's otherwise.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from algorithms.layer_configs import SpaceOptions
from algorithms.layer_optcnn_costs import OptCNNLayerCosts
from algorithms.layer_pase_costs import PaseLayerCosts
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layer_shards import ShardGrid, make_grid, strategy_rows
from harness.core.layergraph import LayerGraph
from harness.core.pase_costs import PaseCostModel
from harness.core.strategy import Strategy


class LayerCostModel(Protocol):
    """Node cost vectors and edge cost matrices of one (layer graph, cluster, cost model), for
    every configuration of a :class:`harness.core.layer_shards.ShardGrid` at once, in seconds."""

    #: ``LayerCostTables.model``: ``"analytical"`` (OptCNN Eq. 1) or ``"pase"`` (t_V + t_E)
    model: str
    #: the key of the summed edge costs in :func:`evaluate`: ``"t_X"`` or ``"t_E"``
    edge_part: str

    def node_costs(self, grids: Sequence[ShardGrid]) -> list[dict[str, np.ndarray]]:
        """Per grid, the parts of its node's cost (t_C, t_S, t_R; or t_V), each ``[C]``; the node
        cost is their sum. All nodes in one call, so that a model can batch them."""
        ...

    def edge_costs(self, grids: Sequence[ShardGrid], progress: Callable[[int], Any] | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per edge, ``(seconds, bytes moved forward)`` for every config pair: ``[Cu, Cv]`` each.
        All edges in one call, so that a model can batch them; ``progress(n)`` is told as n
        more edges are done."""
        ...

    def table_meta(self) -> dict[str, Any]:
        """``LayerCostTables.meta`` of tables built with this model."""
        ...

    def objective_extras(self, objective_s: float) -> dict[str, Any]:
        """What :func:`evaluate` reports beyond seconds (PaSE: the objective in FLOPs)."""
        ...


def layer_cost_class(costs: CostModel) -> type[OptCNNLayerCosts] | type[PaseLayerCosts]:
    """The cost model of the layer tables: PaSE's t_V + t_E for a :class:`PaseCostModel`
    (``costs=pase``), OptCNN's Eq. 1 with ``costs``' times for every other cost model."""
    return PaseLayerCosts if isinstance(costs, PaseCostModel) else OptCNNLayerCosts


def layer_cost_model(lg: LayerGraph, cluster: Cluster, costs: CostModel) -> LayerCostModel:
    """:func:`layer_cost_class`'s model bound to one problem (fresh caches)."""
    return layer_cost_class(costs)(lg, cluster, costs)


def resolve_options(lg: LayerGraph, costs: CostModel, space: str | None = None, product: str | None = None,
                    cutoff: int | str | None = None, mapping: str | None = None) -> SpaceOptions:
    """Fill ``None`` options from the cost model: PaSE's space, product and cutoff under
    ``costs=pase``, OptCNN's (divisors, no cutoff) otherwise."""
    return layer_cost_class(costs).default_options(lg, costs, space, product, cutoff, mapping)


def evaluate(lg: LayerGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> dict[str, Any]:
    """The strategy's own-objective evaluation (OptCNN Eq. 1 / PaSE t_V + t_E), with the same
    cost functions as the tables but for the strategy's explicit configs and devices (so a
    fixed strategy outside a search space, e.g. DP at a degree PaSE's cutoff forbids, is
    still evaluated). Returns ``objective_s``, the sums of each part and ``moved_bytes``."""
    strategy.validate(lg, cluster.num_devices)
    model = layer_cost_model(lg, cluster, costs)
    dims, degs, devs = strategy_rows(lg, strategy, cluster.num_devices)
    grids = [make_grid(lg, v, dims[v], degs[v], devs[v]) for v in range(lg.num_nodes)]
    out: dict[str, Any] = {}
    total = 0.0
    for parts in model.node_costs(grids):
        for k, arr in parts.items():
            out[k] = out.get(k, 0.0) + float(arr[0])
            total += float(arr[0])
    times, nbytes = model.edge_costs(grids)
    tx = sum(float(t[0, 0]) for t in times)
    moved = sum(float(b[0, 0]) for b in nbytes)
    out[model.edge_part] = tx
    out["objective_s"] = total + tx
    out["moved_bytes"] = moved
    out.update(model.objective_extras(out["objective_s"]))
    return out
