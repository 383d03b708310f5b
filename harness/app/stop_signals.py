"""Ctrl-C (SIGINT) and SIGTERM: a job that is stopped says so in its ``error.json``, and the
command ends with one line and status 128 + the signal (130, 143), never a traceback.

Who gets the signal
    A job runs in a runner process forked from the waiting one (:mod:`harness.app.jobs`), in a
    process group of its own (:func:`enter_runner`), so that a terminal's Ctrl-C, which goes
    to the command's group, reaches the waiting process alone; it forwards the signal to the
    runner once (:class:`Forwarding`), and the runner's job ends there: SIGINT raises
    ``KeyboardInterrupt`` in it, SIGTERM :class:`Terminated`; the job writes ``error.json``
    (:func:`stop_record`) and the runner answers.  A second signal, or a runner that has not
    answered within :data:`GRACE_S`, gets the runner killed (SIGKILL); the waiting process then
    writes ``error.json`` itself.  The runner is told when the waiting process dies (SIGTERM,
    ``PR_SET_PDEATHSIG``), so a job never goes on alone.

The command
    ``python -m harness`` turns SIGTERM into :class:`Terminated` while it runs
    (:func:`terminate_raises`); a stop that reaches it - while it waits for a job, or before a
    job started - becomes :class:`Interrupted`, a ``SystemExit`` with the status, which
    ``harness.__main__`` prints as one line.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from types import FrameType
from typing import Any

#: the signals that stop a job with a record of why
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
#: how long a runner has, after a forwarded stop, to record it before it is killed
GRACE_S = 20.0


class Terminated(BaseException):
    """SIGTERM arrived (raised by the handler of :func:`terminate_raises`); a BaseException, as
    ``KeyboardInterrupt`` is, so that no ``except Exception`` takes it for a job's failure."""


class Interrupted(SystemExit):
    """The command was stopped by ``sig``: exits with status 128 + ``sig`` (a SystemExit, so that
    it passes through Hydra untouched); :attr:`line` is what the command prints."""

    def __init__(self, sig: int) -> None:
        self.sig = signal.Signals(sig)
        super().__init__(128 + int(sig))

    @property
    def line(self) -> str:
        """``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``."""
        return "interrupted" if self.sig == signal.SIGINT else f"terminated ({self.sig.name})"


def stop_signal_of(e: BaseException) -> signal.Signals | None:
    """The stop signal an exception stands for (``KeyboardInterrupt``: SIGINT, :class:`Terminated`
    or :class:`Interrupted`: theirs), None for any other."""
    if isinstance(e, Interrupted):
        return e.sig
    if isinstance(e, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(e, Terminated):
        return signal.SIGTERM
    return None


def stop_record(sig: int, detail: str | None, traceback_text: str, overrides: Any, digest: str | None) -> dict[str, Any]:
    """What ``error.json`` holds for a job stopped by ``sig``: ``error`` (``detail`` when the job
    said what it ended - a real run names its ranks - else ``interrupted (SIGINT)`` or
    ``terminated (SIGTERM)``), ``interrupted`` (the signal's name), and like every record the
    traceback (where it was), the overrides and the config hash.  Not a bug: ``user_error`` is true."""
    name = signal.Signals(sig).name
    why = f"{'interrupted' if sig == signal.SIGINT else 'terminated'} ({name})"
    return {"error": detail or why, "user_error": True, "interrupted": name, "traceback": traceback_text,
            "overrides": list(overrides), "config_hash": digest}


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def terminate_raises() -> None:
    """SIGTERM raises :class:`Terminated` in the main thread from now on (no-op elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def enter_runner(parent: int) -> None:
    """In a runner just forked from ``parent``: a process group of its own (a terminal's Ctrl-C
    goes to the waiting process, which forwards it once), SIGINT raising ``KeyboardInterrupt``,
    SIGTERM :class:`Terminated`, and SIGTERM from the kernel when ``parent`` dies."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the runner ends when the pipe closes
        pass
    if os.getppid() != parent:  # died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


class Forwarding:
    """While a process waits for its runner ``pid``: the first SIGINT or SIGTERM it gets is sent
    on to the runner (which records it and answers), a second one, or :data:`GRACE_S` without an
    answer, kills the runner.  :attr:`signal` is the stop it got, None if none.  Outside the
    main thread (no handler can be set there) nothing changes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signal: signal.Signals | None = None
        self._saved: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:  # asked again: no more waiting
            self._kill()
            return
        self.signal = signal.Signals(signum)
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return
        self._timer = threading.Timer(GRACE_S, self._kill)
        self._timer.daemon = True
        self._timer.start()

    def __enter__(self) -> "Forwarding":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
