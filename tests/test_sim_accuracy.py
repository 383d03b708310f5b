"""``python -m experiments sim_accuracy --quick``: the pipeline (profile, plan, simulate, run for real, report), not the accuracy."""

from __future__ import annotations

import pandas as pd

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
