"""What a plan is worth (harness.app.worth): its step beside one device's and data parallelism's."""

from __future__ import annotations

import json

import pytest

from harness.app.compose import compose
from harness.app import worth as W
from harness.app.run import run
from harness.app.summary import finding, format_summary, reference_table

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
    row = {"algo": "x", "step_time_s": 2.0, "speedup_vs_single_device": 0.5, "single_device_step_s": 1.0,
           "slower_than_single_device": True, "speedup_vs_data_parallel": 0.25, "data_parallel_step_s": 0.5, "estimate_gap": None}
    table = reference_table(row)
    assert "SLOWER THAN ONE DEVICE" in table[1] and "x (this job)" in table[1]
    assert [ln.split()[-2:] for ln in table[2:]] == [["1.00x", "0.50x"], ["2.00x", "1.00x"]]  # one device, data parallel
    no_dp = reference_table({**row, "data_parallel_step_s": None, "speedup_vs_data_parallel": None})
    assert len(no_dp) == 3 and "vs data parallel" not in no_dp[0] and no_dp[2].split()[-1] == "1.00x"


def test_the_finding_quotes_the_algorithm_and_the_simulator():
    row = {"slower_than_single_device": True, "speedup_vs_single_device": 0.5, "single_device_step_s": 1.0,
           "data_parallel_step_s": 0.25}
    about = {"paper": "P (A et al.)", "paper_claim": "a faster step", "findings": "results/p/README.md"}
    text = finding(row, about)
    assert text.startswith("P (A et al.) claims a faster step.")
    assert "0.50x one device" in text and "data parallelism at 4.00x" in text
    assert "results/p/README.md, results/README.md" in text
    assert "claims" not in finding(row, {}) and "results/README.md" in finding(row, {})
    assert finding({**row, "slower_than_single_device": False}, about) == ""


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
    assert "vs one device" in text and "vs data parallel" in text and "round_robin (this job)" in text
    assert "global batch" in text


def test_the_job_knows_its_algorithms_paper_and_the_summary_quotes_it():
    from algorithms.fddps import FDDPS

    res = run(compose(BASE + ["algo=fddps"]))
    assert res.about == FDDPS().about() and res.about["findings"] == "results/fddps/README.md"
    slower = {**res.row, "slower_than_single_device": True, "speedup_vs_single_device": 0.5}
    text = format_summary(slower, res.about)
    assert f"{res.about['paper']} claims {res.about['paper_claim']}" in " ".join(text.split())
    assert "results/fddps/README.md" in text and "SLOWER THAN ONE DEVICE" in text
