"""Compose the config ``python -m harness <overrides>`` would run, without starting a Hydra job
(what experiments and tests build their jobs from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

#: the config tree
CONF = Path(__file__).resolve().parents[2] / "conf"


def compose(overrides: Sequence[str] = ()) -> Any:
    """The config ``python -m harness <overrides>`` would run, without starting a Hydra job."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hcompose(config_name="config", overrides=list(overrides))
