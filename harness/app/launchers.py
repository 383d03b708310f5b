"""The sweep launchers that need an optional extra, and what to say when it is missing.

``hydra/launcher=ray`` (a local Ray cluster, hydra-ray-launcher), ``ray_cluster`` (a running
cluster, :mod:`harness.app.ray_cluster`) and ``submitit_*`` (SLURM, hydra-submitit-launcher)
come with ``pip install -e '.[ray]'`` or ``'.[slurm]'``.  Without the extra Hydra cannot find
the launcher's config, or the import of the plugin or of ``ray`` / ``submitit`` fails;
:func:`launcher_hint` turns either into one line that names the ``pip install`` to run.  It
also points the old recipe for joining a cluster (``hydra/launcher=ray`` with an address,
which Ray refuses) to ``hydra/launcher=ray_cluster``.
"""

from __future__ import annotations

from hydra.errors import MissingConfigException

from harness.core.errors import UserError

#: the extra (pyproject.toml's optional dependencies) that brings each plugin's launcher config
#: (``ray_cluster``'s is in conf/: without the extra, its ``import ray`` fails instead)
LAUNCHER_EXTRAS = {
    "ray": "ray",
    "ray_aws": "ray",
    "submitit_local": "slurm",
    "submitit_slurm": "slurm",
}
#: the extra that installs each top-level module a launcher imports
MODULE_EXTRAS = {
    "ray": "ray",
    "hydra_plugins.hydra_ray_launcher": "ray",
    "submitit": "slurm",
    "hydra_plugins.hydra_submitit_launcher": "slurm",
}
#: what Ray says when ``ray.init`` is given a key that sizes a new cluster with an address
RAY_JOIN_REFUSAL = "When connecting to an existing cluster"


#: the launchers the harness defines, by the name their ``conf/hydra/launcher`` file gives as its
#: ``_target_``: Hydra instantiates a launcher only under a name in the ``hydra_plugins``
#: namespace that its plugin registry holds (:func:`register_launchers` puts these there)
OWN_LAUNCHERS = {"hydra_plugins.harness_launchers.RayClusterLauncher": "harness.app.ray_cluster.RayClusterLauncher"}


def register_launchers() -> None:
    """Make Hydra's plugin registry know the harness's own launchers (:data:`OWN_LAUNCHERS`).
    Hydra finds plugins by scanning the ``hydra_plugins`` namespace package, which would mean a
    top-level folder of that name beside the project's own; registering the classes by the
    names their configs use gives the same result from inside the app ring."""
    from hydra.core.plugins import Plugins
    from hydra.utils import get_class

    registry = Plugins.instance().class_name_to_class
    for name, target in OWN_LAUNCHERS.items():
        registry.setdefault(name, get_class(target))


class LauncherError(UserError):
    """A sweep launcher cannot run as configured: its extra is not installed, or it cannot join
    the cluster it was pointed at; the message says what to install or set."""


def install_hint(extra: str) -> str:
    """The command that installs an optional extra of this package."""
    return f"pip install -e '.[{extra}]'"


def _missing_module_extra(name: str) -> str | None:
    for module, extra in MODULE_EXTRAS.items():
        if name == module or name.startswith(module + "."):
            return extra
    return None


def launcher_hint(x: BaseException) -> str | None:
    """One line for an error (one exception of a chain) that a missing launcher extra, or the
    old way of joining a Ray cluster, caused, naming what to run instead; None for any other."""
    missing = x.missing_cfg_file if isinstance(x, MissingConfigException) else None
    if missing and missing.startswith("hydra/launcher/"):
        name = missing.removeprefix("hydra/launcher/")
        if name in LAUNCHER_EXTRAS:
            extra = LAUNCHER_EXTRAS[name]
            return f"hydra/launcher={name} needs the {extra} extra, which is not installed: {install_hint(extra)}"
    if isinstance(x, ModuleNotFoundError) and x.name:
        extra = _missing_module_extra(x.name)
        if extra is not None:
            return f"the {extra} extra is not installed (no module named {x.name!r}): {install_hint(extra)}"
    if isinstance(x, ValueError) and str(x).startswith(RAY_JOIN_REFUSAL):
        return ("hydra/launcher=ray starts a Ray cluster of its own and cannot join a running one "
                f"({x}); join with hydra/launcher=ray_cluster hydra.launcher.ray.init.address=ray://HOST:10001 (docs/sweeps.md)")
    return None
