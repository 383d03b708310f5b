"""What went wrong, on one line: the user's mistake by its culprit (a
:class:`~harness.core.errors.UserError` anywhere in an exception's chain, or Hydra's and
OmegaConf's own errors - a key that is not in the config with the key it was probably meant to
be, a YAML file that does not parse), a bug by its type and message; and what ``error.json``
holds for a job that raised, was stopped (Ctrl-C, SIGTERM) or died.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from harness.app.config_checks import struct_error_line
from harness.app.launchers import launcher_hint
from harness.app.stop_signals import stop_record, stop_signal_of
from harness.core.errors import UserError


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        yield x
        x = x.__cause__ or (None if x.__suppress_context__ else x.__context__)


def user_error(e: BaseException) -> BaseException | None:
    """The exception that says what the user got wrong, or None when ``e`` is a bug: a
    :class:`UserError` anywhere in the chain (Hydra wraps one raised by a component's
    constructor), else Hydra's and OmegaConf's own errors (composition, overrides,
    interpolation, a ``_target_`` that cannot be found) when nothing else is in the chain."""
    import yaml

    chain = list(_chain(e))
    for x in chain:
        if isinstance(x, UserError):
            return x
    config = (HydraException, OmegaConfBaseException, yaml.YAMLError)
    if isinstance(e, config) and all(isinstance(x, (*config, ImportError)) for x in chain):
        return e
    return None


def yaml_error_line(e: BaseException) -> str | None:
    """A YAML file that does not parse (a config file of ``--config-dir``), as ``FILE is not
    valid YAML (line L, column C): PROBLEM``; None when no such error is in ``e``'s chain."""
    import yaml

    for x in _chain(e):
        if isinstance(x, yaml.MarkedYAMLError) and x.problem_mark is not None:
            m = x.problem_mark
            what = f"{x.problem} ({x.context})" if x.context else str(x.problem)
            return f"{m.name} is not valid YAML (line {m.line + 1}, column {m.column + 1}): {what}"
    return None


def one_line(e: BaseException) -> str:
    """An error message on one line: its lines joined, lists after a ``...:`` line with commas,
    without OmegaConf's ``full_key`` / ``object_type`` lines and Hydra's config search path."""
    text, listing = "", False
    for raw in str(e).splitlines():
        s = raw.strip()
        if s.startswith("Config search path:"):
            break
        if not s or s.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        if not text:
            text = s
        elif text.endswith(":"):
            text, listing = f"{text} {s}", True
        else:
            text += f", {s}" if listing else (" " if text[-1] in ".;!?" else "; ") + s
    return text


def _user_error_names() -> set[str]:
    """The names of :class:`UserError` and its subclasses (those imported so far)."""
    names, todo = set(), [UserError]
    while todo:
        c = todo.pop()
        names.add(c.__name__)
        todo.extend(c.__subclasses__())
    return names


def describe(e: BaseException) -> tuple[str, bool]:
    """``e`` on one line, and whether it is the user's mistake (:func:`user_error`): a mistake
    by its culprit's message, a bug by its type and message."""
    for x in _chain(e):  # a launcher whose extra is missing: the pip install to run (harness/app/launchers.py)
        hint = launcher_hint(x)
        if hint is not None:
            return hint, True
    culprit = user_error(e)
    if culprit is not None:
        msg = struct_error_line(culprit) or yaml_error_line(culprit) or one_line(culprit) or type(culprit).__name__
        raised = re.match(r"(\w+) raised while resolving interpolation: ", msg)
        if raised and raised.group(1) in _user_error_names():  # OmegaConf drops the cause and keeps its message
            msg = msg[raised.end():]
        key = getattr(culprit, "full_key", None)
        if type(culprit).__name__ == "MissingMandatoryValue" and key:  # a ??? the user must fill
            msg += f"; give it on the command line: {key}=VALUE"
        return msg, True
    msg = one_line(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__, False


def error_record(e: BaseException, overrides: Sequence[str], digest: str | None) -> dict[str, Any]:
    """What ``error.json`` holds for an exception (for Ctrl-C or SIGTERM: :func:`stop_record`)."""
    line, mistake = describe(e)
    tb = "".join(traceback.format_exception(e))
    sig = stop_signal_of(e)
    if sig is not None:
        return stop_record(sig, line if mistake else None, tb, overrides, digest)
    return {"error": line, "user_error": mistake, "traceback": tb, "overrides": list(overrides), "config_hash": digest}


def unwritable(path: Path, e: OSError, option: str) -> str:
    """One line for a directory that cannot be made or written (``e``), naming the ``option``
    that chose it."""
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        why = "a file is in the way (it, or a folder above it, is a file)"
    elif isinstance(e, PermissionError) or e.errno == errno.EROFS:
        why = "no permission to write there (a read-only folder?)"
    else:
        why = e.strerror or str(e)
    return f"cannot write the directory {path}: {why}; choose another with {option}=DIR"


#: the options that name a directory Hydra makes (and writes its log into) before a job starts
DIR_OPTIONS = ("hydra.run.dir", "hydra.sweep.dir")


def named_dir_error(e: BaseException, argv: Sequence[str]) -> str | None:
    """One line (:func:`unwritable`) for an ``OSError`` in ``e``'s chain on a directory that the
    command line ``argv`` named (:data:`DIR_OPTIONS`: Hydra makes it before any job runs), or on
    a folder above or below it; None for any other error."""
    named: dict[str, Path] = {}
    for a in argv:
        key, sep, value = a.lstrip("+").partition("=")
        if sep and key in DIR_OPTIONS and value:
            named[key] = Path(value).absolute()
    for x in _chain(e):
        if isinstance(x, OSError) and x.filename:
            f = Path(os.fsdecode(x.filename)).absolute()
            for key, d in named.items():
                if f == d or f in d.parents or d in f.parents:
                    return unwritable(d, x, key)
    return None


def death_record(code: int, overrides: Sequence[str], digest: str | None) -> dict[str, Any]:
    """What ``error.json`` holds for a job's process that ended without a word (exit status
    ``code``; negative: the signal that killed it)."""
    if code < 0:
        sig = signal.Signals(-code)
        why = f"the job's process was killed by {sig.name}" + (" (out of memory?)" if sig == signal.SIGKILL else "")
    else:
        why = f"the job's process exited with status {code} without writing a result"
    return {"error": why, "user_error": False, "traceback": "", "overrides": list(overrides), "config_hash": digest}
