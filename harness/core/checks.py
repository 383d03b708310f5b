"""Checks of the values a config gives: finite numbers, positive or non-negative ones, fractions
of one, integers and counts.  Each returns the value converted or raises the given
:class:`~harness.core.errors.UserError` subclass with a message that names the key."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.core.errors import OptionError, UserError


def _finite(value: Any, key: str, rule: str, error: type[UserError]) -> float:
    """``value`` as a float, or ``error`` naming ``key`` when it is not a finite number."""
    try:
        x = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise error(f"{key} must be a finite number {rule}, got {value!r}")
    return x


def positive_number(value: Any, key: str, error: type[UserError] = OptionError) -> float:
    """``value`` as a float > 0 (a bandwidth, a peak, a memory size), else ``error`` naming ``key``."""
    x = _finite(value, key, "> 0", error)
    if x <= 0:
        raise error(f"{key} must be > 0, got {value!r}")
    return x


def non_negative_number(value: Any, key: str, error: type[UserError] = OptionError) -> float:
    """``value`` as a float >= 0 (a latency, a launch overhead), else ``error`` naming ``key``."""
    x = _finite(value, key, ">= 0", error)
    if x < 0:
        raise error(f"{key} must be >= 0, got {value!r}")
    return x


def unit_fraction(value: Any, key: str, error: type[UserError] = OptionError) -> float:
    """``value`` as a float in (0, 1] (an efficiency), else ``error`` naming ``key``."""
    x = _finite(value, key, "in (0, 1]", error)
    if not 0 < x <= 1:
        raise error(f"{key} must be in (0, 1], got {value!r}")
    return x


def _as_int(value: Any) -> int | None:
    """``value`` as an int when it is one (an integral float or a numeric string too), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return int(x) if math.isfinite(x) and x.is_integer() else None


def integer(value: Any, key: str, error: type[UserError] = OptionError) -> int:
    """``value`` as an int (2.5, ``None`` or ``"abc"`` are refused), else ``error`` naming ``key``."""
    n = _as_int(value)
    if n is None:
        raise error(f"{key} must be an integer, got {value!r}")
    return n


def positive_int(value: Any, key: str, error: type[UserError] = OptionError) -> int:
    """``value`` as an int >= 1 (a count: GPUs, nodes, a batch size), else ``error`` naming ``key``."""
    n = _as_int(value)
    if n is None or n < 1:
        raise error(f"{key} must be an integer >= 1, got {value!r}")
    return n
