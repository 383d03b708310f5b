"""Checks of the values a config gives: finite numbers, positive or non-negative ones, fractions
of one, numbers in a closed range, integers and counts, booleans, one of a few names, and
:func:`optional` for a key whose ``null`` means "none" or "the default"; :func:`known_keys` refuses a
key a block does not take, with the nearest one it does ("did you mean").  Each returns the value
converted or raises the given :class:`~harness.core.errors.UserError` subclass with a message that
names the key.  A bool is never a number here (``true`` is not 1), and NaN or infinity never
passes a number check."""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from harness.core.errors import OptionError, UserError

T = TypeVar("T")


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


def non_negative_int(value: Any, key: str, error: type[UserError] = OptionError) -> int:
    """``value`` as an int >= 0 (a seed, a number of rounds, a device id), else ``error`` naming ``key``."""
    n = _as_int(value)
    if n is None or n < 0:
        raise error(f"{key} must be an integer >= 0, got {value!r}")
    return n


def number_in(value: Any, key: str, lo: float, hi: float, error: type[UserError] = OptionError) -> float:
    """``value`` as a float in the closed range [lo, hi] (a threshold, a decay), else ``error`` naming ``key``."""
    x = _finite(value, key, f"in [{lo:g}, {hi:g}]", error)
    if not lo <= x <= hi:
        raise error(f"{key} must be in [{lo:g}, {hi:g}], got {value!r}")
    return x


def boolean(value: Any, key: str, error: type[UserError] = OptionError) -> bool:
    """``value`` when it is ``true`` or ``false`` (a string such as ``"no"`` or a number is refused:
    ``bool("no")`` would be true), else ``error`` naming ``key``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise error(f"{key} must be true or false, got {value!r}")


def one_of(value: Any, key: str, choices: Sequence[Any], error: type[UserError] = OptionError) -> Any:
    """``value`` when it is one of ``choices`` (names, or ``None`` where listed), else ``error``
    naming ``key`` and the choices."""
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        shown = ", ".join("null" if c is None else str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
        raise error(f"{key} must be one of {shown}; got {value!r}")
    return value


def optional(check: Callable[..., T], value: Any, key: str, *args: Any, error: type[UserError] = OptionError) -> T | None:
    """``None`` for ``None`` (the key's "none" or "default"), else ``check(value, key, *args, error)``."""
    return None if value is None else check(value, key, *args, error)


def did_you_mean(key: str, known: Sequence[str], prefix: str = "", aliases: Mapping[str, str] | None = None) -> str:
    """``"did you mean <prefix><near>? "`` for the known key nearest ``key`` (by spelling, case
    aside, or by one of the ``aliases``: other words for a key, such as ``bandwidth`` for
    ``bw_GBps``), ``""`` when none is near."""
    by_word = {k.lower(): k for k in known}
    by_word.update({a.lower(): k for a, k in (aliases or {}).items() if k in known and a.lower() not in by_word})
    near = difflib.get_close_matches(str(key).lower(), list(by_word), n=1)
    return f"did you mean {prefix}{by_word[near[0]]}? " if near else ""


def known_keys(given: Iterable[Any], known: Sequence[str], where: str, error: type[UserError] = OptionError,
               aliases: Mapping[str, str] | None = None) -> None:
    """Refuse the first key of ``given`` that is not in ``known``: ``error`` naming it by its full
    path ``<where>.<key>`` (the key alone when ``where`` is empty), the nearest known key
    (:func:`did_you_mean`) and the keys ``where`` takes."""
    for k in given:
        if str(k) not in known:
            prefix = f"{where}." if where else ""
            owner = where or "the config"
            raise error(f"{prefix}{k} is not a key of {owner}: {did_you_mean(str(k), known, prefix, aliases)}"
                        f"{owner} takes {', '.join(known)}")
