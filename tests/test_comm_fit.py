"""``python -m experiments comm_fit``: the grid search over cpu2's message figures, and its pipeline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments import comm_fit
from harness.app.compose import compose
from harness.core.costs import AnalyticalCostModel
from harness.core.strategy import Strategy
from tests.helpers import make_graph


def _cpu2():
    from hydra.utils import instantiate

    return instantiate(compose(["cluster=cpu2"]).cluster, _convert_="all")


def _runs(truth: dict[str, float]) -> list[comm_fit.ChainRun]:
    """Two plans on cpu2 whose 'measured' steps are the simulator's own under ``truth``: a
    chain that alternates ranks (a message per edge, small ops) and a cut in the middle of a
    chain with big ops and big messages."""
    cluster = _cpu2()
    costs = AnalyticalCostModel(cluster)
    runs = []
    for name, n, flops, nbytes, dev in (("alternating", 12, 2e6, 4096, lambda i: i % 2), ("cut", 8, 4e8, 4 << 20, lambda i: int(i >= 4))):
        g = make_graph(n, [(i, i + 1) for i in range(n - 1)], flops=[flops] * n, nbytes=[nbytes] * (n - 1))
        s = Strategy(device=np.array([dev(i) for i in range(n)]), order=np.arange(n))
        r = comm_fit.ChainRun(name, "hand", g, s, cluster, costs, 1.0, n - 1)
        r.measured_s = float(comm_fit.simulated([r], truth)[0])
        runs.append(r)
    return runs


def test_fit_recovers_the_figures_that_made_the_steps():
    truth = {"per_message_us": 40.0, "copy_GBps": 2.0, "cold_scale": 0.5}
    runs = _runs(truth)
    grid = {"per_message_us": [0.0, 40.0, 120.0], "copy_GBps": [0.5, 2.0, 1e6], "cold_scale": [0.0, 0.5, 2.0]}
    fit, err = comm_fit.fit_host_comm(runs, grid)
    assert fit == truth
    assert np.abs(err).max() < 1e-12
    # each figure moved off the truth moves a step, so the search had something to tell apart
    meas = np.array([r.measured_s for r in runs])
    for key, other in (("per_message_us", 120.0), ("copy_GBps", 0.5), ("cold_scale", 8.0)):
        assert np.abs(comm_fit.simulated(runs, {**truth, key: other}) / meas - 1).max() > 0.01, key


def test_cpu2s_own_figures_are_a_candidate_and_win_ties():
    own = _cpu2().meta["host_comm"]
    runs = _runs({"per_message_us": float(own["per_message_us"]), "copy_GBps": float(own["copy_GBps"]), "cold_scale": 1.0})
    fit, err = comm_fit.fit_host_comm(runs, {"per_message_us": [0.0, 300.0], "copy_GBps": [1e6], "cold_scale": [1.0]})
    assert fit["per_message_us"] == pytest.approx(float(own["per_message_us"])) and np.abs(err).max() < 1e-12


def test_with_host_comm_scales_the_cold_parts_and_leaves_the_cluster_alone():
    c = _cpu2()
    before = dict(c.meta["host_comm"])
    c2 = comm_fit.with_host_comm(c, 10.0, 3.0, 0.5)
    h = c2.meta["host_comm"]
    assert h["per_message_us"] == 10.0 and h["copy_GBps"] == 3.0
    assert h["send_cold_us"] == pytest.approx(0.5 * before["send_cold_us"]) and h["recv_cold_us"] == pytest.approx(0.5 * before["recv_cold_us"])
    assert c.meta["host_comm"] == before


@pytest.mark.slow
def test_quick_run_writes_the_table(tmp_path):
    assert comm_fit.main(["--quick", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "comm_fit.csv")
    assert len(df) == 1 and df.loc[0, "algo"] == "round_robin" and df.loc[0, "sends"] > 0 and df.loc[0, "measured_s"] > 0
    # cpu2's own figures are a candidate, so the fit is never worse than them
    assert abs(df.loc[0, "error_fit"]) <= abs(df.loc[0, "error_cpu2"]) + 1e-12
    md = (tmp_path / "comm_fit.md").read_text()
    assert "| d4 w32 b8 | round_robin |" in md and "Best fit:" in md
