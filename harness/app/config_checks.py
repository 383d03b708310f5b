"""The top-level config checked before a job does any work: every key declared, every value of
the right type and range, so that a misspelt or wrong-typed key is one line naming it instead
of being ignored (``+graph.fuse=true``, ``+foo=bar``) or cast silently (``seed=1.5``).

What is checked here is what the harness itself reads (``conf/config.yaml``): ``seed``,
``precision``, ``resume``, ``debug``, ``graph.*``, ``output.*``, and that each component group
(``model``, ``cluster``, ``algo``, ``costs``, ``sim``) is a config block.  What is inside a
group is its component's to check, when it is built (``build_cluster``, an algorithm's declared
parameters, a model's keys).  A key Hydra itself refuses (``model.batchsize=4`` without ``+``) is
reported with the nearest key by :func:`struct_error_line`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from harness.core.capture import GRANULARITIES, OPTIMIZERS
from harness.core.checks import boolean, did_you_mean, known_keys, non_negative_int, one_of, optional, positive_int
from harness.core.errors import ConfigError
from harness.core.precision import PRECISIONS

#: the config groups: each a block with the ``_target_`` of its component
GROUPS: tuple[str, ...] = ("model", "cluster", "algo", "costs", "sim")

Check = Callable[[Any, str], Any]


def _bool(value: Any, key: str) -> bool:
    return boolean(value, key, ConfigError)


def _choice(*choices: str) -> Check:
    return lambda value, key: one_of(value, key, choices, ConfigError)


#: the keys of ``graph:`` and their checks
GRAPH_KEYS: dict[str, Check] = {
    "granularity": _choice(*GRANULARITIES),
    "optimizer": _choice(*OPTIMIZERS),
    "batch_probe": _bool,
    "colocate_gradients": _bool,
    "precision": _choice(*PRECISIONS),
    "cache": _bool,
}
#: the keys of ``output:`` and their checks
OUTPUT_KEYS: dict[str, Check] = {
    "worth": _bool,
    "trace": _bool,
    "gantt": _bool,
    "trace_max_tasks": lambda value, key: optional(positive_int, value, key, error=ConfigError),
    "quiet": _bool,
}
#: the top-level keys but the groups, and their checks (a block's are its own table)
TOP_KEYS: dict[str, Check] = {
    "seed": lambda value, key: non_negative_int(value, key, ConfigError),
    "precision": _choice(*PRECISIONS),
    "resume": _bool,
    "debug": _bool,
}
BLOCKS: dict[str, dict[str, Check]] = {"graph": GRAPH_KEYS, "output": OUTPUT_KEYS}
#: every key the top level takes (``hydra`` is there when a config is composed with Hydra's own)
KNOWN: tuple[str, ...] = (*GROUPS, *TOP_KEYS, *BLOCKS)


def _plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        out = OmegaConf.to_container(cfg, resolve=True)
        return out if isinstance(out, dict) else {}
    return dict(cfg or {})


def config_groups() -> list[str]:
    """The config groups of ``conf/`` (``model``, ``cluster``, ``cluster/device``, ...): the folders that hold config files."""
    from harness.app.compose import CONF

    return sorted({str(p.parent.relative_to(CONF)) for p in CONF.rglob("*.yaml") if p.parent != CONF})


def not_a_group(key: str) -> str:
    """The line for ``group/name=...`` whose group does not exist (Hydra takes it for a key)."""
    groups = config_groups()
    return f"{key} is not a config group: {did_you_mean(key, groups)}the groups are {', '.join(groups)}"


def check_config(cfg: Any) -> None:
    """Raise a :class:`ConfigError` naming the first top-level key that is unknown (with the
    nearest known one), missing, or of the wrong type or out of range (see the module docstring)."""
    plain = {k: v for k, v in _plain(cfg).items() if k != "hydra"}
    unknown = [str(k) for k in plain if str(k) not in KNOWN]
    if unknown and "/" in unknown[0]:
        raise ConfigError(not_a_group(unknown[0]))
    known_keys(plain, KNOWN, "", ConfigError)
    for group in GROUPS:
        block = plain.get(group)
        if not isinstance(block, Mapping):
            raise ConfigError(f"{group} must be a config block ({group}=NAME picks a file of conf/{group}/), got {block!r}")
    for key, check in TOP_KEYS.items():
        if key in plain:
            check(plain[key], key)
    for name, keys in BLOCKS.items():
        block = plain.get(name)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{name} must be a block of {', '.join(keys)}, got {block!r}")
        known_keys(block, tuple(keys), name, ConfigError)
        for key, value in block.items():
            keys[key](value, f"{name}.{key}")


def struct_error_line(e: BaseException) -> str | None:
    """One line for Hydra's refusal of an override of a key that is not in the config
    (``Could not override 'model.batchsize'`` ... ``Key 'batchsize' is not in struct``): the key,
    the nearest key of its block ("did you mean model.batch_size?") and how to add a new key;
    None for any other error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    x: BaseException | None = e
    while x is not None:
        if isinstance(x, (ConfigAttributeError, ConfigKeyError)) and "not in struct" in str(x) and x.full_key:
            full, key = str(x.full_key), str(x.key)
            if "/" in full:
                return not_a_group(full)
            where = full[: -len(key) - 1] if full.endswith(f".{key}") else ""
            parent = getattr(x, "parent_node", None)
            known = [str(k) for k in parent if str(k) not in ("hydra", "_target_")] if parent is not None else []
            hint = did_you_mean(key, known, f"{where}." if where else "")
            owner = where or "the config"
            add = ""
            if where.split(".")[0] in GROUPS:  # a component may take keys its file does not set
                value = _override_value(e, full)
                add = f"; a key the file does not set is added with a +: +{full}={'VALUE' if value is None else value}"
            return f"{full} is not a key of {owner}: {hint}{owner} takes {', '.join(known)}{add}"
        x = x.__cause__ or x.__context__
    return None


def _override_value(e: BaseException, full: str) -> str | None:
    """The value of the override of ``full`` in Hydra's message ("To append ... use +KEY=VALUE")."""
    marker = f"+{full}="
    for line in str(e).splitlines():
        if marker in line:
            return line.split(marker, 1)[1].strip()
    return None
