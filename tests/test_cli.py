"""End to end through ``python -m harness``: one run per algorithm, errors, sweeps, collector."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.common import needs_input
from harness.app.run import CONTRACT_KEYS
from tests.helpers import run_harness

REPO = Path(__file__).resolve().parents[1]
#: every registered algorithm but those that need an input (algo=from_file: algo.path), which
#: tests/test_strategy_replay.py runs with one
ALGOS = sorted(p.stem for p in (REPO / "conf" / "algo").glob("*.yaml") if not needs_input(p.stem))


@pytest.fixture(scope="module")
def every_algorithm(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One ``python -m harness -m`` sweep over every registered algorithm (one process: the
    basic launcher runs the jobs in turn, so the model is captured once)."""
    sweep = tmp_path_factory.mktemp("every_algorithm")
    r = run_harness("-m", "hydra/launcher=basic", f"algo={','.join(ALGOS)}", "model=lenet5", "cluster=p100x4",
                f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${algo.name}")
    return sweep, r


@pytest.mark.parametrize("algo", ALGOS)
def test_one_run_per_algorithm(algo, every_algorithm):
    sweep, r = every_algorithm
    out = sweep / algo
    assert not (out / "error.json").exists(), json.loads((out / "error.json").read_text())["traceback"][-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    for f in ("result.json", "strategy.json", "trace.json", "gantt.png"):
        assert (out / f).exists(), f
    row = json.loads((out / "result.json").read_text())
    assert set(CONTRACT_KEYS) <= set(row)
    assert row["algo"] == algo and row["model"] == "lenet5" and row["num_devices"] == 4
    # a stack-graph plan reports one representative GPU per pipeline stage (every GPU of a stage is a replica of it)
    stages = (row["algo_info"].get("parallel_plan") or {}).get("pp") if row.get("graph_kind") == "stack" else None
    assert len(row["peak_memory_bytes"]) == (stages or 4) and isinstance(row["oom"], bool)
    assert re.search(rf"^algorithm\s+{algo}$", r.stdout, re.M)
    trace = json.loads((out / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_every_plan_of_a_problem_has_the_same_lower_bound(every_algorithm):
    """lower_bound_s is the problem's (harness.app.bounds): one figure for every algorithm given
    the same graph (the operator graph, the layer graph of the layer-graph algorithms, or the
    stack graph of the pipeline algorithms), and no step beats it; each plan's own bound is
    plan_lower_bound_s."""
    sweep, _ = every_algorithm
    rows = [json.loads(f.read_text()) for f in sweep.glob("*/result.json")]
    assert len(rows) == len(ALGOS)
    bounds: dict[tuple[str, int, int], set[float]] = {}
    for row in rows:
        bounds.setdefault((row["graph_kind"], row["graph_nodes"], row["graph_edges"]), set()).add(row["lower_bound_s"])
        assert row["step_time_s"] >= row["lower_bound_s"] * (1 - 1e-9) > 0, row["algo"]
        assert row["step_time_s"] >= row["plan_lower_bound_s"] * (1 - 1e-9), row["algo"]
        assert row["gap_to_bound"] == pytest.approx(row["step_time_s"] / row["lower_bound_s"] - 1)
    assert len(bounds) == 3 and all(len(b) == 1 for b in bounds.values()), bounds


def test_single_run_prints_the_summary(tmp_path):
    r = run_harness("algo=m_topo", "model=lenet5", "cluster=p100x4", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    for k in ("model", "nodes", "devices", "algorithm", "search time", "step time", "lower bound", "OOM", "bytes moved"):
        assert k in r.stdout
    row = json.loads((tmp_path / "result.json").read_text())
    assert re.search(r"^m_topo \(this job\)\s", r.stdout, re.M) and re.search(r"^one device\s", r.stdout, re.M)
    assert re.search(r"^data parallel\s", r.stdout, re.M) and "global batch" in r.stdout
    assert ("SLOWER THAN ONE DEVICE" in r.stdout) == ("finding" in r.stdout) == row["slower_than_single_device"]


def test_job_writes_only_into_its_output_dir(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "job"
    r = run_harness("model=lenet5", "algo=single_device", f"hydra.run.dir={out}", cwd=cwd)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(cwd.iterdir()) == []


def test_unknown_option_lists_the_available_ones(tmp_path):
    r = run_harness("model=no_such_model", f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0
    assert "Could not find 'model/no_such_model'" in r.stderr
    assert "Available options" in r.stderr and "resnet50" in r.stderr


def test_batch_size_override(tmp_path):
    r = run_harness("model=lenet5", "model.batch_size=7", "algo=single_device", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "result.json").read_text())["batch_size"] == 7


def test_failed_job_leaves_an_error_record(tmp_path):
    r = run_harness("model=from_file", "model.path=/nonexistent/graph.json", f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0
    err = json.loads((tmp_path / "error.json").read_text())
    assert "does not exist" in err["error"] and "model.path=/nonexistent/graph.json" in err["overrides"]


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_multirun_and_collector(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    r = run_harness("-m", "model=lenet5", "algo=single_device,round_robin", f"hydra/launcher={launcher}",
                f"hydra.sweep.dir={sweep}", "output.gantt=false", "output.trace=false")
    assert r.returncode == 0, r.stderr[-3000:]
    c = subprocess.run([sys.executable, "-m", "harness.collect", str(sweep)], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert c.returncode == 0, c.stderr
    df = pd.read_csv(sweep / "results.csv")
    assert sorted(df["algo"]) == ["round_robin", "single_device"]
    assert (sweep / "results.parquet").exists()
    assert pd.read_parquet(sweep / "results.parquet")["step_time_s"].gt(0).all()


def test_synthetic_and_from_file_models(tmp_path):
    out = tmp_path / "syn"
    r = run_harness("model=synthetic", "model.nodes=300", "model.ccr=0.5", "algo=round_robin", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((out / "result.json").read_text())
    assert row["graph_nodes"] == 300 and row["model"] == "synthetic_n300_ccr0.5"
    # save a captured graph and load it back through model=from_file
    from harness.core.models import SyntheticGraph

    p = tmp_path / "g.json"
    SyntheticGraph(nodes=50, seed=3).op_graph().save(p)
    out2 = tmp_path / "file"
    r = run_harness("model=from_file", f"model.path={p}", "algo=m_topo", f"hydra.run.dir={out2}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out2 / "result.json").read_text())["graph_nodes"] == 50


def test_same_config_same_result_bit_for_bit(tmp_path):
    rows = []
    for k in range(2):
        r = run_harness("model=synthetic", "model.nodes=200", "algo=m_topo", f"hydra.run.dir={tmp_path / str(k)}", "output.gantt=false")
        assert r.returncode == 0, r.stderr[-2000:]
        rows.append(json.loads((tmp_path / str(k) / "result.json").read_text()))
    keys = ("step_time_s", "lower_bound_s", "comm_bytes", "peak_memory_bytes", "device_busy_s")
    assert [rows[0][k] for k in keys] == [rows[1][k] for k in keys]
    assert (tmp_path / "0" / "strategy.json").read_text() == (tmp_path / "1" / "strategy.json").read_text()


def test_custom_model_from_any_factory(tmp_path):
    r = run_harness("model=custom", "model.module._target_=tests.test_capture.Tiny", "model.image_size=8", "model.target.high=10",
                "model.batch_size=4", "algo=data_parallel", "cluster=p100x4", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((tmp_path / "result.json").read_text())
    assert row["model"] == "custom" and row["num_tasks"]["collective"] > 0
    missing = run_harness("model=custom", f"hydra.run.dir={tmp_path / 'm'}")
    assert missing.returncode != 0 and "model.module._target_" in missing.stderr


def test_sweep_resumes_and_survives_a_failed_job(tmp_path):
    sweep = tmp_path / "sweep"
    args = ("-m", "model=lenet5", "algo=m_topo", "algo.coloc_memory=first,bogus,all", f"hydra.sweep.dir={sweep}",
            "output.gantt=false", "output.trace=false")
    r = run_harness(*args)
    assert r.returncode == 1, r.stderr[-3000:]  # a sweep with a failed job fails, after running the others
    assert r.stdout.strip().splitlines()[-1] == "2 ok, 1 failed, 0 skipped"
    results = sorted(sweep.glob("*/result.json"))
    errors = sorted(sweep.glob("*/error.json"))
    assert len(results) == 2 and len(errors) == 1
    err = json.loads(errors[0].read_text())
    assert "coloc_memory" in err["error"] and "Traceback" in err["traceback"]
    stamp = {f: f.stat().st_mtime_ns for f in results}
    again = run_harness(*args)
    assert again.returncode == 1 and again.stdout.strip().splitlines()[-1] == "0 ok, 1 failed, 2 skipped"
    assert again.stderr.count("skipping: this config") + again.stdout.count("skipping: this config") == 2
    assert {f: f.stat().st_mtime_ns for f in results} == stamp  # finished jobs were not redone
    c = subprocess.run([sys.executable, "-m", "harness.collect", str(sweep)], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert c.returncode == 0, c.stderr
    df = pd.read_csv(sweep / "results.csv")
    assert sorted(df["status"]) == ["error", "ok", "ok"]
