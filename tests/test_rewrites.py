"""Every rewriting algorithm keeps the graph's total FLOPs and its dataflow.

Runs every operator-graph algorithm registered in conf/algo on a few small graphs.  When a
plan comes with ``origin`` (the algorithm returned a rewritten graph, e.g. FD-DPS's
splitting or a coarsening), it checks that

* the rewritten graph has the same total FLOPs as the input, and
* every edge u -> v of the input survives: some node that came from u reaches (or is) some
  node that came from v in the rewritten graph.

``origin`` is read as the Plan docstring defines it (``origin[i]`` = the input node that
node i of the rewritten graph came from, -1 for added nodes); a map the other way round
(one entry per *input* node naming its node in the rewritten graph) is accepted too, so
coarsening algorithms that record it that way are covered without changes here.
Algorithms with split thresholds (``min_time_ms``) run with the threshold at 0 so that
the rewrite actually happens on these small graphs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra.utils import instantiate

from experiments.common import needs_input
from harness.core.costs import AnalyticalCostModel
from harness.core.graph import BATCHED, OpGraph
from tests.helpers import make_cluster, make_graph

REPO = Path(__file__).resolve().parents[1]
ALGOS = sorted(p.stem for p in (REPO / "conf" / "algo").glob("*.yaml") if not needs_input(p.stem))  # but those replaying a file


def _algo(name: str):
    from harness.app.compose import compose

    cfg = compose([f"algo={name}"])
    over = {"min_time_ms": 0.0} if "min_time_ms" in cfg.algo else {}
    return instantiate(cfg.algo, seed=0, _convert_="all", **over)


@pytest.fixture(scope="module")
def graphs() -> dict[str, OpGraph]:
    from harness.core.capture import capture
    from tests.helpers import IMG, LABEL, Tiny

    chain = make_graph(8, [(i, i + 1) for i in range(7)] + [(0, 4), (2, 6)], flops=[3e10] * 8, nbytes=[10_000] * 9, role=BATCHED)
    chain.targets[:] = ["aten.convolution.default"] * 8
    chain.meta["batch_axis"] = [0] * 8
    chain.out_shapes = [[[8, 16, 4, 4]] for _ in range(8)]
    return {"tiny_cnn": capture(Tiny, IMG, LABEL, batch_size=8, name="tiny"), "conv_dag": chain}


def members_of(origin: np.ndarray, n_in: int, n_out: int) -> dict[int, set[int]]:
    """Input node -> the rewritten graph's nodes that came from it."""
    out: dict[int, set[int]] = {}
    if len(origin) == n_out:
        for i, o in enumerate(np.asarray(origin).tolist()):
            if o >= 0:
                out.setdefault(int(o), set()).add(i)
    elif len(origin) == n_in:
        for o, i in enumerate(np.asarray(origin).tolist()):
            if i >= 0:
                out.setdefault(o, set()).add(int(i))
    else:
        raise AssertionError(f"origin has {len(origin)} entries: neither the rewritten ({n_out}) nor the input ({n_in}) node count")
    return out


def reachable_from(g: OpGraph, start: set[int]) -> set[int]:
    ptr, succ, _ = g.succ_csr()
    seen, stack = set(start), list(start)
    while stack:
        v = stack.pop()
        for w in succ[ptr[v]:ptr[v + 1]].tolist():
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen


@pytest.mark.parametrize("name", ALGOS)
def test_rewrites_keep_flops_and_dataflow(name, graphs):
    spec = yaml.safe_load((REPO / "conf" / "algo" / f"{name}.yaml").read_text()) or {}
    algo = _algo(name)
    if getattr(algo, "graph_kind", "op") != "op":
        pytest.skip(f"{name} works on the layer graph")
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    for gname, g in graphs.items():
        plan = algo.plan(g, cl, costs)
        plan.strategy.validate(plan.graph, cl.num_devices)
        if plan.origin is None:
            assert plan.graph.num_nodes == g.num_nodes, f"{name} changed {gname} but gave no origin map"
            continue
        ng = plan.graph
        assert ng.flops.sum() == pytest.approx(g.flops.sum(), rel=1e-9), f"{name} on {gname}: total FLOPs changed"
        members = members_of(plan.origin, g.num_nodes, ng.num_nodes)
        missing = sorted(set(range(g.num_nodes)) - set(members))
        assert not missing, f"{name} on {gname}: input nodes {missing[:5]} have no node in the rewritten graph"
        for u, v in zip(g.src.tolist(), g.dst.tolist()):
            if members[u] & members[v]:
                continue  # both ends contracted into one node
            assert reachable_from(ng, members[u]) & members[v], (
                f"{name} on {gname}: edge {g.names[u]} -> {g.names[v]} is lost ({spec.get('_target_')})")
