"""harness: automatic parallelization of DNN training, measured.

``harness.core`` is the core ring (graph IR, capture, clusters, costs, strategy) and
``harness.app`` the app ring (the job runner, collect, compare, the measurement tools); the
modules beside them here are the commands (``python -m harness``, ``python -m harness.collect``,
...).  ``harness.run(cfg)`` is :func:`harness.app.run.run`, imported when first asked for, so
that importing the core never imports the app ring."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "run":
        from harness.app.run import run

        return run
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
