"""What a job's result row must satisfy before it is written, and what it must say.

* :func:`check_finite`: a NaN or an infinity never becomes a result.  A non-finite figure
  anywhere in the row (``step_time_s``, a nested ``algo_info`` entry, ...) is a
  :class:`ResultError` naming the key; the job then writes no ``result.json`` (its
  ``strategy.json``, written as soon as the plan exists, stays).
* :func:`baseline_check`: a layer-graph search (OptCNN, its DFS, PaSE, FlexFlow's MCMC)
  promises a plan no worse than the baselines of its space (data parallelism, OWT) *in its own
  objective*, and reports their objectives (``baseline_objectives_s`` in ``Plan.info``).  The
  user sees the simulated step, so the promise is checked there: each such baseline is
  simulated with the job's cluster and cost model, its step goes into ``baseline_steps_s``, and
  when the plan's simulated step is slower than one of them the row carries
  ``objective_disagrees_with_simulation`` (the numbers) and a line in ``warnings`` that the
  summary prints, saying by how much.
* :func:`source_warnings`: what a graph source flags about its graph (a graph file without a
  parameter table, ...), copied into ``warnings``.
"""

from __future__ import annotations

import math
from typing import Any

from harness.app.summary import format_seconds
from harness.core.errors import UserError

#: the relative margin by which a plan's simulated step may exceed a baseline's before it is
#: flagged (the same strategy simulates to the same step; this absorbs float summation order)
TOLERANCE = 1e-9


class ResultError(UserError, ValueError):
    """A result figure is not a finite number: the job writes no result.json."""


def first_non_finite(x: Any, path: str = "") -> tuple[str, float] | None:
    """The first (dotted path, value) in ``x`` (nested dicts and lists) that is a float NaN or
    infinity, else None."""
    if isinstance(x, float):
        return None if math.isfinite(x) else (path, x)
    if isinstance(x, dict):
        items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in x.items())
    elif isinstance(x, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(x))
    else:
        return None
    for p, v in items:
        hit = first_non_finite(v, p)
        if hit is not None:
            return hit
    return None


def check_finite(row: dict[str, Any]) -> None:
    """Raise a :class:`ResultError` naming the first figure of ``row`` that is NaN or infinite."""
    hit = first_non_finite(row)
    if hit is not None:
        path, value = hit
        raise ResultError(f"the result's {path} is {value!r}, not a finite number: no result.json is written for "
                          f"{row.get('model', '?')} / {row.get('algo', '?')} on {row.get('cluster', '?')} (the plan is in "
                          "strategy.json); an input figure too large to compute with, or a bug to report")


def baseline_check(graph: Any, cluster: Any, costs: Any, step_s: float, info: dict[str, Any],
                   known_steps: dict[str, float] | None = None) -> dict[str, Any]:
    """The row keys of :func:`baseline_steps`' comparison (see the module docstring); nothing
    for a plan whose info names no baseline objectives.  ``known_steps`` are baseline steps the
    job already simulated (data parallelism's, by :mod:`harness.app.worth`)."""
    objectives = info.get("baseline_objectives_s")
    if not isinstance(objectives, dict) or not objectives:
        return {}
    mapping = str(info.get("mapping", "linear"))
    known = (known_steps or {}) if mapping == "linear" else {}  # worth's data parallelism maps shards linearly
    steps = baseline_steps(graph, cluster, costs, list(objectives), mapping, known)
    out: dict[str, Any] = {"baseline_steps_s": steps}
    worse = {b: s for b, s in steps.items() if step_s > s * (1 + TOLERANCE)}
    if worse:
        name = min(worse, key=worse.__getitem__)
        base_step, base_obj, obj = worse[name], float(objectives[name]), info.get("objective_s")
        slower = step_s / base_step - 1.0
        out["objective_disagrees_with_simulation"] = {
            "baseline": name, "baseline_objective_s": base_obj, "baseline_step_s": base_step,
            "objective_s": obj, "step_time_s": step_s, "slower_than_baseline": slower}
        head = f"search objective {format_seconds(obj)} vs simulated {format_seconds(step_s)}; " if isinstance(obj, (int, float)) else ""
        if isinstance(obj, (int, float)) and obj <= base_obj:
            why = (f"although its objective is {100 * (1 - obj / base_obj):.1f}% lower: the search's cost model and the "
                   "simulator disagree" if base_obj > 0 else "although its objective is no higher")
        else:
            why = "and its objective is higher too: the search did not reach the baseline (a budget ran out?)"
        out["warnings"] = [f"{head}baseline {name}: objective {format_seconds(base_obj)} vs simulated {format_seconds(base_step)}. "
                           f"The plan simulates {100 * slower:.1f}% slower than {name} {why}"]
    return out


def baseline_steps(graph: Any, cluster: Any, costs: Any, names: list[str], mapping: str,
                   known: dict[str, float]) -> dict[str, float]:
    """The simulated step of each named baseline (:data:`algorithms.layer_fixed.SEEDS`) on the
    layer graph, shards mapped by ``mapping``; ``known`` steps are taken as they are."""
    from algorithms.layer_fixed import SEEDS, layer_strategy
    from simulators.simulate import simulate

    out: dict[str, float] = {}
    for name in names:
        if name in known and known[name] is not None:
            out[name] = float(known[name])
            continue
        strategy = layer_strategy(graph, SEEDS[name](graph, cluster.num_devices), cluster.num_devices, mapping, algo=name)
        out[name] = float(simulate(graph, strategy, cluster, costs).step_time_s)
    return out


def source_warnings(source: Any) -> list[str]:
    """What the graph source flags about its graph (``warnings``, e.g. a graph file without a
    parameter table: data parallelism then has no gradient all-reduce)."""
    return [str(w) for w in getattr(source, "warnings", ()) or ()]
