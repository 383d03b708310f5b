"""``python -m harness.compare`` (harness.app.compare) and what it reads: two sweeps that
differ by precision, compared job to job and sweep to sweep; collect's override columns,
result.json's config record and ``collect --plot``; one line for every directory that cannot
be compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.app import collect as C
from harness.app.compare import main as compare_main
from tests.helpers import REPO, run_harness

QUIET = ("output.gantt=false", "output.trace=false")


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, Path]:
    """Sweeps A (fp32) and B (amp_fp16) of single_device and round_robin on lenet5, under one root."""
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for name, precision in (("A", "fp32"), ("B", "amp_fp16")):
        sweep = root / name
        r = run_harness("-m", "hydra/launcher=basic", "model=lenet5", "cluster=p100x4", "algo=single_device,round_robin",
                        f"precision={precision}", f"hydra.sweep.dir={sweep}", *QUIET)
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = sweep
    return out


def job(sweep: Path, algo: str) -> Path:
    (d,) = [f.parent for f in sweep.glob("*/result.json") if json.loads(f.read_text())["algo"] == algo]
    return d


def test_two_jobs_print_the_key_that_differs_and_every_ratio(sweeps, capsys):
    a, b = job(sweeps["A"], "round_robin"), job(sweeps["B"], "round_robin")
    assert compare_main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "precision  A='fp32'  B='amp_fp16'" in out and "graph.precision" in out
    assert "algo.name" not in out  # what is the same is not listed
    ra, rb = (json.loads((d / "result.json").read_text()) for d in (a, b))
    lines = {ln.split("  ")[0].strip(): ln.split() for ln in out.splitlines() if ln}
    for label, key in (("step time", "step_time_s"), ("lower bound", "lower_bound_s"), ("bytes moved", "comm_bytes"),
                       ("search time", "search_seconds")):
        assert lines[label][-1] == f"{rb[key] / ra[key]:.3f}", label
    peak = max(rb["peak_memory_bytes"]) / max(ra["peak_memory_bytes"])
    assert lines["peak memory"][-1] == f"{peak:.3f}"
    assert "vs one device" in lines and "vs data parallel" in lines


def test_two_sweeps_are_matched_job_by_job(sweeps, capsys):
    assert compare_main([str(sweeps["A"]), str(sweeps["B"])]) == 0
    out = capsys.readouterr().out
    assert "precision  A: fp32  B: amp_fp16" in out
    block = out.split("step time:\n")[1].split("\n\n")[0].splitlines()
    assert len(block) == 3 and all(("fp32" in ln and "amp_fp16" in ln) for ln in block[1:])
    assert sorted(ln.split()[0] for ln in block[1:]) == ["round_robin", "single_device"]
    assert "without a partner" not in out


def test_result_json_records_the_config_and_collect_has_a_column_per_override(sweeps, tmp_path):
    row = json.loads((job(sweeps["B"], "single_device") / "result.json").read_text())
    assert row["precision"] == "amp_fp16" and row["config"]["precision"] == "amp_fp16"
    assert row["config"]["graph"]["granularity"] == "aten" and row["config"]["seed"] == 0
    assert "output" not in row["config"] and "resume" not in row["config"]
    df = C.collect(sweeps["A"].parent)
    assert set(zip(df["override.algo"], df["override.precision"])) == {
        (a, p) for a in ("single_device", "round_robin") for p in ("fp32", "amp_fp16")}
    assert df["override.model"].eq("lenet5").all() and (df["precision"] == df["config.precision"]).all()
    assert C.main([str(sweeps["A"].parent), "--out", str(tmp_path), "--plot"]) == 0
    for name in ("plot_step_time.png", "plot_speedup_vs_single_device.png", "plot_speedup_vs_data_parallel.png",
                 "plot_search_time.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert pd.read_csv(tmp_path / "results.csv")["override.precision"].nunique() == 2


def test_swept_keys_put_the_algorithm_on_the_x_axis_first():
    from harness.app.plots import swept_keys

    df = pd.DataFrame({"status": ["ok"] * 4, "override.precision": ["a", "a", "b", "b"], "override.algo": ["x", "y", "x", "y"],
                       "override.model": ["m"] * 4})
    assert swept_keys(df) == ["override.algo", "override.precision"]


def bad(a: Path | str, b: Path | str, capsys) -> str:
    assert compare_main([str(a), str(b)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_what_cannot_be_compared_is_one_line(sweeps, tmp_path, capsys):
    a = job(sweeps["A"], "round_robin")
    assert "does not exist" in bad(tmp_path / "nope", a, capsys)
    (tmp_path / "empty").mkdir()
    assert "holds no job" in bad(a, tmp_path / "empty", capsys)
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in bad(tmp_path / "file", a, capsys)
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "error.json").write_text(json.dumps({"error": "boom"}))
    assert "is a job that failed (boom)" in bad(failed, a, capsys)
    assert "compare two job dirs or two sweep dirs" in bad(sweeps["A"], a, capsys)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "result.json").write_text("{not json")
    assert "cannot be read" in bad(corrupt, a, capsys)


def test_the_command(tmp_path):
    r = subprocess.run([sys.executable, "-m", "harness.compare", str(tmp_path / "x"), str(tmp_path / "y")], cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"error: {tmp_path / 'x'} does not exist: give a job dir "
                                                                    "(with result.json) or a sweep dir"]
