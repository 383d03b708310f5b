"""Sweeps through the cluster launchers: a 4-job sweep on a local Ray cluster
(hydra-ray-launcher, ``pip install -e '.[ray]'``) and through submitit's local executor (the
same plugin as ``hydra/launcher=submitit_slurm``, ``pip install -e '.[slurm]'``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _installed(plugin: str) -> bool:
    try:
        return importlib.util.find_spec(f"hydra_plugins.{plugin}") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not _installed("hydra_ray_launcher"), reason="hydra-ray-launcher is not installed (pip install -e '.[ray]')")
def test_four_job_sweep_on_a_local_ray_cluster(tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
         "model=lenet5", "algo=single_device,round_robin,m_topo,data_parallel", f"hydra.sweep.dir={sweep}",
         "output.gantt=false", "output.trace=false"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(f.read_text()) for f in sorted(sweep.glob("*/result.json"))]
    assert sorted(x["algo"] for x in rows) == ["data_parallel", "m_topo", "round_robin", "single_device"]
    assert all(x["step_time_s"] > 0 for x in rows)


@pytest.mark.skipif(not _installed("hydra_submitit_launcher"), reason="hydra-submitit-launcher is not installed (pip install -e '.[slurm]')")
def test_sweep_through_submitit(tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=submitit_local", "model=lenet5", "algo=single_device,m_topo",
         f"hydra.sweep.dir={sweep}", "output.gantt=false", "output.trace=false"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list(sweep.glob("*/result.json"))) == 2
