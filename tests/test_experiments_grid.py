"""The cross-paper experiments: leaderboard, scaling study, and ``experiments all --quick``."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import all as all_experiments
from experiments import leaderboard, scaling
from experiments._grid import Job, run_jobs


def _boom(overrides):
    raise ValueError("broken on purpose")


def _slow(overrides):
    import time

    time.sleep(30)
    return {}


def test_grid_records_errors_and_timeouts_without_losing_the_rest():
    jobs = [Job((("k", "a"),), ("x",)), Job((("k", "b"),), ("y",)), Job((("k", "c"),), ("z",))]
    fns = {"x": lambda o: {"v": 1}, "y": _boom, "z": _slow}
    rows = run_jobs(jobs, lambda o: fns[o[0]](o), timeout_s=2.0, workers=2, desc="t")
    assert [r["status"] for r in rows] == ["ok", "error", "timeout"]
    assert rows[0]["v"] == 1 and "broken on purpose" in rows[1]["error"] and rows[2]["k"] == "c"


def test_leaderboard_quick(tmp_path):
    rc = leaderboard.main(["--quick", "--models", "lenet5", "--clusters", "p100x4", "--algos", "single_device", "m_topo",
                           "data_parallel", "data_parallel@layer", "--out", str(tmp_path)])
    assert rc == 0
    df = pd.read_csv(tmp_path / "leaderboard.csv")
    assert set(df["algo"]) == {"single_device", "m_topo", "data_parallel", "data_parallel@layer"}
    assert (df["status"] == "ok").all() and (df["vs_bound"] >= 1.0 - 1e-9).all()
    best = pd.read_csv(tmp_path / "best.csv")
    assert best.loc[0, "best"] in set(df["algo"])
    readme = (tmp_path / "README.md").read_text()
    assert (tmp_path / "heatmap.png").exists() and "Best algorithm per setting" in readme
    # the README names the command as it was run, and has a row per algorithm
    assert "Command: `python -m experiments leaderboard --quick --models lenet5" in readme
    assert "| m_topo | 1 | 1 | 0 | 0 | 0 |" in readme
    # redrawn from the CSV alone, with a cell turned into an OOM: the table follows the CSV
    df.loc[df["algo"] == best.loc[0, "best"], "oom"] = True
    df.to_csv(tmp_path / "edited.csv", index=False)
    (tmp_path / "README.md").unlink()
    assert leaderboard.main(["--from-csv", str(tmp_path / "edited.csv"), "--command", "made by hand"]) == 0
    redrawn = (tmp_path / "README.md").read_text()
    assert "Command: `made by hand`" in redrawn
    assert pd.read_csv(tmp_path / "best.csv").loc[0, "best"] != best.loc[0, "best"]


def test_scaling_quick(tmp_path):
    rc = scaling.main(["--quick", "--sizes", "100", "300", "--models", "lenet5", "--algos", "m_topo", "optcnn", "--out", str(tmp_path)])
    assert rc == 0
    df = pd.read_csv(tmp_path / "scaling.csv")
    syn = df[df["family"] == "synthetic"]
    assert set(syn["algo"]) == {"m_topo"}  # a layer-graph algorithm has no synthetic graph
    assert sorted(syn["nodes"]) == [100, 300]
    assert set(df[df["family"] == "zoo"]["algo"]) == {"m_topo", "optcnn"}
    assert (df["tasks_per_s"].dropna() > 0).all()
    for f in ("search_time.png", "simulator_throughput.png", "scaling.json", "README.md"):
        assert (tmp_path / f).exists()
    assert "Command: `python -m experiments scaling --quick --sizes 100 300 --models lenet5" in (tmp_path / "README.md").read_text()


def test_all_knows_every_experiment_and_where_it_writes(tmp_path):
    from experiments.__main__ import names

    assert set(all_experiments.experiments()) == set(names()) - {"all"}
    assert all_experiments.out_dir("optcnn_fig8", tmp_path) == tmp_path / "optcnn"
    assert all_experiments.out_dir("leaderboard", tmp_path) == tmp_path / "leaderboard"


@pytest.mark.slow
def test_all_quick_regenerates_everything_into_a_scratch_dir(tmp_path):
    assert all_experiments.main(["--quick", "--out", str(tmp_path)]) == 0
    for paper in ("fddps", "celeritas", "optcnn", "pase"):
        assert list((tmp_path / paper).glob("*.csv")), paper
        assert list((tmp_path / paper).glob("*.png")), paper
