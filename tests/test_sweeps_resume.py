"""Where jobs write (harness.app.jobs): the same sweep command resumes its own directory, a
re-run never replaces another config's result, and two single runs never share a run dir."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from harness.app.jobs import LOCK_FILE, claim_dir, sweep_dir, sweep_overrides
from tests.helpers import REPO, run_harness

QUIET = ("output.gantt=false", "output.trace=false")
SWEEP = ("-m", "hydra/launcher=basic", "model=lenet5", "algo=single_device,round_robin", *QUIET)


def last_line(r: subprocess.CompletedProcess) -> str:
    return r.stdout.strip().splitlines()[-1]


def test_the_sweep_dir_is_named_by_the_overrides_not_the_time():
    argv = ["-m", "algo=a,b", "model=m", "hydra/launcher=basic", "hydra.sweep.subdir=x", "++resume=true", "--cfg", "job"]
    assert sweep_overrides(argv) == ["algo=a,b", "model=m"]
    name = sweep_dir(True, argv)
    assert name == sweep_dir("True", ["model=m", "algo=a,b"]) and name.startswith("multirun/algo=a,b_model=m_")
    assert name != sweep_dir(True, ["algo=a,b", "model=n"])
    fresh = sweep_dir(False, argv)
    assert fresh.startswith(name + "_") and fresh != name
    assert sweep_dir(True, ["-m"]).startswith("multirun/defaults_")


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_running_the_same_sweep_again_resumes_it(launcher, tmp_path):
    """Joblib's workers resolve the sweep dir in other processes: they get the launching
    process's name through the config's resolver cache, so every job lands in one directory."""
    sweep_args = ("-m", f"hydra/launcher={launcher}", *SWEEP[2:])
    first = run_harness(*sweep_args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert last_line(first) == "2 ok, 0 failed, 0 skipped"
    (sweep,) = (tmp_path / "multirun").iterdir()
    results = sorted(sweep.glob("*/result.json"))
    assert len(results) == 2
    stamp = {f: f.stat().st_mtime_ns for f in results}
    reordered = (*sweep_args[:2], *reversed(sweep_args[2:]))  # the same overrides in another order: the same sweep
    again = run_harness(*reordered, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert last_line(again) == "0 ok, 0 failed, 2 skipped"
    assert list((tmp_path / "multirun").iterdir()) == [sweep]
    assert {f: f.stat().st_mtime_ns for f in results} == stamp
    fresh = run_harness(*sweep_args, "resume=false", cwd=tmp_path)
    assert fresh.returncode == 0 and last_line(fresh) == "2 ok, 0 failed, 0 skipped"
    assert len(list((tmp_path / "multirun").iterdir())) == 2 and {f: f.stat().st_mtime_ns for f in results} == stamp


def test_a_sweep_rerun_after_its_input_changed_keeps_the_old_result(tmp_path):
    from harness.core.models import SyntheticGraph

    graph, sweep = tmp_path / "g.json", tmp_path / "sweep"
    SyntheticGraph(nodes=40, seed=1).op_graph().save(graph)
    args = ("-m", "hydra/launcher=basic", "model=from_file", f"model.path={graph}", "algo=m_topo,round_robin",
            f"hydra.sweep.dir={sweep}", "output.worth=false", *QUIET)
    assert last_line(run_harness(*args)) == "2 ok, 0 failed, 0 skipped"
    old = {f: f.read_text() for f in sweep.glob("*/result.json")}
    SyntheticGraph(nodes=60, seed=2).op_graph().save(graph)
    r = run_harness(*args)
    assert r.returncode == 0 and last_line(r) == "2 ok, 0 failed, 0 skipped", r.stderr[-3000:]
    assert {f: f.read_text() for f in old} == old  # the old input's results are still there, untouched
    rows = [json.loads(f.read_text()) for f in sweep.glob("*/result.json")]
    assert sorted(r["graph_nodes"] for r in rows) == [40, 40, 60, 60]
    assert len({r["config_hash"] for r in rows}) == 4
    assert last_line(run_harness(*args)) == "0 ok, 0 failed, 2 skipped"


def test_a_second_run_into_the_same_run_dir_is_refused(tmp_path):
    run = ("model=lenet5", "algo=single_device", f"hydra.run.dir={tmp_path}", "output.worth=false", *QUIET)
    assert run_harness(*run).returncode == 0
    before = (tmp_path / "result.json").read_text()
    again = run_harness(*run[:1], "algo=round_robin", *run[2:])
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"error: hydra.run.dir={tmp_path} already holds another job's result.json: give this run another "
        "hydra.run.dir, or leave it out (every run then gets a new directory)"]
    assert (tmp_path / "result.json").read_text() == before and not (tmp_path / "error.json").exists()


def test_a_run_dir_in_use_is_refused(tmp_path):
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a job running now holds it
        r = run_harness("model=lenet5", "algo=single_device", f"hydra.run.dir={tmp_path}", *QUIET)
    finally:
        os.close(fd)
    assert r.returncode == 1 and "is in use by a job running now" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "result.json").exists() and not (tmp_path / "error.json").exists()


def test_two_runs_started_together_into_one_run_dir(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "harness", "model=lenet5", f"hydra.run.dir={tmp_path}", "output.worth=false", *QUIET]
    procs = [subprocess.Popen([*cmd, f"algo={a}"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for a in ("single_device", "round_robin")]
    outs = [p.communicate(timeout=600) for p in procs]
    assert sorted(p.returncode for p in procs) == [0, 1], [e[-2000:] for _, e in outs]
    winner = ("single_device", "round_robin")[[p.returncode for p in procs].index(0)]
    assert json.loads((tmp_path / "result.json").read_text())["algo"] == winner


def test_a_sweep_job_whose_dir_is_taken_writes_beside_it(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "result.json").write_text("{}")
    got, fd = claim_dir(d, beside=True)
    os.close(fd)
    assert got == tmp_path / "job-2"
    (got / "result.json").write_text("{}")
    got, fd = claim_dir(d, beside=True)
    os.close(fd)
    assert got == tmp_path / "job-3"


def test_a_failed_job_dir_can_be_run_again(tmp_path):
    (tmp_path / "error.json").write_text("{}")
    got, fd = claim_dir(tmp_path, beside=False)
    os.close(fd)
    assert got == tmp_path
