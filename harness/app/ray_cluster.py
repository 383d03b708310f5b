"""``hydra/launcher=ray_cluster``: a sweep's jobs as tasks on a running Ray cluster (docs/sweeps.md).

hydra-ray-launcher's ``hydra/launcher=ray`` starts a Ray cluster of its own: it always passes
``object_store_memory`` to ``ray.init``, which Ray refuses when it joins a running cluster.  This
launcher joins one: ``ray.init`` gets the address (``ray://HOST:10001``, Ray Client, from outside
the cluster; ``auto`` or ``HOST:6379`` on one of its nodes) and only the keys the user gave, none
that would size a new cluster.  Token authentication (Ray >= 2.52) is Ray's own business:
``RAY_AUTH_MODE=token`` and the cluster's token (``RAY_AUTH_TOKEN``, or the file
``~/.ray/auth_token``) in the sweep command's environment; a cluster it cannot join is one line
that says so (:class:`~harness.app.launchers.LauncherError`).

A Ray worker starts in its raylet's directory, not the sweep's: each job runs in the directory
the sweep command was started from, so that relative paths (the sweep directory, a
``model.path``) mean what they mean under joblib, and a node that lacks that directory (no shared
filesystem) fails the sweep with one line.  Hydra instantiates launchers only under a
``hydra_plugins.*`` name its registry knows: ``hydra_plugins.harness_launchers.RayClusterLauncher``
names this class there (:func:`harness.app.launchers.register_launchers`).  ``ray`` is imported when the launcher launches, not before, so a sweep without the
extra is told what to install (:func:`harness.app.launchers.launcher_hint`).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.app.launchers import LauncherError

log = logging.getLogger(__name__)

#: ``ray.init`` keys that size a new cluster: Ray refuses them when it joins a running one
SIZING_KEYS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config",
               "_enable_object_reconstruction", "_node_name")
#: what Ray Client's proxy says when the server it forks for a new client dies at birth, now and
#: then (ray-project/ray#63202, open for Ray 2.60): a new attempt gets a new server
CLIENT_SERVER_LOST = "Starting Ray client server failed"
JOIN_ATTEMPTS = 3
AUTH_HINT = ("if the cluster uses token authentication, export RAY_AUTH_MODE=token and its token "
             "(RAY_AUTH_TOKEN=..., which `ray get-auth-token` prints on the head)")


def _plain(node: Mapping[str, Any] | DictConfig | None) -> dict[str, Any]:
    if node is None:
        return {}
    return {str(k): v for k, v in (OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node).items()}


def init_kwargs(init: Mapping[str, Any] | DictConfig | None) -> dict[str, Any]:
    """The ``ray.init`` arguments that join a running cluster: the keys given (null ones
    dropped), ``address`` ``auto`` when none is; a key that would size a new cluster is the
    user's mistake."""
    kwargs = {k: v for k, v in _plain(init).items() if v is not None}
    for key in SIZING_KEYS:
        if key in kwargs:
            raise LauncherError(f"hydra.launcher.ray.init.{key}: Ray refuses it when joining a running cluster, whose own "
                                "`ray start` sizes it; drop it, or start a cluster of the sweep's own with hydra/launcher=ray")
    kwargs.setdefault("address", "auto")
    return kwargs


def join(kwargs: Mapping[str, Any]) -> None:
    """Connect this process to the running cluster ``kwargs`` name (once per process; again
    when Ray Client lost the server it started, :data:`CLIENT_SERVER_LOST`); why it could not,
    on one line."""
    import ray
    from ray.exceptions import RayError

    if ray.is_initialized():
        return
    where = os.environ.get("RAY_ADDRESS") or kwargs["address"]  # Ray lets RAY_ADDRESS win
    for attempt in range(1, JOIN_ATTEMPTS + 1):
        try:
            ray.init(**kwargs)
            return
        except (ConnectionError, TimeoutError, ValueError, TypeError, RuntimeError, RayError) as e:
            if CLIENT_SERVER_LOST in str(e) and attempt < JOIN_ATTEMPTS:
                log.warning("Ray Client lost the server it started for this sweep (ray-project/ray#63202); joining again")
                continue
            lines = [s.strip() for s in str(e).splitlines() if s.strip()] or [type(e).__name__]
            why = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"  # a server's traceback: its last line
            raise LauncherError(f"cannot join the Ray cluster at {where}: {why}; check hydra.launcher.ray.init.address "
                                f"(ray://HOST:10001 from outside the cluster, auto on one of its nodes) and, {AUTH_HINT}") from e


def run_in_directory(cwd: str, hydra_context: HydraContext, sweep_config: DictConfig, task_function: TaskFunction,
                     singleton_state: dict[Any, Any]) -> JobReturn:
    """One job on a Ray worker: Hydra's global state as the launching process had it, the
    directory the sweep was started from, then Hydra's ``run_job``."""
    if not os.path.isdir(cwd):
        raise LauncherError(f"Ray node {socket.gethostname()} has no directory {cwd}, where the sweep was started and "
                            "hydra/launcher=ray_cluster runs its jobs: put it on a filesystem every node of the cluster shares")
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    finally:
        os.chdir(here)


def remote_task(options: Mapping[str, Any] | DictConfig | None) -> Any:
    """:func:`run_in_directory` as a Ray remote function with these ``ray.remote`` options; an
    option Ray does not take, or a value it refuses, is the user's mistake."""
    import ray

    given = _plain(options)
    try:
        return ray.remote(**given)(run_in_directory) if given else ray.remote(run_in_directory)
    except (ValueError, TypeError) as e:
        raise LauncherError(f"hydra.launcher.ray.remote: {e}") from e


class RayClusterLauncher(Launcher):
    """Runs a sweep's jobs as Ray tasks on a running cluster (see the module docstring).
    ``ray.init`` keys come from ``ray.init``, the tasks' ``ray.remote`` options from
    ``ray.remote``, as hydra-ray-launcher's."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep what :meth:`launch` needs."""
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Join the cluster, submit one task per job, and wait for them all."""
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        import ray
        from ray.exceptions import RayTaskError

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        task = remote_task(self.ray_cfg.get("remote"))
        join(init_kwargs(self.ray_cfg.get("init")))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("Ray cluster launcher is launching %d jobs, sweep output dir: %s", len(job_overrides), sweep_dir)
        cwd, refs = os.getcwd(), []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"job_id_for_{idx}"
                sweep_config.hydra.job.num = idx
            refs.append(task.remote(cwd, self.hydra_context, sweep_config, self.task_function, Singleton.get_state()))
        try:
            return [ray.get(ref) for ref in refs]
        except RayTaskError as e:  # a job that could not start there (run_in_directory): its one line
            if isinstance(e.cause, LauncherError):
                raise e.cause from None
            raise
