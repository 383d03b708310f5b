"""The cross-paper experiments: leaderboard, scaling study, and ``experiments all --quick``."""

from __future__ import annotations

import importlib

import pandas as pd
import pytest

from experiments import all as all_experiments
from experiments import common, leaderboard, scaling
from experiments.__main__ import names
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


def test_experiment_args_share_quick_out_and_models(tmp_path, monkeypatch):
    """--models NAME[:BATCH] means the same everywhere: an explicit list wins over --quick's, a
    NAME without :BATCH runs at the experiment's batch for it; --quick without --out writes
    to the scratch dir of the experiment's topic."""
    ap = common.experiment_args("x", None, "topic", quick="small", models="the default", batch="its own")
    a = ap.parse_args(["--models", "lenet5:4", "alexnet"])
    assert common.models_of(a, ["vgg16"], ["lenet5"], batches={"alexnet": 16}) == [("lenet5", 4), ("alexnet", 16)]
    assert common.models_of(ap.parse_args(["--quick"]), ["vgg16:8"], [("lenet5", 2)]) == [("lenet5", 2)]
    assert common.models_of(ap.parse_args([]), ["vgg16:8", "alexnet"], fallback=32) == [("vgg16", 8), ("alexnet", 32)]
    assert common.models_of(ap.parse_args(["--quick", "--models", "alexnet"]), ["vgg16"], ["lenet5"]) == [("alexnet", None)]
    with pytest.raises(SystemExit):
        ap.parse_args(["--models", "lenet5:0"])
    names_only = common.experiment_args("x", None, "topic", quick="small", models="the default", batch=None)
    with pytest.raises(SystemExit):
        names_only.parse_args(["--models", "lenet5:4"])
    assert common.output_dir(ap.parse_args(["--out", str(tmp_path / "o")])) == tmp_path / "o"
    monkeypatch.setattr(common, "SCRATCH", tmp_path / "scratch")
    assert common.output_dir(ap.parse_args(["--quick"])) == tmp_path / "scratch" / "topic"
    # every conf/algo file is an algorithm of the leaderboard and the scaling study
    assert {p.stem for p in (common.CONF / "algo").glob("*.yaml") if not common.needs_input(p.stem)} <= set(common.algorithms())


@pytest.mark.parametrize("name", sorted(set(names()) - {"all"}))
def test_every_experiment_takes_quick_and_out(name, capsys):
    """``python -m experiments all`` passes --quick and --out DIR to every experiment."""
    with pytest.raises(SystemExit):
        importlib.import_module(f"experiments.{name}").main(["--help"])
    text = capsys.readouterr().out
    assert "--quick" in text and "--out DIR" in text


def test_all_knows_every_experiment_and_where_it_writes(tmp_path):
    assert set(all_experiments.experiments()) == set(names()) - {"all"}
    assert all_experiments.out_dir("optcnn_fig8", tmp_path) == tmp_path / "optcnn"
    assert all_experiments.out_dir("leaderboard", tmp_path) == tmp_path / "leaderboard"


@pytest.mark.slow
def test_all_quick_regenerates_everything_into_a_scratch_dir(tmp_path):
    assert all_experiments.main(["--quick", "--out", str(tmp_path)]) == 0
    for paper in ("fddps", "celeritas", "optcnn", "pase"):
        assert list((tmp_path / paper).glob("*.csv")), paper
        assert list((tmp_path / paper).glob("*.png")), paper


def test_scaling_before_runs_every_point_on_the_other_revision_too(tmp_path):
    """--before REV: each point also runs on REV (here HEAD, exported from git), right after
    this tree's; the table and the README carry both versions."""
    rc = scaling.main(["--quick", "--sizes", "100", "--models", "lenet5", "--algos", "m_topo", "--before", "HEAD", "--out", str(tmp_path)])
    assert rc == 0
    df = pd.read_csv(tmp_path / "scaling.csv")
    assert (df["status"] == "ok").all(), df[["version", "error"]]
    assert sorted(df["version"]) == ["after", "after", "before", "before"]  # one synthetic and one zoo point each
    both = df.pivot_table(index=["family", "algo"], columns="version", values="nodes")
    assert (both["before"] == both["after"]).all()  # the same graphs
    readme = (tmp_path / "README.md").read_text()
    assert "**before** git revision `HEAD`" in readme and "| m_topo | 1 | " in readme
    with pytest.raises(SystemExit, match="cannot export 'no-such-rev'"):
        scaling.main(["--quick", "--sizes", "100", "--models", "lenet5", "--algos", "m_topo", "--before", "no-such-rev", "--out", str(tmp_path)])


def test_a_grid_gives_each_search_with_a_budget_half_the_cells_limit():
    """budget_overrides: the leaderboard's way to an answer in every cell: the key each
    algorithm's YAML declares, nothing for one without."""
    assert common.budget_overrides("optcnn", 30) == ["algo.budget_s=30"]
    assert common.budget_overrides("hrl", 30) == ["algo.time_budget_s=30"]
    assert common.budget_overrides("m_topo", 30) == []
    assert common.budget_overrides("data_parallel@layer", 30) == []  # a variant reads its base algorithm's YAML
    with_budget = {a for a in common.algorithms() if common.budget_overrides(a, 1)}
    assert {"optcnn", "optcnn_dfs", "pase", "flexflow_mcmc", "hrl"} <= with_budget
