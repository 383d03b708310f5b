"""``python -m experiments sim_accuracy --quick``: the pipeline (profile, plan, simulate, run for real, report), not the accuracy."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import sim_accuracy
from experiments._sim_rank import RANKS_CSV, kendall_tau, pick_regret, rank_summary


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
    # what it measured is filed under this machine's CPU, whichever CPU cpu2 was calibrated on
    from harness.core.machine import cpu_kind
    from harness.core.profiled import slug

    assert [f.parent.name for f in (tmp_path / "profiles").glob("*/lenet5_aten_*.parquet")] == [slug(cpu_kind(1))]
    assert ("measured on another CPU" in readme) == (sim_accuracy.calibrated_elsewhere(sim_accuracy._cpu2()) is not None)


def test_a_full_run_on_another_cpu_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """cpu2's figures belong to the CPU it names: on another one the full run says what to run
    first, in one line, and writes nothing."""
    from harness.core import machine

    monkeypatch.setattr(machine, "cpu_model", lambda: "Some Other CPU")
    assert sim_accuracy.calibrated_elsewhere(sim_accuracy._cpu2()) is not None
    with pytest.raises(SystemExit) as e:
        sim_accuracy.main(["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not on this machine's 'Some Other CPU (1 thread)'" in err and "python -m harness.calibrate --threads 1 --write" in err
    assert not (tmp_path / "out").exists()


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

    from harness.app.compose import compose

    cpu2 = instantiate(compose(["cluster=cpu2"]).cluster, _convert_="all")
    busy = sim_accuracy.busy_model(cpu2)
    assert busy.meta["host_comm"] == {**cpu2.meta["host_comm"], "recv_when": "busy"}
    assert cpu2.meta["host_comm"].get("recv_when", "always") == "always"  # the original is left alone
    assert (busy.route_lat == cpu2.route_lat).all() and busy.meta["collective"] == cpu2.meta["collective"]
    bare = instantiate(compose(["cluster=cpu2", "~cluster.host_comm.recv_idle_us"]).cluster, _convert_="all")
    assert sim_accuracy.busy_model(bare) is None


def _case(model: str, algo: str, sim: float, meas: float, inter: float | None = None, runs: str = "", status: str = "ok") -> dict:
    """One row of a sim_accuracy table with the columns the rank summary reads."""
    return {"model": model, "algo": algo, "status": status, "simulated_s": sim, "measured_s": meas,
            "interleaved_s": sim if inter is None else inter, "run_spread": 0.1,
            "measured_runs_ms": runs or f"{meas * 1e3:.2f} {meas * 1e3:.2f}"}


def test_kendall_tau_and_regret_on_known_orders():
    nan = float("nan")
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == (pytest.approx(1.0), "")
    assert pick_regret([1, 2, 3], [10, 20, 30]) == (0.0, [0], "")
    assert kendall_tau([3, 2, 1], [10, 20, 30]) == (pytest.approx(-1.0), "")
    assert pick_regret([3, 2, 1], [10, 20, 30]) == (pytest.approx(30 / 10 - 1), [2], "")
    # a tie for the simulator's fastest: tau-b = (2 concordant - 0) / sqrt((3 - 1) * 3); the regret of the picks' mean
    assert kendall_tau([1, 1, 2], [10, 20, 30])[0] == pytest.approx(2 / 6 ** 0.5)
    assert pick_regret([1, 1, 2], [10, 20, 30]) == (pytest.approx(15 / 10 - 1), [0, 1], "")
    # strategies without a time are left out; one left, or a side all equal: NaN with the reason
    assert kendall_tau([1, nan, 3], [10, 20, 30]) == (pytest.approx(1.0), "")
    for sim, meas in (([1.0], [10.0]), ([1, nan], [10, 20]), ([], [])):
        tau, why = kendall_tau(sim, meas)
        regret, picks, why_r = pick_regret(sim, meas)
        assert tau != tau and regret != regret and picks == [] and why and why_r
    tau, why = kendall_tau([2, 2, 2], [10, 20, 30])
    assert tau != tau and why
    assert pick_regret([2, 2, 2], [10, 20, 30])[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one length"):
        kendall_tau([1, 2], [1, 2, 3])


def test_rank_summary_per_model_with_both_profiles_and_the_rounds_noise():
    df = pd.DataFrame([
        # before: reversed; interleaved: perfect order.  Rounds: the same order twice, then reversed
        _case("a", "x", 0.3, 0.010, 0.010, "10.00 10.00 30.00"), _case("a", "y", 0.2, 0.020, 0.020, "20.00 20.00 20.00"),
        _case("a", "z", 0.1, 0.030, 0.030, "30.00 30.00 10.00"), _case("a", "w", 0.0, 0.0, status="refused"),
        # one strategy executed: NaN with a reason, never a crash
        _case("b", "x", 0.1, 0.010), _case("b", "y", float("nan"), float("nan"), status="refused"),
        # not profiled during the run
        _case("c", "x", 0.1, 0.010, float("nan")), _case("c", "y", 0.2, 0.020, float("nan")),
        # two rounds that disagree: either round's pick judged by the other
        _case("d", "x", 0.1, 0.010, runs="10.00 15.00"), _case("d", "y", 0.2, 0.020, runs="20.00 20.00"),
        _case("d", "z", 0.3, 0.030, runs="30.00 10.00"),
    ])
    s = rank_summary(df).set_index("model")
    assert s.index.tolist() == ["a", "b", "c", "d"] and s["strategies"].tolist() == [3, 1, 2, 3]
    a = s.loc["a"]
    assert a["tau_b_before"] == pytest.approx(-1) and a["regret_before"] == pytest.approx(2.0) and a["pick_before"] == "z"
    assert a["tau_b_interleaved"] == pytest.approx(1) and a["regret_interleaved"] == 0 and a["pick_interleaved"] == "x"
    assert a["fastest"] == "x" and a["goal_met"] and a["note"] == ""
    # round pairs (0, 1): tau 1, regret 0 both ways; (0, 2) and (1, 2): tau -1, regret 2 both ways
    assert a["rounds"] == 3 and a["rounds_tau_b"] == pytest.approx(-1) and a["rounds_regret"] == pytest.approx(2.0)
    assert a["spread_median"] == pytest.approx(0.1)
    b = s.loc["b"]
    assert all(b[k] != b[k] for k in ("tau_b_before", "regret_before", "tau_b_interleaved", "regret_interleaved"))
    assert not b["goal_met"] and "before" in b["note"] and "interleaved" in b["note"] and "noise" in b["note"]
    c = s.loc["c"]
    assert c["tau_b_before"] == pytest.approx(1) and c["tau_b_interleaved"] != c["tau_b_interleaved"]
    assert not c["goal_met"] and "interleaved" in c["note"] and "before" not in c["note"]
    # round 0 picks x, 15 / 10 - 1 in round 1; round 1 picks z, 30 / 10 - 1 in round 0; tau-b (1 - 2) / 3
    d = s.loc["d"]
    assert d["rounds"] == 2 and d["rounds_regret"] == pytest.approx((0.5 + 2.0) / 2) and d["rounds_tau_b"] == pytest.approx(-1 / 3)
    with pytest.raises(ValueError, match="measured_s"):
        rank_summary(df.drop(columns="measured_s"))


def test_summarize_only_rewrites_the_rank_summary_from_the_csv_alone(tmp_path):
    committed = sim_accuracy.CONF.parent / "results" / "sim_accuracy"
    before = {p.name: p.stat().st_mtime_ns for p in committed.iterdir()}
    # m: before the run reversed, interleaved in order; n: in order
    df = pd.DataFrame([_case("m", "x", 0.1, 0.030, 0.030), _case("m", "y", 0.2, 0.020, 0.020), _case("m", "z", 0.3, 0.010, 0.010),
                       _case("n", "x", 0.1, 0.010), _case("n", "y", 0.2, 0.020)])
    df.to_csv(tmp_path / "sim_accuracy.csv", index=False)
    table = (tmp_path / "sim_accuracy.csv").read_bytes()
    (tmp_path / "README.md").write_text("# the table's README\n")
    assert sim_accuracy.main(["--summarize-only", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "sim_accuracy.csv", RANKS_CSV]
    s = pd.read_csv(tmp_path / RANKS_CSV).set_index("model")
    assert s.loc["m", "tau_b_before"] == pytest.approx(-1) and s.loc["m", "regret_before"] == pytest.approx(2.0)
    assert s.loc["m", "tau_b_interleaved"] == pytest.approx(1) and s.loc["m", "regret_interleaved"] == 0
    assert s.loc["n", "tau_b_before"] == pytest.approx(1) and bool(s.loc["n", "goal_met"])
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# the table's README\n") and len(readme) > len("# the table's README\n")
    # run again: the section is replaced, not appended twice; the table is left as it was
    assert sim_accuracy.main(["--summarize-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == readme
    assert (tmp_path / "sim_accuracy.csv").read_bytes() == table
    assert {p.name: p.stat().st_mtime_ns for p in committed.iterdir()} == before  # nothing written outside --out


def test_summarize_only_refuses_a_missing_table_and_measuring_options(tmp_path, capsys):
    for argv in (["--summarize-only", "--out", str(tmp_path)], ["--summarize-only", "--quick", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            sim_accuracy.main(argv)
        assert e.value.code == 2
    assert "--quick" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
