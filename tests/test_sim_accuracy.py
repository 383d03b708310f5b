"""``python -m experiments sim_accuracy --quick``: the pipeline (profile, plan, simulate, run for real, report), not the accuracy."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import sim_accuracy


def test_quick_run_writes_table_figure_and_readme(tmp_path):
    assert sim_accuracy.main(["--quick", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "sim_accuracy.csv")
    assert len(df) == 1 and (df["status"] == "ok").all()
    r = df.iloc[0]
    assert r["model"] == "lenet5" and r["algo"] == "round_robin" and r["mode"] == "placement"
    assert r["simulated_s"] > 0 and r["measured_s"] > 0 and r["error"] == r["simulated_s"] / r["measured_s"] - 1
    assert r["fallback_nodes"] == 0  # the fresh profile covers every op
    assert (tmp_path / "sim_accuracy.png").stat().st_size > 0
    readme = (tmp_path / "README.md").read_text()
    assert "| lenet5 | round_robin | placement |" in readme and "Mean absolute error" in readme
    assert list((tmp_path / "profiles").glob("*/lenet5_aten_*.parquet"))


def test_repeated_runs_report_the_median_run_and_the_spread():
    base = {"model": "m", "algo": "a", "status": "ok", "simulated_s": 0.030, "analytical_s": 0.020}
    rows = [{**base, "measured_s": t, "measured_std_s": t / 10} for t in (0.040, 0.020, 0.025)]
    r = sim_accuracy.combine_runs(rows)
    assert r["measured_s"] == 0.025 and r["measured_std_s"] == 0.0025  # the median run's own figures
    assert r["error"] == pytest.approx(0.030 / 0.025 - 1) and r["analytical_error"] == pytest.approx(0.020 / 0.025 - 1)
    assert r["runs"] == 3 and r["measured_runs_ms"] == "40.00 20.00 25.00" and r["run_spread"] == pytest.approx(0.8)
    refused = {"model": "m", "algo": "fddps", "status": "refused", "note": "rewritten graph"}
    assert sim_accuracy.combine_runs([refused]) == refused
