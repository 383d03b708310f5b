"""Launching a real run's ranks (:func:`launch`, :func:`launch_many`: ``spawn`` - torch.multiprocessing -
or ``torchrun``; :func:`write_job` for ``launcher: prepare``), watching them and ending them.

How a run ends
--------------
Every rank writes what it is doing - loading its job, at the rendezvous, building its state,
at a step's barrier, running its ops, waiting for a message from rank q or for a collective -
on a *progress board*, a small file of the launch that every local rank maps into memory
(:class:`~simulators.realrun.board.Progress`: a few memory stores per barrier and per wait, none per op), and the
launcher reads it twice a second.  When the board has not changed for ``rank_timeout_s``
(default 2 minutes), and no rank that is not waiting used any share of its core meanwhile (a
long op computes without a word on the board; a rank blocked in one does not), the run has stalled: the launcher ends every rank and raises a one-line
:class:`RealRunError` naming the ranks that stopped it - the least advanced ones and, of
those, the ones not waiting for the others (a rank stuck in an op, not its peers waiting for
it) - and what each rank was doing (:func:`~simulators.realrun.board.stall_message`).  ``timeout_s``, torch.distributed's
own timeout of an operation, must exceed it: it is the guard of a job run by hand under
torchrun, which no launcher of ours watches.  A rank that fails ends the run at once with its
traceback.  However a launch ends - results, a failed or stalled rank, Ctrl-C
(``KeyboardInterrupt``) or SIGTERM - every rank still running is killed with its process group
(a spawned rank leads its own, which holds its idle spinners; torchrun's agent ends its
workers) before the launcher returns or raises, and the kernel kills a rank whose launcher died
without a word (``PR_SET_PDEATHSIG``).  While ranks run in the main thread, SIGTERM is caught
whatever handler the process had (but an ignored one); once the ranks are ended it goes on to
that handler, and where there was none (the default action) it becomes a ``SystemExit``.  An
interruption is re-raised with a :class:`RealRunError` as its cause that says what was ended,
the one line ``python -m harness`` reports.

Job directories
---------------
A launch writes its sealed job (:mod:`simulators.realrun.sealed`), and its ranks their sealed
records, into a job directory that it marks as its own (:data:`MARKER`).  With ``job_dir: null``
that is a new temporary directory, removed at the end.  A directory the user named
(``sim.job_dir``, ``launcher: prepare``) stays; it must be new, empty, or one a launch marked
earlier - a folder holding anything else is refused, never cleared - and of a marked one only
the files a launch writes (:data:`OURS`) are removed before the next run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from simulators.realrun.board import Watchdog
from simulators.realrun.job import Job, RealRunError
from simulators.realrun.measured import Measured, read_results
from simulators.realrun.sealed import JOB_FILE, KEY_ENV, new_key, plain_unpickle, write_sealed
from simulators.realrun.worker import spawn_entry


#: how often the launcher looks at its ranks and their board (seconds)
POLL_S = 0.5
#: the file that marks a directory as a launch's job directory
MARKER = ".realrun-job"
#: the names a launch and its ranks write into a job directory: the only files ever removed from one
OURS = re.compile(r"(job\.sealed|rank\d+\.(sealed|error)|torchrun\.log|progress|rdzv|\.(job|rank\d+)\.sealed\.\d+\.tmp)")
#: a job's own directory under the root of a launch of several jobs
SUBJOB = re.compile(r"job\d+")


def _mark(d: Path) -> None:
    (d / MARKER).write_text("a real run's job directory (simulators.realrun); the next run here removes the files runs write\n")


def _clear(d: Path) -> None:
    """Remove from the marked job directory ``d`` what launches wrote there (:data:`OURS`, and
    marked job subdirectories), leaving anything else."""
    for f in d.iterdir():
        if f.is_dir() and not f.is_symlink() and SUBJOB.fullmatch(f.name) and (f / MARKER).is_file():
            _clear(f)
            (f / MARKER).unlink()
            with contextlib.suppress(OSError):  # not empty: it holds something else, which stays
                f.rmdir()
        elif OURS.fullmatch(f.name) and (f.is_symlink() or not f.is_dir()):
            f.unlink()


def job_directory(job_dir: str | None) -> Path:
    """The directory a launch writes its job into: a new temporary one (``job_dir`` None), else
    ``job_dir`` - created if missing, cleared of an earlier launch's files if a launch marked it,
    refused (:class:`RealRunError`, naming it) if it holds anything else."""
    if not job_dir:
        d = Path(tempfile.mkdtemp(prefix="realrun-"))
        _mark(d)
        return d
    d = Path(job_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        if (d / MARKER).is_file():
            _clear(d)
            return d
        foreign = sorted(f.name for f in d.iterdir())
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise RealRunError(f"sim.job_dir={job_dir} is not empty ({shown}) and is no real run's job directory: a run writes its job "
                               "and its ranks' records there and clears them before the next run, so it takes only a new or empty "
                               "directory (or one a real run wrote); name another, or leave sim.job_dir out (a temporary directory)")
        _mark(d)
    except OSError as e:
        raise RealRunError(f"sim.job_dir={job_dir}: cannot use it as a job directory ({e.strerror or e}); name a directory this user "
                           "can write") from None
    return d


def write_job(job: Job, job_dir: str | None, key: str) -> Path:
    """Write ``job`` sealed with ``key`` (:mod:`simulators.realrun.sealed`) into ``job_dir`` (see
    :func:`job_directory`); returns the directory."""
    d = job_directory(job_dir)
    write_sealed(d / JOB_FILE, job, key)
    return d


def _unguarded_script_hint() -> str:
    """Why ranks that died before starting may have died: ``spawn`` re-runs the caller's script
    in every rank, and a script that calls ``harness.app.run`` at its top level starts ranks again
    there, which multiprocessing refuses during a child's start-up."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        return ""  # python -m ... or an interactive session: nothing is re-run
    try:
        guarded = "__main__" in Path(path).read_text(errors="replace")
    except OSError:
        return ""
    if guarded:
        return ""
    return (f"\nThe ranks are started with spawn, which runs the script {path} again in every rank; it has no "
            "`if __name__ == \"__main__\":` guard, so each rank tried to start ranks of its own. Put the call under "
            "that guard, or use sim.launcher=torchrun.")


class _Terminated(BaseException):
    """SIGTERM arrived while ranks were running (raised by :func:`_sigterm_raises`'s handler);
    ``args[0]`` is the handler SIGTERM had before, which gets it once the ranks are ended."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While ranks run, SIGTERM raises :class:`_Terminated` in this thread instead of whatever it
    did before - ending the process at once would leave the ranks to the kernel and the job
    directory behind, and a handler of the caller's runs only once they are ended (see
    :func:`launch_many`).  Only in the main thread (where Python runs handlers), and not where
    SIGTERM is ignored; the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    if before is signal.SIG_IGN:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(before)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _stops_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (the ranks are being ended: a second
    Ctrl-C must not leave half of them running), then reach the handlers they had, in the order
    they came.  Only in the main thread, and not where a signal is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        before = signal.getsignal(sig)
        if before is not signal.SIG_IGN:
            saved[sig] = before
            signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, before in saved.items():
            signal.signal(sig, before if before is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


def _end_ranks(procs: Sequence[Any]) -> None:
    """SIGKILL every spawned rank still running, with its process group (its idle spinners;
    a rank killed before it made its group is killed alone), and reap them all."""
    for p in procs:
        if p.exitcode is None:  # not reaped: its pid is still its own
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError):
                    kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join()


def _rank_failure(rank: int, code: int, error_file: str, dirs: Sequence[Path]) -> str:
    """What is known of a failed rank: a job's traceback (``rank<r>.error``), else the traceback
    torch.multiprocessing saved, else how it ended."""
    errs = sorted(f for d in dirs for f in d.glob("rank*.error"))
    if errs:
        return errs[0].read_text()[-4000:]
    if os.path.exists(error_file) and os.path.getsize(error_file):  # torch.multiprocessing's: a pickled traceback string
        with contextlib.suppress(Exception):
            return str(plain_unpickle(Path(error_file).read_bytes()))[-4000:]
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    return f"rank {rank} {how}{_unguarded_script_hint()}"


def _launch_spawn(jobs: Sequence[Job], dirs: Sequence[Path], root: Path, board: Path, key: str) -> None:
    """Run the ranks with ``torch.multiprocessing`` until they are done, one fails or they
    stall (:class:`Watchdog`); every rank still running is ended however this returns."""
    import multiprocessing.connection

    import torch.multiprocessing as mp

    j0 = jobs[0]
    rdzv = root / "rdzv"
    rdzv.unlink(missing_ok=True)
    watch = Watchdog(board, jobs)
    ctx = mp.start_processes(spawn_entry, args=([str(d) for d in dirs], f"file://{rdzv}", str(board), key), nprocs=j0.world,
                             join=False, start_method="spawn")
    procs = ctx.processes
    try:
        while True:
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                r = failed[0]
                raise RealRunError(f"real run ({j0.world} ranks) failed:\n{_rank_failure(r, procs[r].exitcode, ctx.error_files[r], dirs)}")
            running = [p.sentinel for p in procs if p.exitcode is None]
            if not running:
                return
            multiprocessing.connection.wait(running, timeout=POLL_S)
            watch.check([p.pid for p in procs])
    finally:
        with _stops_deferred():  # a second Ctrl-C must not leave half the ranks running
            _end_ranks(procs)
            for f in ctx.error_files:
                Path(f).unlink(missing_ok=True)


def _launch_torchrun(job: Job, d: Path, board: Path, key: str) -> None:
    """Run one job's ranks under ``python -m torch.distributed.run --standalone`` until they are
    done, fail or stall; however this returns, the agent is gone and has ended its workers."""
    watch = Watchdog(board, [job])
    log = d / "torchrun.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={job.world}", "-m", "simulators.realrun",
           "--progress", str(board), str(d)]
    with open(log, "wb") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, KEY_ENV: key})
    try:
        while True:
            try:
                p.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                watch.check()
    finally:
        with _stops_deferred():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # the agent ends its workers' process groups
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # its workers die with it (PR_SET_PDEATHSIG)
                    p.wait()
    if p.returncode != 0:
        errs = sorted(d.glob("rank*.error"))
        detail = errs[0].read_text()[-4000:] if errs else log.read_text(errors="replace")[-4000:]
        raise RealRunError(f"torchrun real run failed (exit {p.returncode}):\n{detail}")


def launch_many(jobs: Sequence[Job], launcher: str = "spawn", job_dir: str | None = None) -> list[Measured]:
    """Run jobs one after the other on one set of local ranks (``spawn``: torch.multiprocessing,
    one process start for all of them; ``torchrun``: ``python -m torch.distributed.run
    --standalone`` per job) and read back what they measured.

    A run that stalls raises a :class:`RealRunError` naming the ranks that stopped it, Ctrl-C a
    ``KeyboardInterrupt`` and SIGTERM a ``SystemExit`` (or what the process's own SIGTERM handler
    does), each with a :class:`RealRunError` as its cause; every rank has been ended by then, and
    the job directory is removed unless ``job_dir`` named it (then only the launch's own files
    go: the board and the rendezvous file).  See the module docstring."""
    if not jobs:
        return []
    if launcher not in ("spawn", "torchrun"):
        raise RealRunError(f"sim.launcher={launcher} cannot launch a run here: use spawn or torchrun (prepare only writes the job)")
    j0 = jobs[0]
    for j in jobs[1:]:
        if (j.world, j.backend, j.device, j.threads) != (j0.world, j0.backend, j0.device, j0.threads):
            raise RealRunError("jobs launched together must share world size, backend, device and threads per rank")
    key = new_key()
    root = job_directory(job_dir)
    board = root / "progress"
    loopback = j0.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # single host: loopback, whatever the host name resolves to
    try:
        with _sigterm_raises():
            dirs = [write_job(j, str(root if len(jobs) == 1 else root / f"job{k}"), key) for k, j in enumerate(jobs)]
            if launcher == "spawn":
                _launch_spawn(jobs, dirs, root, board, key)
            else:
                for d, j in zip(dirs, jobs):
                    _launch_torchrun(j, d, board, key)
            return [read_results(j, d, launcher, key) for j, d in zip(jobs, dirs)]
    except KeyboardInterrupt:
        line = f"real run interrupted (SIGINT): its {j0.world} ranks were ended"
        raise KeyboardInterrupt(line) from RealRunError(line)
    except _Terminated as e:
        line = f"real run terminated (SIGTERM): its {j0.world} ranks were ended"
        before = e.args[0] if e.args else None
        if callable(before):  # the process's own handler gets the signal now that the ranks are gone
            try:
                before(signal.SIGTERM, None)
            except BaseException as again:
                if again.__cause__ is None:
                    again.__cause__ = RealRunError(line)
                raise
        raise SystemExit(f"error: {line}") from RealRunError(line)
    finally:
        if loopback:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        if job_dir:
            for f in (board, root / "rdzv"):
                f.unlink(missing_ok=True)
        else:
            shutil.rmtree(root, ignore_errors=True)


def launch(job: Job, launcher: str = "spawn", job_dir: str | None = None) -> Measured:
    """Run one job (see :func:`launch_many`)."""
    return launch_many([job], launcher, job_dir)[0]
