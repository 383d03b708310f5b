"""Sweeps through the cluster launchers (docs/sweeps.md).

* A missing extra: ``hydra/launcher=ray``, ``ray_cluster`` or ``submitit_*`` without ``pip install
  -e '.[ray]'`` (``'.[slurm]'``) ends in one line that names the install (always run: the extra is
  hidden from the command).
* ``hydra/launcher=ray_cluster`` (harness/app/ray_cluster.py): the ``ray.init`` arguments it joins
  with, why it could not join, on one line; and, with the ray extra, a real head started by ``ray
  start --head`` with token authentication, joined as the docs say (Ray Client from outside the
  cluster, ``RAY_ADDRESS`` on a node of it) by a 2-job sweep each.
* ``hydra/launcher=ray`` (a local cluster of the sweep's own) and submitit's local executor (the
  plugin of ``hydra/launcher=submitit_slurm``) run a sweep, with their extra.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Iterator

import pytest
from hydra.errors import InstantiationException, MissingConfigException

from harness.app.error_lines import describe
from harness.app.launchers import LauncherError, launcher_hint
from harness.app.ray_cluster import JOIN_ATTEMPTS, SIZING_KEYS, init_kwargs, join, remote_task, run_in_directory
from tests.helpers import refused

REPO = Path(__file__).resolve().parents[1]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_ray = pytest.mark.skipif(not (_installed("ray") and _installed("hydra_plugins.hydra_ray_launcher")),
                               reason="the ray extra is not installed (pip install -e '.[ray]')")
needs_submitit = pytest.mark.skipif(not _installed("hydra_plugins.hydra_submitit_launcher"),
                                    reason="the slurm extra is not installed (pip install -e '.[slurm]')")

# ---------------------------------------------------------------------------- a missing extra
#: ``python -m harness ARGS`` with the extras' modules hidden, as in a venv without them
WITHOUT_EXTRAS = """
import runpy, sys
for m in ("ray", "hydra_plugins.hydra_ray_launcher", "submitit", "hydra_plugins.hydra_submitit_launcher"):
    sys.modules[m] = None
sys.argv = ["harness", *sys.argv[1:]]
runpy.run_module("harness", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("launcher, line", [
    ("ray", "error: hydra/launcher=ray needs the ray extra, which is not installed: pip install -e '.[ray]'"),
    ("ray_cluster", "error: the ray extra is not installed (no module named 'ray'): pip install -e '.[ray]'"),
    ("submitit_slurm", "error: hydra/launcher=submitit_slurm needs the slurm extra, which is not installed: pip install -e '.[slurm]'"),
])
def test_a_missing_launcher_extra_names_the_pip_install(tmp_path: Path, launcher: str, line: str) -> None:
    r = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, "-m", f"hydra/launcher={launcher}", "model=lenet5",
                        "algo=single_device", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       cwd=REPO, env={**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [line]
    assert not list(tmp_path.glob("**/result.json"))


def test_launcher_hints_name_only_what_they_know() -> None:
    missing = MissingConfigException("Could not find 'hydra/launcher/ray'", missing_cfg_file="hydra/launcher/ray")
    assert launcher_hint(missing) == "hydra/launcher=ray needs the ray extra, which is not installed: pip install -e '.[ray]'"
    # Hydra's own message stays for a launcher no extra provides, and for a module no extra installs
    assert launcher_hint(MissingConfigException("no", missing_cfg_file="hydra/launcher/bogus")) is None
    assert launcher_hint(MissingConfigException("no", missing_cfg_file="model/ray")) is None
    assert launcher_hint(ModuleNotFoundError("No module named 'rayon'", name="rayon")) is None
    assert launcher_hint(ValueError("another value error")) is None
    # Hydra wraps the import error of a launcher's _target_: describe finds it down the chain
    try:
        try:
            raise ModuleNotFoundError("No module named 'submitit'", name="submitit")
        except ModuleNotFoundError as e:
            raise InstantiationException("Error locating target") from e
    except InstantiationException as wrapped:
        assert describe(wrapped) == ("the slurm extra is not installed (no module named 'submitit'): pip install -e '.[slurm]'", True)
    # the recipe docs/sweeps.md gave before: hydra-ray-launcher with an address
    hint = launcher_hint(ValueError("When connecting to an existing cluster, object_store_memory must not be provided."))
    assert hint is not None and "hydra/launcher=ray_cluster" in hint and "\n" not in hint


# ---------------------------------------------------------------------------- ray_cluster, without a cluster
def test_ray_cluster_joins_with_the_keys_given_and_none_that_size_a_cluster() -> None:
    assert init_kwargs({"address": "auto", "object_store_memory": None}) == {"address": "auto"}
    assert init_kwargs({"namespace": "sweeps"}) == {"namespace": "sweeps", "address": "auto"}
    assert init_kwargs({"address": "ray://head:10001"}) == {"address": "ray://head:10001"}
    for key in SIZING_KEYS:
        refused(lambda key=key: init_kwargs({"address": "auto", key: 1}), f"hydra.launcher.ray.init.{key}", "hydra/launcher=ray",
                kind=LauncherError)


@needs_ray
def test_a_remote_option_ray_refuses_is_one_line() -> None:
    refused(lambda: remote_task({"num_cpu": 2}), "hydra.launcher.ray.remote", "num_cpu", kind=LauncherError)
    assert remote_task({"num_cpus": 2}) is not None and remote_task(None) is not None


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A ``ray`` module whose ``init`` raises the exceptions in ``errors``, one a call; with
    none left, it joins."""
    fake = types.SimpleNamespace(calls=[], errors=[])

    def init(**kwargs: object) -> None:
        fake.calls.append(kwargs)
        if fake.errors:
            raise fake.errors.pop(0)

    exceptions = types.ModuleType("ray.exceptions")
    exceptions.RayError = type("RayError", (Exception,), {})  # type: ignore[attr-defined]
    ray = types.ModuleType("ray")
    ray.init, ray.is_initialized, ray.exceptions = init, lambda: False, exceptions  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return fake


def test_a_cluster_that_cannot_be_joined_is_one_line(fake_ray: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379\n(the GCS refused the token)")
    fake_ray.errors = [refusal, refusal]
    refused(lambda: join({"address": "ray://10.0.0.1:10001"}), "cannot join the Ray cluster at ray://10.0.0.1:10001",
            "Failed to connect to Ray cluster at 10.0.0.1:6379", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN", kind=LauncherError)
    assert fake_ray.calls == [{"address": "ray://10.0.0.1:10001"}]  # a refusal is not tried again
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # Ray lets the environment win over the argument
    refused(lambda: join({"address": "auto"}), "at 10.0.0.2:6379", kind=LauncherError)


#: what Ray Client's proxy answers when the server it forked for the client died (ray-project/ray#63202)
LOST = ("Initialization failure from server:\nTraceback (most recent call last):\n  ...\n"
        "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err for detailed logs.")


def test_joining_again_when_ray_client_loses_its_server(fake_ray: types.SimpleNamespace) -> None:
    fake_ray.errors = [ConnectionAbortedError(LOST) for _ in range(JOIN_ATTEMPTS - 1)]
    join({"address": "ray://10.0.0.1:10001"})
    assert len(fake_ray.calls) == JOIN_ATTEMPTS
    fake_ray.calls.clear()
    fake_ray.errors = [ConnectionAbortedError(LOST) for _ in range(JOIN_ATTEMPTS)]
    refused(lambda: join({"address": "ray://10.0.0.1:10001"}), "Initialization failure from server: ... RuntimeError: Starting Ray "
            "client server failed", kind=LauncherError)
    assert len(fake_ray.calls) == JOIN_ATTEMPTS


def test_a_node_without_the_sweeps_directory_refuses_the_job(tmp_path: Path) -> None:
    refused(lambda: run_in_directory(str(tmp_path / "absent"), None, None, None, {}),  # type: ignore[arg-type]
            str(tmp_path / "absent"), "shares", kind=LauncherError)


# ---------------------------------------------------------------------------- ray_cluster, a real head
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict[str, object]]:
    """A Ray head as docs/sweeps.md starts one, with token authentication, on free ports and in
    temporary directories (short ones: Ray's socket paths must fit 107 characters); it and every
    process it started (one process group) are stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="rayh", dir="/tmp"))
    home, cwd = root / "home", root / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    token = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    gcs, client = _free_port(), _free_port()
    start = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={gcs}", f"--ray-client-server-port={client}",
         "--include-dashboard=false", f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
         f"--temp-dir={root / 'ray'}", "--num-cpus=2", "--disable-usage-stats"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = start.communicate(timeout=180)
        assert start.returncode == 0, out[-3000:]
        yield {"gcs": gcs, "client": client, "token": token, "home": home, "cwd": cwd}
    finally:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(start.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(wait)
        shutil.rmtree(root, ignore_errors=True)


def _sweep(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A 2-job sweep on the cluster, started from a directory of its own with a relative sweep dir."""
    here = tmp_path / "client"
    here.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=ray_cluster", *args, "model=lenet5",
         "algo=single_device,round_robin", "hydra.sweep.dir=sweep", "output.gantt=false", "output.trace=false"],
        cwd=here, env={**env, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    return r, here / "sweep"


def _two_results(r: subprocess.CompletedProcess[str], sweep: Path) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 ok, 0 failed, 0 skipped" in r.stdout
    rows = [json.loads(f.read_text()) for f in sorted(sweep.glob("*/result.json"))]
    assert sorted(x["algo"] for x in rows) == ["round_robin", "single_device"]
    assert all(math.isfinite(x["step_time_s"]) and x["step_time_s"] > 0 for x in rows)


@pytest.mark.slow
@needs_ray
def test_sweep_joins_a_running_cluster_through_ray_client(ray_head: dict[str, object], tmp_path: Path) -> None:
    # another machine: no token file in its home, the token and the mode in the environment
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=str(ray_head["token"]))
    r, sweep = _sweep(tmp_path, env, f"hydra.launcher.ray.init.address=ray://127.0.0.1:{ray_head['client']}")
    _two_results(r, sweep)
    assert not (Path(str(ray_head["cwd"])) / "sweep").exists()  # the jobs ran where the sweep was started


@pytest.mark.slow
@needs_ray
def test_sweep_joins_a_running_cluster_from_one_of_its_nodes(ray_head: dict[str, object], tmp_path: Path) -> None:
    # the head's machine: its token file, the mode, the address in RAY_ADDRESS (address: auto)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(ray_head["home"]), RAY_AUTH_MODE="token", RAY_ADDRESS=f"127.0.0.1:{ray_head['gcs']}")
    _two_results(*_sweep(tmp_path, env))


# ---------------------------------------------------------------------------- the plugins' own launchers
@pytest.mark.slow
@needs_ray
def test_four_job_sweep_on_a_local_ray_cluster(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    home = tmp_path / "home"  # a local ray.init writes ~/.ray/auth_token: not into the user's home
    home.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
         "model=lenet5", "algo=single_device,round_robin,m_topo,data_parallel", f"hydra.sweep.dir={sweep}",
         "output.gantt=false", "output.trace=false"],
        cwd=REPO, env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(f.read_text()) for f in sorted(sweep.glob("*/result.json"))]
    assert sorted(x["algo"] for x in rows) == ["data_parallel", "m_topo", "round_robin", "single_device"]
    assert all(x["step_time_s"] > 0 for x in rows)


@pytest.mark.slow
@needs_submitit
def test_sweep_through_submitit(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=submitit_local", "model=lenet5", "algo=single_device,m_topo",
         f"hydra.sweep.dir={sweep}", "output.gantt=false", "output.trace=false"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list(sweep.glob("*/result.json"))) == 2
