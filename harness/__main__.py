"""``python -m harness``: the Hydra shell around :func:`harness.app.run.run`.

Every job runs in a process of its own and writes into its own directory (see
:mod:`harness.app.jobs`): ``result.json`` last, or ``error.json`` if it failed.  In a sweep
(``-m``), a job whose config hash already has a ``result.json`` anywhere under the sweep dir
is skipped (the sweep dir is named by the command's overrides, so running the same sweep
command again resumes it; ``resume=false`` starts a fresh sweep dir), a job never replaces
another job's ``result.json`` (a single run whose ``hydra.run.dir`` holds one is refused in one
line), a failed job lets the others run, and the sweep ends with ``N ok, M
failed, K skipped`` and exits 1 if a job failed.  An error that is the user's (a config that
does not compose, a misspelt override, a :class:`~harness.core.errors.UserError`) ends the command
with one line on stderr and status 1; ``HYDRA_FULL_ERROR=1`` or ``debug=true`` shows the
traceback, which a bug always shows.  Ctrl-C ends it with ``interrupted`` and status 130,
SIGTERM with ``terminated (SIGTERM)`` and status 143, a job that was running leaving an
``error.json`` that says so (:mod:`harness.app.stop_signals`).
"""

from __future__ import annotations

import os
import re
import sys

import hydra
from omegaconf import DictConfig

from harness.app.error_lines import describe, named_dir_error
from harness.app.jobs import JobFailed, JobOutcome, run_job
from harness.app.launchers import register_launchers
from harness.app.stop_signals import Interrupted, Terminated, stop_signal_of, terminate_raises


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> JobOutcome:
    """One job (:func:`harness.app.jobs.run_job`)."""
    return run_job(cfg)


def cli() -> None:
    """Run :func:`main` and report its errors: Hydra is made to raise its own (it would print
    them over many lines), and they come back here with a single run's failure."""
    asked = os.environ.get("HYDRA_FULL_ERROR") == "1" or any(re.fullmatch(r"\+{0,2}debug=true", a, re.I) for a in sys.argv[1:])
    os.environ["HYDRA_FULL_ERROR"] = "1"
    terminate_raises()
    register_launchers()
    try:
        main()
    except (Interrupted, KeyboardInterrupt, Terminated) as e:  # Ctrl-C, SIGTERM: one line, 128 + the signal
        stop = e if isinstance(e, Interrupted) else Interrupted(stop_signal_of(e) or 2)
        sys.stderr.write(stop.line + "\n")
        raise SystemExit(stop.code) from None
    except JobFailed as e:
        if e.traceback_wanted(asked):
            sys.stderr.write(e.record["traceback"])
            raise SystemExit(1) from None
        raise
    except Exception as e:
        line, mistake = describe(e)
        if not mistake:  # Hydra could not make or write a directory the command line named
            named = named_dir_error(e, sys.argv[1:])
            line, mistake = (named, True) if named else (line, mistake)
        if asked or not mistake:
            raise
        raise SystemExit(f"error: {line}") from None


if __name__ == "__main__":
    cli()
