"""What every algorithm is: a callable from (graph, cluster, costs) to a :class:`Plan`.

An algorithm is registered by a file ``conf/algo/<name>.yaml`` whose ``_target_`` names
its class; the list of algorithms is the list of those files.  Every key of that file is a
parameter of the class's ``__init__``, which lists its parameters explicitly (no ``**kwargs``:
a misspelt key is refused when the job builds the algorithm).  ``graph_kind`` (declared by
every concrete class) says which graph the harness hands it: the operator graph (``"op"``) or
the layer graph (``"layer"``).  Algorithms see the graph, the cluster and a cost oracle,
never the simulator (HRL excepted: its paper trains on measured runs, see
:mod:`algorithms.hrl`).

The contract of a subclass::

    class MyAlgo(Algorithm):
        graph_kind = "op"

        def __init__(self, name: str = "my_algo", seed: int = 0, alpha: float = 1.0) -> None:
            super().__init__(name, seed)
            self.alpha = alpha

        def describe(self) -> dict[str, Any]:
            return {**super().describe(), "alpha": self.alpha}
"""

from __future__ import annotations

from typing import Any

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan


class Algorithm:
    """Base class: subclasses declare ``graph_kind``, take their parameters explicitly,
    implement :meth:`plan` and extend :meth:`describe` with their parameters."""

    graph_kind: str

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.seed = int(seed)

    def plan(self, graph: Any, cluster: Cluster, costs: CostModel) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The algorithm's name, seed and parameters, as they go into result.json
        (``algo_params``); subclasses add their parameters to this dict."""
        return {"name": self.name, "seed": self.seed}


def derived_meta(graph: OpGraph, **extra: Any) -> dict[str, Any]:
    """``meta`` for a graph an algorithm derives from ``graph`` (a coarse graph, a split graph):
    the source's keys and ``extra``, without ``renumbered_from``.  That key is the old id of each
    node of the *source* graph when :meth:`OpGraph.from_unordered` renumbered it; carried over,
    it would claim the derived graph was renumbered too (and index its nodes with the source's
    permutation)."""
    meta = {k: v for k, v in graph.meta.items() if k != "renumbered_from"}
    meta.update(extra)
    return meta
