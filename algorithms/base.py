"""What every algorithm is: a callable from (graph, cluster, costs) to a :class:`Plan`.

An algorithm is registered by a file ``conf/algo/<name>.yaml`` whose ``_target_`` names
its class; the list of algorithms is the list of those files.  Every key of that file is a
parameter of the class's ``__init__``, which lists its parameters explicitly (no ``**kwargs``:
a misspelt key is refused when the job builds the algorithm) and checks each value's type and
range with :mod:`harness.core.checks` as it takes it, naming the key as the user types it
(``algo.budget_s must be > 0, got nan``): NaN, infinity, a negative count, a string where a
number or a boolean belongs never reach a search.  ``graph_kind`` (declared by
every concrete class) says which graph the harness hands it: the operator graph (``"op"``),
the layer graph (``"layer"``) or the stack graph (``"stack"``: a model as a chain of
pipeline-partitionable units, :mod:`harness.core.llm.stack`; its plan's strategy is a
:class:`~harness.core.llm.plan.ParallelPlan`).  An algorithm that plans on several kinds
declares ``graph_kinds``, in order of preference (``("op", "stack")``); the harness hands it
the first kind the model gives (``harness.app.run.pick_graph_kind``); by default
``graph_kinds`` is ``(graph_kind,)``.  Algorithms see the graph, the cluster and a cost oracle,
never the simulator (HRL excepted: its paper trains on measured runs, see
:mod:`algorithms.hrl`).  ``paper``, ``paper_claim`` and ``findings`` (class attributes,
empty for a baseline) say where an algorithm comes from and where this repository's findings
about it are: a job's summary quotes them when its plan is slower than one device.

The contract of a subclass::

    class MyAlgo(Algorithm):
        graph_kind = "op"

        def __init__(self, name: str = "my_algo", seed: int = 0, alpha: float = 1.0) -> None:
            super().__init__(name, seed)
            self.alpha = positive_number(alpha, "algo.alpha")

        def describe(self) -> dict[str, Any]:
            return {**super().describe(), "alpha": self.alpha}
"""

from __future__ import annotations

from typing import Any

from harness.core.checks import non_negative_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan


class Algorithm:
    """Base class: subclasses declare ``graph_kind``, take their parameters explicitly,
    implement :meth:`plan` and extend :meth:`describe` with their parameters.  The seed (the
    config's ``seed``) is an integer >= 0, as numpy's generators take it."""

    graph_kind: str
    #: the paper the algorithm comes from, as the job's summary cites it ("" for a baseline)
    paper: str = ""
    #: what that paper claims for the algorithm, a clause the summary quotes after "claims"
    paper_claim: str = ""
    #: the results README with this repository's findings about it ("" when none)
    findings: str = ""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = str(name)
        self.seed = non_negative_int(seed, "seed")

    @property
    def graph_kinds(self) -> tuple[str, ...]:
        """The graph kinds the algorithm plans on, in order of preference (see the module docstring)."""
        return (self.graph_kind,)

    def plan(self, graph: Any, cluster: Cluster, costs: CostModel) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def about(self) -> dict[str, str]:
        """Where the algorithm comes from and where its findings are (:attr:`paper`,
        :attr:`paper_claim`, :attr:`findings`), for the job's summary."""
        return {"paper": self.paper, "paper_claim": self.paper_claim, "findings": self.findings}

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
