"""How ``python -m harness`` runs a job, where it writes, and how it says what went wrong.

Directories
    A single run's directory (``hydra.run.dir``) is made by ``${harness.fresh_dir:PATH}``:
    ``mkdir`` (atomic), with ``-2``, ``-3``, ... appended while PATH is taken, so two runs
    started in the same second never share one.  A sweep's directory (``hydra.sweep.dir``) is
    ``${harness.sweep_dir:${resume}}``: ``multirun/<the sweep's overrides>_<digest>``, named
    by the command's own overrides (sorted; ``hydra.*`` and ``resume`` left out), not by the
    time, so running the same sweep command again lands in the same directory and resumes it;
    with ``resume=false`` the time is appended, a fresh directory.  The name is worked out once
    in the launching process and reaches every job through the config's resolver cache, which
    Hydra's launchers copy into each job's config.  ``${harness.digest:${hydra.overrides.task}}``
    (8 hex digits of the sorted overrides) names a job by what was asked of it: a sweep job's
    directory is its model, algorithm, cluster and this digest, not its position in the sweep,
    so re-running a sweep with another value list never lands in another configuration's
    directory.  Hydra writes no ``.hydra/`` (``hydra.output_subdir: null``): :func:`run_job`
    writes it for a job that runs, and a job that a resumed sweep skips touches nothing.

    A job never replaces another job's ``result.json``: it holds a lock on its directory
    (``.job.lock``, ``lockf``) while it runs, and a directory that is locked or already holds
    a ``result.json`` is not its to write.  A sweep job then writes beside it (``-2``,
    ``-3``, ...: the sweep re-run after an input file changed keeps the old input's result);
    a single run whose ``hydra.run.dir`` is taken ends with one line naming the directory and
    writes nothing (:class:`RunDirTaken`).

A job's process
    The Hydra process (or the joblib worker) runs no job itself: it hands its jobs, one after
    the other, to a runner process forked from it (:class:`JobRunner`), and waits.  A job that
    raises or calls ``sys.exit`` leaves ``error.json`` (and the runner goes on); one that kills
    the runner (SIGKILL, the out-of-memory killer, ``os._exit``) too, written by the waiting
    process, and the next job forks a new runner.  Either way no ``result.json``, and the other
    jobs of a sweep never notice: a joblib worker never dies, so loky never breaks its pool and
    the jobs running beside keep their results.  The jobs of a runner share its caches (a
    model is captured once), as jobs of one process always have.  The runner has a process
    group of its own: Ctrl-C and SIGTERM reach the waiting process, which forwards them once
    (:mod:`harness.app.stop_signals`); the job records that it was stopped in ``error.json``
    and the command ends with ``interrupted`` (status 130) or ``terminated (SIGTERM)`` (143).

Outcome
    ``result.json`` exists only for a job whose outputs were all written
    (:func:`harness.app.run.write_outputs` writes it last, atomically); a failed job writes
    ``error.json``: the error on one line, whether it is the user's mistake, the traceback.  A
    sweep prints ``N ok, M failed, K skipped`` when it ends and exits 1 if a job failed
    (:class:`SweepSummary`, a Hydra callback registered in ``conf/config.yaml``); a single run
    that failed exits 1 with ``error: <the culprit>`` on stderr (:class:`JobFailed`), its
    traceback with ``HYDRA_FULL_ERROR=1`` or ``debug=true``, and always for a bug (an
    exception that is neither a :class:`~harness.core.errors.UserError` nor a config error).

A directory that cannot be made or written (a read-only folder, a file in the way) ends the
command with one line naming it and the option that chose it (:func:`unwritable`); a model,
algorithm or cluster name is put in a directory name through ``${harness.safe:...}``
(:func:`path_safe`), so that no name leaves the output root.

This module registers its resolvers when imported: ``harness.__main__`` imports it, and a
joblib worker imports it when it unpickles the task function or the callback, before Hydra
resolves the job's directory there.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import fcntl
import json
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.core.errors import OutputError, UserError
from harness.app.error_lines import death_record, describe as describe, error_record, unwritable
from harness.app.stop_signals import Forwarding, Interrupted, Terminated, enter_runner, stop_record, stop_signal_of
from harness.app.run import config_hash, run, write_json_atomic, write_outputs, write_plan
from harness.app.summary import format_summary

log = logging.getLogger("harness")

#: what a job's outcome is called in the sweep summary
OK, FAILED, SKIPPED = "ok", "failed", "skipped"


def overrides_digest(overrides: Sequence[str]) -> str:
    """8 hex digits naming a set of overrides (their order does not matter)."""
    return hashlib.sha256("\n".join(sorted(map(str, overrides))).encode()).hexdigest()[:8]


def fresh_dir(path: str) -> str:
    """Create ``path`` (or ``path-2``, ``path-3``, ... if taken) and return the one created."""
    base = p = Path(path)
    k = 1
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                p.mkdir()
                return str(p)
            except FileExistsError:
                k += 1
                p = base.with_name(f"{base.name}-{k}")
    except OSError as e:  # a read-only folder, a file in the way: the user's to fix
        raise OutputError(unwritable(p, e, "hydra.run.dir")) from e


#: sweep overrides that do not name the sweep: Hydra's own, and whether to resume
UNNAMED_KEYS = ("hydra", "resume")


def sweep_overrides(argv: Sequence[str]) -> list[str]:
    """The overrides of a command line that say what a sweep computes: ``key=value`` arguments,
    sorted, without flags (``-m``) and :data:`UNNAMED_KEYS` (``hydra.sweep.dir=...``,
    ``hydra/launcher=basic``, ``resume=false``)."""
    out = []
    for a in argv:
        if a.startswith("-") or "=" not in a:
            continue
        key = a.split("=", 1)[0].lstrip("+~")
        if key.split(".", 1)[0].split("/", 1)[0] in UNNAMED_KEYS:
            continue
        out.append(a)
    return sorted(out)


def sweep_dir(resume: Any = True, argv: Sequence[str] | None = None, root: str = "multirun") -> str:
    """A sweep's directory, named by its overrides (:func:`sweep_overrides` of ``argv``, by
    default this command's): ``<root>/<overrides>_<digest>``; with ``resume`` false the time is
    appended, so the sweep starts afresh in a directory of its own."""
    ov = sweep_overrides(sys.argv[1:] if argv is None else argv)
    slug = re.sub(r"[^A-Za-z0-9=,.+_-]+", "_", "_".join(ov))[:80] or "defaults"
    name = f"{slug}_{overrides_digest(ov)}"
    if str(resume).lower() in ("false", "0", "no"):
        name += time.strftime("_%Y-%m-%d_%H-%M-%S")
    return f"{root}/{name}"


def path_safe(name: Any) -> str:
    """``name`` (a model, algorithm or cluster name) as a piece of a directory name that cannot
    leave the output root: every character but ``A-Za-z0-9._-`` (a ``/`` above all) becomes
    ``_``, as do runs of dots (``..``) and a leading dot; at most 64 characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name))
    safe = re.sub(r"\.{2,}|^\.", "_", safe)
    return safe[:64] or "_"


OmegaConf.register_new_resolver("harness.digest", overrides_digest, replace=True)
OmegaConf.register_new_resolver("harness.safe", path_safe, replace=True)
# cached: worked out once in the launching process; Hydra copies the cache into every job's config
OmegaConf.register_new_resolver("harness.sweep_dir", lambda resume=True: sweep_dir(resume), use_cache=True, replace=True)
# cached: Hydra may resolve hydra.run.dir more than once, and it must be one directory
OmegaConf.register_new_resolver("harness.fresh_dir", fresh_dir, use_cache=True, replace=True)


# ---------------------------------------------------------------------------- outcomes
def record_stop(sig: int, outdir: Path, overrides: Sequence[str], digest: str | None) -> None:
    """Leave ``error.json`` saying that ``sig`` stopped the job, unless the job wrote its own
    outcome (its error record, or a result it finished just then)."""
    if (outdir / "result.json").exists() or (outdir / "error.json").exists():
        return
    write_json_atomic(outdir / "error.json", stop_record(sig, None, "", overrides, digest))


class JobFailed(SystemExit):
    """A single run failed and wrote ``error.json``: exits with status 1 and ``error: ...`` (the
    wrapper in ``harness.__main__`` prints the traceback instead when asked, or for a bug).  A
    SystemExit, so that it passes through Hydra, which would add a line of its own."""

    def __init__(self, record: dict[str, Any], debug: bool) -> None:
        super().__init__(f"error: {record['error']}")
        self.record = record
        self.debug = debug

    def traceback_wanted(self, asked: bool) -> bool:
        """Whether the traceback, not the one line, is the report: asked for, or a bug."""
        return bool(self.record["traceback"]) and (asked or self.debug or not self.record["user_error"])


# ---------------------------------------------------------------------------- a job
@dataclass(frozen=True)
class JobOutcome:
    """What the task function returns: ``status`` (ok / failed / skipped), the directory that
    holds the job's result or error, and the step time of a result."""

    status: str
    output_dir: str
    step_time_s: float | None = None


def finished_job(sweep_dir: Path, digest: str) -> Path | None:
    """A result.json under ``sweep_dir`` written by a job with this config hash."""
    for f in sorted(sweep_dir.glob("**/result.json")):
        try:
            if json.loads(f.read_text()).get("config_hash") == digest:
                return f
        except (OSError, ValueError, AttributeError):
            continue
    return None


@dataclass
class Job:
    """One job as its runner process gets it: the config, resolved here (the runner's Hydra
    state is another job's), where it writes, and what Hydra set up for it here (logging, the
    environment with ``hydra.job.env_set``, the working directory)."""

    cfg: DictConfig
    outdir: Path
    overrides: list[str]
    digest: str
    log_config: DictConfig | None
    verbose: Any
    env: dict[str, str]
    cwd: str
    #: where the jobs of a sweep share their reference steps (harness.app.worth); None for a single run
    reference_cache: Path | None = None

    def execute(self) -> int:
        """Run the job in this process: 0 with result.json written, 1 with error.json."""
        cfg, outdir = self.cfg, self.outdir
        try:
            os.environ.clear()
            os.environ.update(self.env)
            os.chdir(self.cwd)
            if self.log_config is not None:
                configure_log(self.log_config, self.verbose)
            result = run(cfg, on_plan=lambda plan, graph: write_plan(plan, graph, outdir),
                         reference_cache=self.reference_cache)
            write_outputs(result, outdir, cfg)
        except BaseException as e:  # noqa: BLE001 - sys.exit and Ctrl-C too: the job ends here, the runner goes on
            write_json_atomic(outdir / "error.json", error_record(e, self.overrides, self.digest))
            return 1
        if not cfg.output.get("quiet", False):
            print(format_summary(result.row, result.about))
            print(f"outputs in {outdir}")
        log.info("step %.6g s, search %.3g s -> %s", result.row["step_time_s"], result.row["search_seconds"], outdir)
        return 0


class JobRunner:
    """A process forked from this one that runs this process's jobs one after the other, so
    that they share what a process caches (captured graphs), as they always have; when a job
    kills it, that job alone fails and the next job forks a new runner.  It ends when this
    process closes the pipe (or ends)."""

    def __init__(self) -> None:
        self.pid = 0
        self.conn: Connection | None = None
        #: the stop signal (Ctrl-C, SIGTERM) this process got while the last job ran, None if none
        self.stop_signal: int | None = None

    def run(self, job: Job) -> int:
        """Run ``job`` in the runner; its exit status: 0 (result.json written), 1 (error.json
        written), or how the runner died with it (an exit status, minus a signal).  A stop
        signal meanwhile is forwarded to the runner (:class:`~harness.app.stop_signals.Forwarding`)
        and kept in :attr:`stop_signal`."""
        self.stop_signal = None
        for _ in range(2):
            conn = self.conn or self._start()
            try:
                conn.send(job)
            except OSError:  # it died between jobs (killed while idle): a fresh one takes the job
                self._reap()
                continue
            with Forwarding(self.pid) as fwd:
                try:
                    return int(conn.recv())
                except EOFError:
                    return self._reap()
                finally:
                    self.stop_signal = fwd.signal
        raise RuntimeError("cannot start a job runner process")

    def _start(self) -> Connection:
        ours, theirs = Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the runner: never returns
            ours.close()
            try:
                enter_runner(parent)
                while True:
                    try:
                        job = theirs.recv()
                    except EOFError:
                        break
                    code = job.execute()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    theirs.send(code)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.conn = pid, ours
        return ours

    def _reap(self) -> int:
        """Wait for a dead runner; its exit status (minus the signal that killed it)."""
        assert self.conn is not None
        self.conn.close()
        self.conn = None
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


#: this process's job runner
RUNNER = JobRunner()


def _write_hydra_record(outdir: Path, cfg: DictConfig) -> None:
    """``.hydra/``: what Hydra writes for a job (config.yaml, hydra.yaml, overrides.yaml)."""
    d = outdir / ".hydra"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (d / "hydra.yaml").write_text(OmegaConf.to_yaml(HydraConfig.instance().cfg))
    (d / "overrides.yaml").write_text(OmegaConf.to_yaml(HydraConfig.get().overrides.task))


def _resolved(cfg: DictConfig) -> DictConfig:
    """A copy of a config with every interpolation resolved."""
    out = copy.deepcopy(cfg)
    OmegaConf.resolve(out)
    return out


class RunDirTaken(UserError):
    """A single run's ``hydra.run.dir`` holds another job's ``result.json``, or a job running now."""


#: the file a running job holds a lock on, in its directory
LOCK_FILE = ".job.lock"


def claim_dir(outdir: Path, beside: bool) -> tuple[Path, int]:
    """The directory a job writes into and the descriptor of the lock it holds on it while it
    runs (close it when the job ends): ``outdir``, unless a job running now holds its lock or it
    already holds a ``result.json``; then, with ``beside``, the first free ``outdir-2``,
    ``outdir-3``, ..., and without, :class:`RunDirTaken`."""
    path, k = outdir, 1
    while True:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            busy = False
        except OSError as e:
            busy = e.errno in (errno.EACCES, errno.EAGAIN)  # any other: a file system without locks, go on unlocked
        if not busy and not (path / "result.json").exists():
            return path, fd
        os.close(fd)
        why = "is in use by a job running now" if busy else "already holds another job's result.json"
        if not beside:
            raise RunDirTaken(f"hydra.run.dir={path} {why}: give this run another hydra.run.dir, or leave it out "
                              "(every run then gets a new directory)")
        k += 1
        path = outdir.with_name(f"{outdir.name}-{k}")


def run_job(cfg: DictConfig) -> JobOutcome:
    """The task of ``python -m harness``: skip the job (a resumed sweep that already has a
    result for its config hash) or run it in this process's :data:`RUNNER`, in a directory of
    its own (:func:`claim_dir`), and say how it went.  In a sweep it never raises; a single run
    that failed raises :class:`JobFailed`."""
    hc = HydraConfig.get()
    outdir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    sweeping = hc.mode == RunMode.MULTIRUN
    digest: str | None = None
    try:
        digest = config_hash(cfg)
        done = finished_job(Path(hc.sweep.dir), digest) if sweeping and cfg.get("resume", True) else None
        if done is not None:
            log.info("skipping: this config (hash %s) already has %s", digest, done)
            return JobOutcome(SKIPPED, str(done.parent), json.loads(done.read_text()).get("step_time_s"))
        try:
            outdir, lock = claim_dir(outdir, beside=sweeping)
        except OSError as e:
            raise OutputError(unwritable(outdir, e, "hydra.sweep.dir" if sweeping else "hydra.run.dir")) from e
        try:
            (outdir / "error.json").unlink(missing_ok=True)  # an earlier failed attempt's outcome is not this one's
            _write_hydra_record(outdir, cfg)
            logging_cfg = None if hc.job_logging is None else OmegaConf.create(OmegaConf.to_container(hc.job_logging, resolve=True))
            refs = Path(hc.sweep.dir) / ".references" if sweeping else None
            code = RUNNER.run(Job(_resolved(cfg), outdir, overrides, digest, logging_cfg, hc.verbose, dict(os.environ), os.getcwd(), refs))
        finally:
            os.close(lock)
    except (KeyboardInterrupt, Terminated) as e:  # stopped before its runner had the job
        sig = stop_signal_of(e)
        assert sig is not None
        with contextlib.suppress(OSError):
            if outdir.is_dir():
                write_json_atomic(outdir / "error.json", error_record(e, overrides, digest))
        raise Interrupted(sig) from None
    except OutputError as e:  # no directory to write error.json into: the line is the record
        record = error_record(e, overrides, digest)
        if sweeping:
            log.error("job failed (%s)", record["error"])
            return JobOutcome(FAILED, str(outdir))
        raise JobFailed(record, debug=bool(cfg.get("debug", False))) from None
    except RunDirTaken as e:  # the directory is another job's: nothing is written into it
        raise JobFailed(error_record(e, overrides, digest), debug=bool(cfg.get("debug", False))) from None
    except Exception as e:  # noqa: BLE001 - e.g. a config that does not resolve: this job fails, not the sweep
        record = error_record(e, overrides, digest)
        write_json_atomic(outdir / "error.json", record)
    else:
        result, err = outdir / "result.json", outdir / "error.json"
        if RUNNER.stop_signal is not None:
            record_stop(RUNNER.stop_signal, outdir, overrides, digest)
            if not sweeping or multiprocessing.parent_process() is None:  # a joblib worker's job is the sweep's to end
                raise Interrupted(RUNNER.stop_signal)
        if code == 0 and result.exists():
            return JobOutcome(OK, str(outdir), json.loads(result.read_text()).get("step_time_s"))
        if err.exists():
            record = json.loads(err.read_text())
        else:
            record = death_record(code, overrides, digest)
            write_json_atomic(err, record)
    if not sweeping:
        raise JobFailed(record, debug=bool(cfg.get("debug", False)))
    log.error("job failed (%s); error.json in %s; the sweep goes on", record["error"], outdir)
    return JobOutcome(FAILED, str(outdir))


# ---------------------------------------------------------------------------- a sweep
class SweepSummary(Callback):
    """Counts a sweep's jobs by outcome, prints ``N ok, M failed, K skipped`` when the sweep
    ends, and exits 1 if a job failed.  Jobs may end in other processes (joblib workers): each
    appends its outcome as a line to a journal in the sweep dir (``.jobs-*``, removed at the
    end); this object, set up before the launcher copies it to them, names the file."""

    def __init__(self) -> None:
        self.journal: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        try:
            sweep.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".jobs-", dir=sweep)
        except OSError:  # the launcher fails to make it next, and harness.__main__ says so in one line
            return
        os.close(fd)
        self.journal = Path(name)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.journal is None:  # a single run
            return
        value = job_return.return_value if job_return.status == JobStatus.COMPLETED else None
        status = value.status if isinstance(value, JobOutcome) else FAILED
        with open(self.journal, "a") as fh:  # one short write in append mode: lines never interleave
            fh.write(status + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.journal is None:
            return
        counts = Counter(self.journal.read_text().split())
        self.journal.unlink(missing_ok=True)
        print(f"{counts[OK]} ok, {counts[FAILED]} failed, {counts[SKIPPED]} skipped", flush=True)
        if counts[FAILED]:
            raise SystemExit(1)
