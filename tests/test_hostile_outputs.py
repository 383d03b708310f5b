"""Never lose or overwrite a result; clear errors (issue 19).

Drives ``python -m harness`` in subprocesses on tiny jobs (mostly a 50-node synthetic graph, no
capture): one-line errors, unique run directories, sweep directories named by overrides,
skipped jobs that touch nothing, result.json written last, input files in the resume key,
sweeps that outlive jobs which exit or are killed, the collector on damaged sweeps, and
experiments whose smoke runs stay out of the committed results/.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from experiments import common
from experiments.__main__ import names as experiment_names
from harness.app.compose import compose
from harness.app.jobs import fresh_dir, overrides_digest
from harness.app.run import NON_RESULT_KEYS, config_hash, write_outputs

REPO = Path(__file__).resolve().parents[1]
OUT = ("output.gantt=false", "output.trace=false", "output.quiet=true")
TINY = ("model=synthetic", "model.nodes=50", "algo=single_device", *OUT)

#: algorithm factories that misbehave when the job builds them (``algo._target_=hostile.<name>``)
HOSTILE = '''
import os, signal, sys, time
from algorithms.baselines import SingleDevice

def slow(**kw):
    time.sleep(3)
    return SingleDevice(**kw)

def exit3(**kw):
    sys.exit(3)

def kill9(**kw):
    os.kill(os.getpid(), signal.SIGKILL)

def stuck(**kw):
    time.sleep(120)
    return SingleDevice(**kw)

def deaf(**kw):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
'''


def harness(*args: str, cwd: Path = REPO, path: Path | None = None, env: dict[str, str] | None = None,
            wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """``python -m harness ARGS`` (``path``: one more directory on PYTHONPATH)."""
    full = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full.update(PYTHONPATH=os.pathsep.join(str(p) for p in (REPO, path) if p), **(env or {}))
    cmd = [sys.executable, "-m", "harness", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def hostile(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir(exist_ok=True)
    (d / "hostile.py").write_text(HOSTILE)
    return d


def stamps(d: Path) -> dict[str, tuple[int, bytes]]:
    """mtime and content of every file under ``d``."""
    return {str(f.relative_to(d)): (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(d.rglob("*")) if f.is_file()}


# ------------------------------------------------------------------ 1. one-line errors
def test_user_error_is_one_line_with_exit_1_and_no_result(tmp_path):
    run = tmp_path / "run"
    r = harness(*TINY, "cluster=p100x8", "cluster.gpus=0", f"hydra.run.dir={run}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: cluster.gpus must be an integer >= 1, got 0"]
    assert not (run / "result.json").exists()
    err = json.loads((run / "error.json").read_text())
    assert err["user_error"] and "ClusterError" in err["traceback"] and "cluster.gpus=0" in err["overrides"]


@pytest.mark.parametrize("override, culprit", [
    ("model=nosuch", "Could not find 'model/nosuch'"),
    ("modle=lenet5", "modle is not a key of the config: did you mean model?"),  # misspelt, without +
])
def test_compose_error_is_one_line(tmp_path, override, culprit):
    r = harness(override, f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and culprit in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["HYDRA_FULL_ERROR=1", "debug=true"])
def test_the_traceback_when_asked(tmp_path, how):
    env, extra = ({"HYDRA_FULL_ERROR": "1"}, ()) if how.startswith("HYDRA") else ({}, (how,))
    r = harness(*TINY, "cluster.gpus=0", *extra, f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr and "ClusterError" in r.stderr
    c = harness("model=nosuch", *extra, f"hydra.run.dir={tmp_path / 'c'}", env=env)
    assert c.returncode == 1 and "Traceback (most recent call last)" in c.stderr and "MissingConfigException" in c.stderr


# ------------------------------------------------------------------ 4. result.json last
def test_a_job_whose_gantt_fails_leaves_error_json_and_no_result(tmp_path):
    """A bug while writing the outputs (the Gantt chart cannot be saved): traceback, exit 1,
    error.json, no result.json (a resumed sweep would otherwise skip it as finished)."""
    run = tmp_path / "run"
    (run / "gantt.png").mkdir(parents=True)
    r = harness(*TINY, "output.gantt=true", f"hydra.run.dir={run}")
    assert r.returncode == 1 and "Traceback" in r.stderr and "IsADirectoryError" in r.stderr
    assert not (run / "result.json").exists() and (run / "strategy.json").exists()
    err = json.loads((run / "error.json").read_text())
    assert err["error"].startswith("IsADirectoryError") and not err["user_error"]


def test_write_outputs_writes_result_json_last_and_whole(tmp_path):
    class Sim:
        def write_trace(self, path: Path, max_tasks: int | None = None) -> None:
            if fail:
                raise OSError("disk full")
            path.write_text("{}")

    result = SimpleNamespace(row={"step_time_s": 1.0}, sim=Sim())
    cfg = {"output": {"trace": True, "gantt": False}}
    fail = True
    with pytest.raises(OSError):
        write_outputs(result, tmp_path, cfg)
    assert list(tmp_path.iterdir()) == []
    fail = False
    write_outputs(result, tmp_path, cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "trace.json"]  # no temporary file left
    assert json.loads((tmp_path / "result.json").read_text()) == {"step_time_s": 1.0}


# ------------------------------------------------------------------ 2. run directories
def test_two_runs_started_together_get_their_own_directories(tmp_path):
    procs = [harness(*TINY, cwd=tmp_path, wait=False) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = sorted((tmp_path / "outputs").glob("*/*"))
    assert len(runs) == 2, runs
    for d in runs:
        assert json.loads((d / "result.json").read_text())["graph_nodes"] == 50
        assert "model.nodes=50" in (d / ".hydra" / "overrides.yaml").read_text()


def test_run_dir_names_its_overrides_and_is_created_atomically(tmp_path):
    assert overrides_digest(["a=1", "b=2"]) == overrides_digest(["b=2", "a=1"]) != overrides_digest(["a=1", "b=3"])
    base = str(tmp_path / "x" / "run")
    assert [fresh_dir(base) for _ in range(3)] == [base, f"{base}-2", f"{base}-3"]


# ------------------------------------------------------------------ 3. sweep directories
def test_rerun_sweep_with_other_values_overwrites_nothing_and_skipped_jobs_touch_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    args = ("-m", "hydra/launcher=basic", "model=synthetic", "algo=single_device", *OUT, f"hydra.sweep.dir={sweep}")
    first = harness(*args, "model.nodes=50,60")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip().splitlines()[-1] == "2 ok, 0 failed, 0 skipped"
    # the jobs' directories (the sweep's .references cache grows with the new job's references)
    before = {d.name: stamps(d) for d in sweep.iterdir() if d.is_dir() and not d.name.startswith(".")}
    second = harness(*args, "model.nodes=60,70")
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip().splitlines()[-1] == "1 ok, 0 failed, 1 skipped"
    rows = {json.loads(f.read_text())["graph_nodes"]: f.parent.name for f in sweep.glob("*/result.json")}
    assert sorted(rows) == [50, 60, 70]
    for name, files in before.items():  # the first sweep's jobs: result and .hydra as they were
        now = stamps(sweep / name)
        assert {k: v for k, v in now.items() if not k.endswith(".log")} == {k: v for k, v in files.items() if not k.endswith(".log")}
    assert not list(sweep.glob(".jobs-*"))


# ------------------------------------------------------------------ 4. input files in the resume key
def test_an_edited_graph_file_is_run_again(tmp_path):
    from harness.core.models import SyntheticGraph

    graph, sweep = tmp_path / "g.json", tmp_path / "sweep"
    args = ("-m", "hydra/launcher=basic", "model=from_file", f"model.path={graph}", "algo=single_device", *OUT, f"hydra.sweep.dir={sweep}")
    SyntheticGraph(nodes=50, seed=1).op_graph().save(graph)
    assert harness(*args).stdout.strip().endswith("1 ok, 0 failed, 0 skipped")
    assert harness(*args).stdout.strip().endswith("0 ok, 0 failed, 1 skipped")
    SyntheticGraph(nodes=60, seed=1).op_graph().save(graph)
    again = harness(*args)
    assert again.stdout.strip().endswith("1 ok, 0 failed, 0 skipped"), again.stdout[-2000:]
    # the old input's result stays; the new one is written beside it (harness.app.jobs.claim_dir)
    assert sorted(json.loads(f.read_text())["graph_nodes"] for f in sweep.glob("*/result.json")) == [50, 60]


def test_config_hash_of_a_config_without_input_files_is_unchanged():
    """Committed result rows carry config hashes: a config that names no file hashes as before."""
    import hashlib

    from omegaconf import OmegaConf

    cfg = compose(["model=synthetic", "model.nodes=50"])
    plain = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in NON_RESULT_KEYS}
    legacy = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert config_hash(cfg) == legacy


def test_config_hash_covers_the_profiles_of_costs_profiled(tmp_path):
    profile = tmp_path / "some-device" / "lenet5_aten_0.parquet"
    profile.parent.mkdir()
    profile.write_bytes(b"one")
    cfg = compose(["costs=profiled", f"costs.profile_dir={tmp_path}"])
    first = config_hash(cfg)
    assert config_hash(cfg) == first
    profile.write_bytes(b"two")
    assert config_hash(cfg) != first


# ------------------------------------------------------------------ 5. sweeps survive their jobs
@pytest.mark.parametrize("launcher", ["joblib", "basic"])
def test_sweep_survives_a_job_that_exits_and_one_that_is_killed(tmp_path, launcher):
    """The slow healthy job runs beside the killed one (joblib: two workers) and keeps its result."""
    sweep = tmp_path / "sweep"
    r = harness("-m", f"hydra/launcher={launcher}", *TINY, "algo._target_=hostile.slow,hostile.kill9,hostile.exit3",
                f"hydra.sweep.dir={sweep}", path=hostile(tmp_path))
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "1 ok, 2 failed, 0 skipped"
    assert len(list(sweep.glob("*/result.json"))) == 1
    errors = sorted(json.loads(f.read_text())["error"] for f in sweep.glob("*/error.json"))
    assert errors == ["SystemExit: 3", "the job's process was killed by SIGKILL (out of memory?)"]


def test_a_single_run_that_is_killed_leaves_error_json(tmp_path):
    run = tmp_path / "run"
    r = harness(*TINY, "algo._target_=hostile.kill9", f"hydra.run.dir={run}", path=hostile(tmp_path))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: the job's process was killed by SIGKILL (out of memory?)"]
    assert (run / "error.json").exists() and not (run / "result.json").exists()


# ------------------------------------------------------------------ 6. the collector
def test_collect_names_corrupt_and_missing_files_and_goes_on(tmp_path, capsys):
    from harness import collect

    sweep = tmp_path / "sweep"
    for name, files in {"good": {"result.json": json.dumps({"algo": "a", "step_time_s": 1.0})},
                        "corrupt": {"result.json": '{"algo": "b", "step_'},
                        "failed": {"error.json": json.dumps({"error": "boom", "overrides": ["x=1"]})},
                        "missing": {}}.items():
        (sweep / name / ".hydra").mkdir(parents=True)
        for f, text in files.items():
            (sweep / name / f).write_text(text)
    assert collect.main([str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert f"{sweep / 'corrupt'}: result.json is corrupt" in err
    assert f"{sweep / 'missing'}: no result.json or error.json" in err
    assert "1 of 4 jobs have a result" in out
    df = pd.read_csv(sweep / "results.csv")
    assert dict(zip(df["job_dir"], df["status"])) == {"good": "ok", "corrupt": "corrupt", "failed": "error", "missing": "missing"}


# ------------------------------------------------------------------ 7. experiments' smoke runs
class _Stop(Exception):
    pass


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The committed results/ and the scratch root, moved into tmp_path."""
    results, quick = tmp_path / "results", tmp_path / "scratch"
    monkeypatch.setattr(common, "RESULTS", results)
    monkeypatch.setattr(common, "SCRATCH", quick)
    return results, quick


@pytest.mark.parametrize("name", sorted(set(experiment_names()) - {"all"}))
def test_quick_run_of_every_experiment_writes_outside_results(name, scratch, monkeypatch):
    """Every experiment picks its directory through experiments.common.output_dir, which sends
    a --quick run to the scratch directory (stopped there: the runs themselves are tested elsewhere)."""
    results, quick = scratch
    chosen: list[Path] = []
    real = common.output_dir

    def stop(args, *parts):
        chosen.append(real(args, *parts))
        raise _Stop

    mod = importlib.import_module(f"experiments.{name}")
    for m in [m for n, m in sys.modules.items() if n.startswith("experiments.") and n != "experiments.common"
              and getattr(m, "output_dir", None) is real]:
        monkeypatch.setattr(m, "output_dir", stop)
    with pytest.raises(_Stop):
        mod.main(["--quick"])
    assert chosen and quick in chosen[0].parents and not results.exists()


def test_graph_stats_quick_leaves_results_alone(scratch):
    from experiments import graph_stats

    results, quick = scratch
    assert graph_stats.main(["--quick", "--models", "lenet5"]) == 0
    assert (quick / "graph_stats" / "graph_stats.csv").exists() and not results.exists()


def test_all_quick_leaves_the_directories_to_the_experiments(monkeypatch):
    from experiments import all as all_experiments
    from experiments import graph_stats

    seen: list[list[str]] = []
    monkeypatch.setattr(graph_stats, "main", lambda argv: seen.append(argv) or 0)
    assert all_experiments.main(["--quick", "--only", "graph_stats"]) == 0
    assert seen == [["--quick"]]


# ------------------------------------------------------------------ 8. Ctrl-C and SIGTERM (issue 32)
def _as_a_shell_starts_it() -> None:
    """In the child, before exec: SIGINT at its default action, as a shell starts a foreground
    command (a pytest run in the background ignores it, and its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stopped(tmp_path: Path, target: str, *signals: tuple[int, bool]) -> tuple[subprocess.CompletedProcess, Path]:
    """Start a single run whose job sleeps in its algorithm's constructor (``hostile.<target>``),
    wait until its job runs, send it ``signals`` in turn (each ``(signal, to the process group as
    a terminal's Ctrl-C does)``, a second after the one before), and return how it ended."""
    run = tmp_path / "run"
    full = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), str(hostile(tmp_path))])
    cmd = [sys.executable, "-m", "harness", *TINY, f"algo._target_=hostile.{target}", f"hydra.run.dir={run}"]
    p = subprocess.Popen(cmd, cwd=REPO, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_as_a_shell_starts_it)
    try:
        end = time.monotonic() + 120
        while not (run / ".hydra").exists() and p.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        for sig, group in signals:
            time.sleep(1.0)
            (os.killpg if group else os.kill)(p.pid, sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), run


@pytest.mark.parametrize("sig, group, code, line", [
    (signal.SIGINT, True, 130, "interrupted"),    # Ctrl-C in a terminal: the command's whole process group
    (signal.SIGINT, False, 130, "interrupted"),   # kill -INT to the command
    (signal.SIGTERM, False, 143, "terminated (SIGTERM)"),
])
def test_a_stopped_single_run_is_one_line_and_leaves_error_json(tmp_path, sig, group, code, line):
    r, run = _stopped(tmp_path, "stuck", (sig, group))
    assert r.returncode == code and r.stderr.strip().splitlines()[-1] == line, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    err = json.loads((run / "error.json").read_text())
    name = signal.Signals(sig).name
    assert err["interrupted"] == name and name in err["error"] and not (run / "result.json").exists()


def test_a_job_deaf_to_signals_is_killed_at_the_second_ctrl_c(tmp_path):
    """A job that ignores the forwarded Ctrl-C: the second one kills its runner; the command still
    ends with one line and error.json says it was interrupted."""
    r, run = _stopped(tmp_path, "deaf", (signal.SIGINT, True), (signal.SIGINT, True))
    assert r.returncode == 130 and r.stderr.strip().splitlines()[-1] == "interrupted", r.stderr[-3000:]
    assert json.loads((run / "error.json").read_text())["interrupted"] == "SIGINT"


# ------------------------------------------------------------------ 9. outputs that cannot be written (issue 32)
#: a folder no one can write into, root included
UNWRITABLE = Path("/proc/harness-test")


@pytest.mark.parametrize("where", ["unwritable", "a file", "below a file"])
def test_a_run_dir_that_cannot_be_made_is_one_line(tmp_path, where):
    (tmp_path / "file").write_text("x")
    run = {"unwritable": UNWRITABLE / "run", "a file": tmp_path / "file", "below a file": tmp_path / "file" / "run"}[where]
    r = harness(*TINY, f"hydra.run.dir={run}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"error: cannot write the directory {run}: ") and lines[0].endswith("choose another with hydra.run.dir=DIR")


def test_a_sweep_dir_or_default_output_root_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "outputs").write_text("a file where the outputs go")
    r = harness(*TINY, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: cannot write the directory outputs/"), r.stderr[-3000:]
    s = harness("-m", "hydra/launcher=basic", *TINY, f"hydra.sweep.dir={tmp_path / 'outputs'}")
    lines = s.stderr.strip().splitlines()
    wanted = (f"error: cannot write the directory {tmp_path / 'outputs'}: a file is in the way (it, or a folder above it, is a file); "
              "choose another with hydra.sweep.dir=DIR")
    assert s.returncode == 1 and lines == [wanted], s.stderr[-3000:]


def test_collect_into_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    from harness import collect

    (tmp_path / "sweep" / "job").mkdir(parents=True)
    (tmp_path / "sweep" / "job" / "result.json").write_text(json.dumps({"algo": "a", "step_time_s": 1.0}))
    assert collect.main([str(tmp_path / "nothing")]) == 1
    assert collect.main([str(tmp_path / "sweep"), "--out", str(UNWRITABLE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: {tmp_path / 'nothing'} is not a directory")
    assert err[1].startswith(f"error: cannot write results.csv into {UNWRITABLE}: ")


@pytest.mark.parametrize("argv, fragment", [
    (["--out", ""], "argument --out: an empty --out names no directory"),
    (["--out", "{file}"], "argument --out: --out {file} is a file, not a directory"),
    (["--models", "nosuchmodel"], "argument --models: unknown model 'nosuchmodel': the models (conf/model) are alexnet, "),
])
def test_experiment_arguments_that_name_nothing_are_one_line(scratch, tmp_path, capsys, argv, fragment):
    """``--out ''`` is refused (it once meant the default, the committed results/), and so is an
    --out that is a file or a model that does not exist; nothing is written."""
    from experiments import graph_stats, leaderboard

    results, quick = scratch
    (tmp_path / "file").write_text("x")
    for mod in (graph_stats, leaderboard):
        with pytest.raises(SystemExit) as e:
            mod.main([a.format(file=tmp_path / "file") for a in argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and fragment.format(file=tmp_path / "file") in err[0], err
    assert not results.exists() and not quick.exists()


def test_an_experiment_output_dir_that_cannot_be_made_is_one_line(scratch, capsys):
    from experiments.__main__ import main as experiments_main

    assert experiments_main(["graph_stats", "--quick", "--models", "lenet5", "--out", str(UNWRITABLE / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot write the output directory {UNWRITABLE / 'out'} (--out): No such file or directory"]
