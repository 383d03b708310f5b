"""``python -m harness.calibrate`` refuses physically impossible fits: the link and all-reduce
alpha-beta fits, the send- and receive-after-gap fits and the device figures, on synthetic
measurements (no probing), and the command writes nothing when one is found."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from harness.app import calibrate
from harness.app.link_probes import (
    MAX_BW_BPS, SEND_GAPS, SIZES, alpha_beta_problems, fit_link, fit_problems, fit_send_gap, gap_fit_problems,
)

LAT, BW, COLL_LAT, COLL_BW = 50e-6, 3.66e9, 650e-6, 1.76e9


def saturating(hot: float, cold: float, tau: float) -> dict[str, list[float]]:
    """Medians per gap of ``hot + cold (1 - exp(-gap / tau))``, three rounds with +-1 us of noise."""
    return {str(g): [hot + cold * (1 - math.exp(-g / tau)) + d for d in (-1e-6, 0.0, 1e-6)] for g in SEND_GAPS}


def measured(**change: Any) -> dict[str, Any]:
    """What the two ranks of a calibration report on a quiet machine like the cpu2 VM."""
    res = {"p2p": {str(s): LAT + s / BW for s in SIZES}, "allreduce": {str(s): 2 * COLL_LAT + s / COLL_BW for s in SIZES},
           "msg_cpu_s": 76e-6, "big_msg_cpu_s": 76e-6 + (1 << 20) / 12e9, "recv_idle_s": 43e-6}
    parts = {"res": res, "busy": {"early": [1e-4, 2e-4], "late": [3e-4, 5e-4]},
             "gaps": saturating(62e-6, 103e-6, 5e-3), "recv_gaps": saturating(103e-6, 311e-6, 9.6e-3)}
    for k, v in change.items():
        if k in res:
            res[k] = v
        else:
            parts[k] = v
    return fit_link(parts["res"], parts["busy"], parts["gaps"], parts["recv_gaps"])


def test_a_quiet_machines_fits_are_accepted() -> None:
    link = measured()
    assert link["lat_s"] == pytest.approx(LAT, rel=1e-6) and link["bw_Bps"] == pytest.approx(BW, rel=1e-6)
    assert link["coll_lat_s"] == pytest.approx(COLL_LAT, rel=1e-6) and link["coll_bw_Bps"] == pytest.approx(COLL_BW, rel=1e-6)
    assert link["copy_cpu_Bps"] == pytest.approx(12e9, rel=1e-6)
    assert link["send_hot_s"] == pytest.approx(62e-6, rel=0.05) and link["recv_cold_s"] == pytest.approx(311e-6, rel=0.05)
    assert fit_problems(link) == []
    assert calibrate.calibration_problems(110e9, 10e9, 1, link) == []


def test_a_stalled_gap_gives_a_negative_hot_cost_and_is_refused() -> None:
    """One gap's median 50 ms (the machine stalled): the least-squares curve goes through it with a
    negative hot cost and a cold one of a tenth of a second - the fit the issue reported."""
    gaps = {str(g): [0.05 if g == SEND_GAPS[-1] else 1e-4] for g in SEND_GAPS}
    hot, cold, tau = fit_send_gap(gaps)
    assert hot < 0 and cold > 0.1
    problems = gap_fit_problems("send-after-gap", gaps, hot, cold, tau)
    assert any("negative hot cost" in p for p in problems) and any("predicts a time <= 0" in p for p in problems)
    link = measured(gaps=gaps)
    assert any(p.startswith("send-after-gap fit has a negative hot cost") for p in fit_problems(link))


@pytest.mark.parametrize("hot, cold, tau, fragment", [
    (-1e-6, 1e-4, 1e-3, "negative hot cost"),
    (1e-4, -1e-5, 1e-3, "a cold rank cannot pay less than a hot one"),
    (1e-4, 1e-4, 0.0, "a cold rank cannot pay less than a hot one"),
    (1e-4, float("nan"), 1e-3, "not finite"),
])
def test_impossible_gap_figures_are_named(hot: float, cold: float, tau: float, fragment: str) -> None:
    gaps = saturating(1e-4, 1e-4, 1e-3)
    assert any(fragment in p for p in gap_fit_problems("receive-after-gap", gaps, hot, cold, tau))


def test_a_plateau_far_beyond_the_measured_gaps_is_refused() -> None:
    """Data that still rise linearly at the largest gap: a plateau 10x the slowest median is an
    extrapolation, not a measurement."""
    gaps = saturating(1e-4, 2e-4, 5e-3)
    assert gap_fit_problems("x", gaps, 1e-4, 2e-4, 5e-3) == []
    assert any("levels off" in p for p in gap_fit_problems("x", gaps, 1e-4, 3e-2, 5.0))
    # a curve far from the medians (two gaps 20x slower than it) does not describe them
    stalled = {k: [v[1] * (20 if i in (2, 5) else 1)] for i, (k, v) in enumerate(gaps.items())}
    assert any("misses its medians by a factor" in p for p in gap_fit_problems("x", stalled, 1e-4, 2e-4, 5e-3))


def test_alpha_beta_fits_need_a_latency_a_bandwidth_and_a_line_through_the_points() -> None:
    sizes = [float(s) for s in SIZES]
    t = [LAT + s / BW for s in sizes]
    assert alpha_beta_problems("link", sizes, t, LAT, BW) == []
    assert "is not a latency" in alpha_beta_problems("link", sizes, t, -1e-6, BW)[0]
    assert "is not a bandwidth" in alpha_beta_problems("link", sizes, t, LAT, 0.0)[0]
    assert "is not a bandwidth" in alpha_beta_problems("link", sizes, t, LAT, 10 * MAX_BW_BPS)[0]
    stalled = list(t)
    stalled[2] *= 10  # one size ten times slower than the line
    assert "misses its measured times" in alpha_beta_problems("link", sizes, stalled, LAT, BW)[0]


def test_a_link_measured_on_a_stalling_machine_is_refused() -> None:
    p2p = {str(s): LAT + s / BW for s in SIZES}
    p2p[str(SIZES[3])] = 0.2  # a 64 KiB round trip that took 0.4 s
    assert any(p.startswith("link fit misses") for p in fit_problems(measured(p2p=p2p)))
    # 1 MiB messages that cost no more than small ones: a copy rate beyond any core's
    assert any("copy rate" in p for p in fit_problems(measured(big_msg_cpu_s=76e-6)))
    assert any("GEMM rate" in p for p in calibrate.calibration_problems(5e12, 10e9, 1, measured()))
    assert any("copy bandwidth" in p for p in calibrate.calibration_problems(1e11, float("inf"), 1, measured()))


def _fake_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, link: dict[str, Any]) -> Path:
    monkeypatch.setattr(calibrate, "REPO", tmp_path)
    monkeypatch.setattr(calibrate, "pin_to_cores", lambda threads: None)
    monkeypatch.setattr(calibrate, "gemm_flops", lambda threads: 110e9)
    monkeypatch.setattr(calibrate, "copy_bandwidth", lambda threads: 10e9)
    monkeypatch.setattr(calibrate, "gloo_link", lambda *a, **k: link)
    (tmp_path / "conf" / "cluster" / "device").mkdir(parents=True)
    return tmp_path / "conf" / "cluster" / "cpu2.yaml"


def test_the_command_writes_nothing_for_an_impossible_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    gaps = {str(g): [0.05 if g == SEND_GAPS[-1] else 1e-4] for g in SEND_GAPS}
    out = _fake_calibration(monkeypatch, tmp_path, measured(gaps=gaps))
    assert calibrate.main(["--threads", "1", "--write"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: an impossible calibration, not written: send-after-gap fit has a negative hot cost")
    assert not out.exists() and not (out.parent / "device" / "cpu_host.yaml").exists()


def test_the_command_writes_a_plausible_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = _fake_calibration(monkeypatch, tmp_path, measured())
    assert calibrate.main(["--threads", "1", "--write"]) == 0
    assert "lat_us: 50.00" in out.read_text() and (out.parent / "device" / "cpu_host.yaml").is_file()
