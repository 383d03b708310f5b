"""Issue 32: what a job's result row must satisfy (:mod:`harness.app.result_checks`).

* A NaN or an infinity never becomes a result: a non-finite figure anywhere in the row is one
  line naming it, and no result.json is written (the plan's strategy.json stays).
* A layer-graph search promises a plan no worse than the baselines of its space in its own
  objective; when the simulated step says otherwise the row and the summary say so, with the
  numbers (a small case made with a monkeypatched plan: objective and simulation disagree).
* OptCNN on a batch smaller than the device count searches only splits the batch can take
  (issue 32: "config [sample=8] splits sample (size 4) 8 ways")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from algorithms.layer_fixed import layer_strategy, model_parallel_dims
from harness.app.compose import compose
from harness.app.result_checks import TOLERANCE, ResultError, baseline_check, check_finite, first_non_finite
from harness.app.run import run
from harness.app.summary import format_summary
from harness.core.strategy import Plan
from simulators.simulate import EventSimulator, SimResult
from tests.helpers import refused, run_harness


class NaNSimulator(EventSimulator):
    """The event simulator with a step time of NaN (what a bug, or a figure beyond float64, gives)."""

    def __call__(self, graph: Any, strategy: Any, cluster: Any, costs: Any) -> SimResult:
        res = super().__call__(graph, strategy, cluster, costs)
        res.step_time_s = math.nan
        return res


# ---------------------------------------------------------------------------- finite figures
@pytest.mark.parametrize("row, path", [
    ({"step_time_s": math.nan}, "step_time_s"),
    ({"a": 1, "algo_info": {"x": [1.0, math.inf]}}, "algo_info.x[1]"),
    ({"b": {"c": -math.inf}}, "b.c"),
])
def test_a_non_finite_figure_is_found_by_its_path(row: dict[str, Any], path: str) -> None:
    assert first_non_finite(row)[0] == path
    refused(lambda: check_finite({"model": "m", "algo": "a", "cluster": "c", **row}), f"the result's {path} is", "no result.json",
            kind=ResultError)


def test_finite_rows_none_and_strings_pass() -> None:
    check_finite({"step_time_s": 1.0, "x": None, "y": "nan", "z": [1, 2.5, {"w": 0.0}], "ok": True})


def test_a_nan_step_writes_no_result(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_harness("model=lenet5", "algo=single_device", "sim._target_=tests.test_result_checks.NaNSimulator",
                    "output.worth=false", f"hydra.run.dir={out}", timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "the result's step_time_s is nan" in last and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (out / "result.json").exists() and (out / "strategy.json").exists()


# ---------------------------------------------------------------------------- a search against its baselines
def test_no_objectives_no_check() -> None:
    assert baseline_check(None, None, None, 1.0, {"objective_s": 1.0}) == {}


def test_a_plan_no_slower_than_its_baselines_is_not_flagged() -> None:
    info = {"baseline_objectives_s": {"data_parallel": 2.0}, "objective_s": 1.0, "mapping": "linear"}
    out = baseline_check(None, None, None, 1.0, info, {"data_parallel": 1.0})
    assert out == {"baseline_steps_s": {"data_parallel": 1.0}}


def test_a_plan_slower_than_a_baseline_it_ranks_worse_is_flagged_with_the_numbers() -> None:
    info = {"baseline_objectives_s": {"data_parallel": 2.0}, "objective_s": 1.0, "mapping": "linear"}
    out = baseline_check(None, None, None, 3.0, info, {"data_parallel": 2.4})
    d = out["objective_disagrees_with_simulation"]
    assert d["baseline"] == "data_parallel" and d["baseline_step_s"] == 2.4 and d["step_time_s"] == 3.0
    assert d["slower_than_baseline"] == pytest.approx(0.25)
    (w,) = out["warnings"]
    assert "25.0% slower than data_parallel" in w and "50.0% lower" in w and "disagree" in w


def test_a_search_beaten_in_simulation_says_so_in_the_row_and_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    import algorithms.optcnn as optcnn

    search = optcnn.OptCNN.plan

    def worse(self: Any, graph: Any, cluster: Any, costs: Any) -> Plan:
        """OptCNN's info (its objective, its baselines' objectives) with a plan that mixes splits
        layer by layer: what a search whose cost model misjudges transfers could return."""
        plan = search(self, graph, cluster, costs)
        n = cluster.num_devices
        mp = model_parallel_dims(graph, n)
        dims = [{} if graph.kinds[v] == "input" else {"sample": n} if v % 2 else mp[v] for v in range(graph.num_nodes)]
        return Plan(graph, layer_strategy(graph, dims, n, "linear"), info=plan.info)

    monkeypatch.setattr(optcnn.OptCNN, "plan", worse)
    row = run(compose(["model=lenet5", "algo=optcnn", "cluster=p100x4"])).row
    steps = row["baseline_steps_s"]
    assert set(steps) == set(row["algo_info"]["baseline_objectives_s"]) == {"data_parallel", "owt"}
    assert steps["data_parallel"] == row["data_parallel_step_s"]
    d = row["objective_disagrees_with_simulation"]
    assert row["step_time_s"] > d["baseline_step_s"] == min(steps.values())
    assert d["objective_s"] <= d["baseline_objective_s"]  # its own objective ranks the plan no worse
    assert any("slower than" in w for w in row["warnings"])
    assert "WARNING" in format_summary(row)


def test_the_real_search_on_lenet5_is_flagged_exactly_when_a_baseline_simulates_faster() -> None:
    """OptCNN's objective (no overlap of the gradient all-reduces, Eq. 2) and the event simulator
    (all-reduces overlapped with the backward) may rank its plan and data parallelism differently:
    the row says so exactly when a baseline simulates faster beyond the tolerance, and then the
    plan's objective is no higher (the search's candidates include the baselines)."""
    row = run(compose(["model=lenet5", "algo=optcnn", "cluster=p100x4"])).row
    steps = row["baseline_steps_s"]
    beaten = row["step_time_s"] > min(steps.values()) * (1 + TOLERANCE)
    assert ("objective_disagrees_with_simulation" in row) == beaten == ("warnings" in row)
    if beaten:
        d = row["objective_disagrees_with_simulation"]
        assert d["baseline_step_s"] == min(steps.values()) and d["objective_s"] <= d["baseline_objective_s"]
        assert "the search's cost model and the simulator disagree" in row["warnings"][0]
    json.dumps(row, allow_nan=False)


# ---------------------------------------------------------------------------- a batch smaller than the devices
def test_optcnn_on_a_batch_smaller_than_the_device_count_runs() -> None:
    res = run(compose(["model=lenet5", "model.batch_size=2", "algo=optcnn", "cluster=p100x4"]))
    g, s = res.plan.graph, res.plan.strategy
    for v in range(g.num_nodes):
        cfg = s.config_of(v)
        for name, degree in (cfg.dims if cfg is not None else ()):
            assert degree <= g.dims[v][name], (g.names[v], cfg)
    row = res.row
    assert row["data_parallel_step_s"] is None  # data parallelism cannot split a batch of 2 four ways
    assert "data_parallel" not in row["algo_info"]["baseline_objectives_s"]
    assert np.isfinite(row["step_time_s"])
