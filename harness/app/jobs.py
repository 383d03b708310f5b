"""How ``python -m harness`` runs a job, where it writes, and how it says what went wrong.

Directories
    A single run's directory (``hydra.run.dir``) is made by ``${harness.fresh_dir:PATH}``:
    ``mkdir`` (atomic), with ``-2``, ``-3``, ... appended while PATH is taken, so two runs
    started in the same second never share one.  ``${harness.digest:${hydra.overrides.task}}``
    (8 hex digits of the sorted overrides) names a job by what was asked of it: a sweep job's
    directory is its model, algorithm, cluster and this digest, not its position in the sweep,
    so re-running a sweep with another value list never lands in another configuration's
    directory.  Hydra writes no ``.hydra/`` (``hydra.output_subdir: null``): :func:`run_job`
    writes it for a job that runs, and a job that a resumed sweep skips touches nothing.

A job's process
    The Hydra process (or the joblib worker) runs no job itself: it hands its jobs, one after
    the other, to a runner process forked from it (:class:`JobRunner`), and waits.  A job that
    raises or calls ``sys.exit`` leaves ``error.json`` (and the runner goes on); one that kills
    the runner (SIGKILL, the out-of-memory killer, ``os._exit``) too, written by the waiting
    process, and the next job forks a new runner.  Either way no ``result.json``, and the other
    jobs of a sweep never notice: a joblib worker never dies, so loky never breaks its pool and
    the jobs running beside keep their results.  The jobs of a runner share its caches (a
    model is captured once), as jobs of one process always have.

Outcome
    ``result.json`` exists only for a job whose outputs were all written
    (:func:`harness.app.run.write_outputs` writes it last, atomically); a failed job writes
    ``error.json``: the error on one line, whether it is the user's mistake, the traceback.  A
    sweep prints ``N ok, M failed, K skipped`` when it ends and exits 1 if a job failed
    (:class:`SweepSummary`, a Hydra callback registered in ``conf/config.yaml``); a single run
    that failed exits 1 with ``error: <the culprit>`` on stderr (:class:`JobFailed`), its
    traceback with ``HYDRA_FULL_ERROR=1`` or ``debug=true``, and always for a bug (an
    exception that is neither a :class:`~harness.core.errors.UserError` nor a config error).

This module registers its resolvers when imported: ``harness.__main__`` imports it, and a
joblib worker imports it when it unpickles the task function or the callback, before Hydra
resolves the job's directory there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, Iterator, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.core.errors import UserError
from harness.app.run import config_hash, format_summary, run, write_json_atomic, write_outputs, write_plan

log = logging.getLogger("harness")

#: what a job's outcome is called in the sweep summary
OK, FAILED, SKIPPED = "ok", "failed", "skipped"


def overrides_digest(overrides: Sequence[str]) -> str:
    """8 hex digits naming a set of overrides (their order does not matter)."""
    return hashlib.sha256("\n".join(sorted(map(str, overrides))).encode()).hexdigest()[:8]


def fresh_dir(path: str) -> str:
    """Create ``path`` (or ``path-2``, ``path-3``, ... if taken) and return the one created."""
    base = p = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    k = 1
    while True:
        try:
            p.mkdir()
            return str(p)
        except FileExistsError:
            k += 1
            p = base.with_name(f"{base.name}-{k}")


OmegaConf.register_new_resolver("harness.digest", overrides_digest, replace=True)
# cached: Hydra may resolve hydra.run.dir more than once, and it must be one directory
OmegaConf.register_new_resolver("harness.fresh_dir", fresh_dir, use_cache=True, replace=True)


# ---------------------------------------------------------------------------- errors
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
    chain = list(_chain(e))
    for x in chain:
        if isinstance(x, UserError):
            return x
    config = (HydraException, OmegaConfBaseException)
    if isinstance(e, config) and all(isinstance(x, (*config, ImportError)) for x in chain):
        return e
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


def describe(e: BaseException) -> tuple[str, bool]:
    """``e`` on one line, and whether it is the user's mistake (:func:`user_error`): a mistake
    by its culprit's message, a bug by its type and message."""
    culprit = user_error(e)
    if culprit is not None:
        msg = one_line(culprit) or type(culprit).__name__
        key = getattr(culprit, "full_key", None)
        if type(culprit).__name__ == "MissingMandatoryValue" and key:  # a ??? the user must fill
            msg += f"; give it on the command line: {key}=VALUE"
        return msg, True
    msg = one_line(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__, False


def error_record(e: BaseException, overrides: Sequence[str], digest: str | None) -> dict[str, Any]:
    """What ``error.json`` holds for an exception."""
    line, mistake = describe(e)
    return {"error": line, "user_error": mistake, "traceback": "".join(traceback.format_exception(e)),
            "overrides": list(overrides), "config_hash": digest}


def death_record(code: int, overrides: Sequence[str], digest: str | None) -> dict[str, Any]:
    """What ``error.json`` holds for a job's process that ended without a word (exit status
    ``code``; negative: the signal that killed it)."""
    if code < 0:
        sig = signal.Signals(-code)
        why = f"the job's process was killed by {sig.name}" + (" (out of memory?)" if sig == signal.SIGKILL else "")
    else:
        why = f"the job's process exited with status {code} without writing a result"
    return {"error": why, "user_error": False, "traceback": "", "overrides": list(overrides), "config_hash": digest}


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
            print(format_summary(result.row))
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

    def run(self, job: Job) -> int:
        """Run ``job`` in the runner; its exit status: 0 (result.json written), 1 (error.json
        written), or how the runner died with it (an exit status, minus a signal)."""
        for _ in range(2):
            conn = self.conn or self._start()
            try:
                conn.send(job)
            except OSError:  # it died between jobs (killed while idle): a fresh one takes the job
                self._reap()
                continue
            try:
                return int(conn.recv())
            except EOFError:
                return self._reap()
        raise RuntimeError("cannot start a job runner process")

    def _start(self) -> Connection:
        ours, theirs = Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the runner: never returns
            ours.close()
            try:
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


def run_job(cfg: DictConfig) -> JobOutcome:
    """The task of ``python -m harness``: skip the job (a resumed sweep that already has a
    result for its config hash) or run it in this process's :data:`RUNNER`, and say how it
    went.  In a sweep it never raises; a single run that failed raises :class:`JobFailed`."""
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
        outdir.mkdir(parents=True, exist_ok=True)
        for stale in ("result.json", "error.json"):  # an earlier attempt's outcome is not this one's
            (outdir / stale).unlink(missing_ok=True)
        _write_hydra_record(outdir, cfg)
        logging_cfg = None if hc.job_logging is None else OmegaConf.create(OmegaConf.to_container(hc.job_logging, resolve=True))
        refs = Path(hc.sweep.dir) / ".references" if sweeping else None
        code = RUNNER.run(Job(_resolved(cfg), outdir, overrides, digest, logging_cfg, hc.verbose, dict(os.environ), os.getcwd(), refs))
    except Exception as e:  # noqa: BLE001 - e.g. a config that does not resolve: this job fails, not the sweep
        record = error_record(e, overrides, digest)
        write_json_atomic(outdir / "error.json", record)
    else:
        result, err = outdir / "result.json", outdir / "error.json"
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
        sweep.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".jobs-", dir=sweep)
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
