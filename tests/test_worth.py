"""What a plan is worth (harness.app.worth): its step beside one device's and data parallelism's."""

from __future__ import annotations

import json

import pytest

from harness.app.compose import compose
from harness import worth as W
from harness.app.run import format_summary, run

BASE = ["model=lenet5", "cluster=p100x4", "output.gantt=false", "output.trace=false"]


@pytest.fixture(autouse=True)
def fresh_memo():
    W._MEMO.clear()
    yield
    W._MEMO.clear()


@pytest.mark.parametrize("algo,key", [("single_device", "speedup_vs_single_device"), ("data_parallel", "speedup_vs_data_parallel")])
def test_the_reference_plans_are_worth_exactly_themselves(algo, key):
    row = run(compose(BASE + [f"algo={algo}"])).row
    assert row[key] == pytest.approx(1.0, rel=1e-12)


def test_row_keys_and_the_estimate_gap():
    row = run(compose(BASE + ["algo=m_etf"])).row  # m-ETF reports its own makespan estimate
    assert row["speedup_vs_single_device"] == pytest.approx(row["single_device_step_s"] / row["step_time_s"])
    assert row["speedup_vs_data_parallel"] == pytest.approx(row["data_parallel_step_s"] / row["step_time_s"])
    assert row["estimate_gap"] == pytest.approx(row["objective_s"] / row["step_time_s"] - 1)
    assert row["slower_than_single_device"] == (row["speedup_vs_single_device"] < 1)


def test_a_plan_slower_than_one_device_is_flagged():
    refs = {"single_device_s": 1.0, "data_parallel_s": 0.5}
    w = W.worth(2.0, refs, {"objective_s": 1.5})
    assert w["slower_than_single_device"] and w["speedup_vs_single_device"] == 0.5
    assert w["estimate_gap"] == pytest.approx(-0.25)
    assert W.worth(0.5, refs, {})["estimate_gap"] is None
    row = {"speedup_vs_single_device": 0.5, "single_device_step_s": 1.0, "slower_than_single_device": True,
           "speedup_vs_data_parallel": 0.25, "data_parallel_step_s": 0.5, "estimate_gap": None}
    lines = W_lines(row)
    assert any("SLOWER THAN ONE DEVICE" in v for _, v in lines)


def W_lines(row):
    from harness.app.run import worth_lines

    return worth_lines(row)


def test_references_are_computed_once_per_key_and_shared_through_the_cache_dir(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"single_device_s": 2.0, "data_parallel_s": 1.0}

    assert W.reference_steps("k", compute, tmp_path) == {"single_device_s": 2.0, "data_parallel_s": 1.0}
    W.reference_steps("k", compute, tmp_path)
    assert len(calls) == 1
    W._MEMO.clear()  # another process of the sweep: it reads the file instead of simulating
    assert W.reference_steps("k", compute, tmp_path)["single_device_s"] == 2.0 and len(calls) == 1
    (tmp_path / "k.json").write_text("{not json")
    W._MEMO.clear()
    W.reference_steps("k", compute, tmp_path)  # a corrupt entry is recomputed and rewritten
    assert len(calls) == 2 and json.loads((tmp_path / "k.json").read_text())["data_parallel_s"] == 1.0


def test_the_jobs_of_a_sweep_share_one_reference_entry(tmp_path):
    import subprocess
    import sys

    from experiments.common import REPO

    out = subprocess.run([sys.executable, "-m", "harness", "-m", "algo=m_topo,round_robin", *BASE,
                          "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / ".references").glob("*.json"))) == 1
    rows = [json.loads(f.read_text()) for f in tmp_path.glob("*/result.json")]
    assert len(rows) == 2 and len({r["single_device_step_s"] for r in rows}) == 1


def test_the_key_depends_on_what_the_references_depend_on():
    a = W.reference_key({"model": {"name": "x"}, "cluster": {"gpus": 4}})
    assert a == W.reference_key({"cluster": {"gpus": 4}, "model": {"name": "x"}})
    assert a != W.reference_key({"model": {"name": "x"}, "cluster": {"gpus": 8}})


def test_output_worth_false_leaves_the_keys_out():
    row = run(compose(BASE + ["algo=round_robin", "output.worth=false"])).row
    assert "speedup_vs_single_device" not in row


def test_the_summary_prints_the_comparison():
    row = run(compose(BASE + ["algo=round_robin"])).row
    text = format_summary(row)
    assert "vs one device" in text and "vs data parallel" in text
