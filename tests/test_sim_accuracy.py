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
    # each rank's step breakdown and page faults travel with the row (lists, one entry per rank)
    assert all(len(eval(r[k])) == 2 for k in ("measured_busy_s", "measured_send_s", "measured_wait_s", "measured_page_faults"))
    assert (tmp_path / "sim_accuracy.png").stat().st_size > 0
    readme = (tmp_path / "README.md").read_text()
    assert "| lenet5 | round_robin | placement |" in readme and "Mean absolute error" in readme
    # the same plan simulated with the profile the ranks took between the measured steps
    assert r["interleaved_s"] > 0 and r["interleaved_error"] == pytest.approx(r["interleaved_s"] / r["measured_s"] - 1)
    assert "profile interleaved with the run: mean absolute error" in readme
    # and under the simulator's other host_comm model, with both profiles (cpu2 is calibrated with recv_idle_us)
    assert r["busy_s"] > 0 and r["busy_error"] == pytest.approx(r["busy_s"] / r["measured_s"] - 1)
    assert r["interleaved_busy_error"] == r["interleaved_busy_error"]  # not NaN
    assert "`host_comm.recv_when: busy`" in readme and "with the interleaved profile, mean absolute error" in readme
    assert list((tmp_path / "profiles").glob("*/lenet5_aten_*.parquet"))


def test_repeated_runs_report_the_round_with_the_median_error():
    base = {"model": "m", "algo": "a", "status": "ok", "analytical_s": 0.020}
    rounds = [(0.030, 0.040), (0.024, 0.020), (0.035, 0.025)]  # (simulated, measured): errors -25%, +20%, +40%
    rows = [{**base, "simulated_s": sim, "measured_s": t, "measured_std_s": t / 10} for sim, t in rounds]
    r = sim_accuracy.combine_runs(rows)
    # the median error is +20%, the second round's: its own simulated and measured times
    assert r["simulated_s"] == 0.024 and r["measured_s"] == 0.020 and r["measured_std_s"] == 0.002
    assert r["error"] == pytest.approx(0.2) and r["analytical_error"] == pytest.approx(0.0)
    assert r["runs"] == 3 and r["measured_runs_ms"] == "40.00 20.00 25.00" and r["run_spread"] == pytest.approx(0.8)
    assert r["run_errors"] == "-25.0% +20.0% +40.0%"
    assert "interleaved_error" not in r  # no round profiled during its run
    # the interleaved error is the median of the rounds' own, whichever round the row reports
    inter = [{**row, "interleaved_error": e} for row, e in zip(rows, (0.05, -0.01, float("nan")))]
    r = sim_accuracy.combine_runs(inter)
    assert r["simulated_s"] == 0.024 and r["interleaved_error"] == pytest.approx(0.02)
    assert r["interleaved_run_errors"] == "+5.0% -1.0% n/a"
    busy = [{**row, "busy_error": e, "interleaved_busy_error": e / 2} for row, e in zip(rows, (0.3, 0.1, -0.2))]
    r = sim_accuracy.combine_runs(busy)
    assert r["busy_error"] == pytest.approx(0.1) and r["interleaved_busy_error"] == pytest.approx(0.05)
    refused = {"model": "m", "algo": "fddps", "status": "refused", "note": "rewritten graph"}
    assert sim_accuracy.combine_runs([refused]) == refused


def test_median_profile_takes_the_median_per_op():
    frames = [pd.DataFrame({"sig": ["x", "y"], "time_s": [t, 2 * t], "time_mean_s": [t, t], "time_min_s": [t, t]}) for t in (1.0, 3.0, 2.0)]
    m = sim_accuracy.median_profile(frames)
    assert m["time_s"].tolist() == [2.0, 4.0] and m["sig"].tolist() == ["x", "y"]


def test_busy_model_switches_only_the_receive_model():
    """busy_model: cpu2 with host_comm.recv_when: busy, every other figure the same; None for a
    cluster without a calibrated recv_idle_us; a receive that waited then costs recv_idle_us."""
    from hydra.utils import instantiate

    from experiments.common import compose

    cpu2 = instantiate(compose(["cluster=cpu2"]).cluster, _convert_="all")
    busy = sim_accuracy.busy_model(cpu2)
    assert busy.meta["host_comm"] == {**cpu2.meta["host_comm"], "recv_when": "busy"}
    assert cpu2.meta["host_comm"].get("recv_when", "always") == "always"  # the original is left alone
    assert (busy.route_lat == cpu2.route_lat).all() and busy.meta["collective"] == cpu2.meta["collective"]
    bare = instantiate(compose(["cluster=cpu2", "~cluster.host_comm.recv_idle_us"]).cluster, _convert_="all")
    assert sim_accuracy.busy_model(bare) is None
