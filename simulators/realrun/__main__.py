"""``python -m simulators.realrun``: run one rank of a prepared job under torchrun, or print what a
job's ranks measured (``--summary``); see :func:`main`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simulators.realrun.job import RealRunError
from simulators.realrun.measured import read_results
from simulators.realrun.sealed import JOB_FILE, key_from_env, read_sealed
from simulators.realrun.worker import run_rank


#: how a job's ranks are started by hand, for the messages of :func:`main`
_TORCHRUN = "torchrun --nproc-per-node {n} -m simulators.realrun {d}"
#: the variables torchrun sets for its workers that ``env://`` needs
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main(argv: list[str] | None = None) -> int:
    """``torchrun [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT] --nproc-per-node P -m simulators.realrun JOB_DIR``

    Runs one rank of a job written by ``sim.launcher=prepare sim.job_dir=JOB_DIR`` (or by any
    launch), with ``env://`` rendezvous (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT as torchrun
    sets them); each rank writes ``JOB_DIR/rank<r>.sealed``.  ``python -m simulators.realrun --summary
    JOB_DIR`` then prints the measured figures as JSON.  JOB_DIR must be shared by the hosts.
    The job is sealed (:mod:`simulators.realrun.sealed`): ``REALRUN_JOB_KEY`` must hold the key
    the preparing run reported (``realrun_job_key`` in its result.json), for the ranks and for
    ``--summary``.  ``--progress BOARD`` (before JOB_DIR) is the progress board of a launch of
    ours.  A mistake (no JOB_DIR, no job in it, no key or the wrong one, no torchrun environment)
    is one line on stderr and status 2.
    """
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(main.__doc__)
        return 0

    def usage(msg: str) -> int:
        print(f"error: {msg}", file=sys.stderr)
        return 2

    summary = args[:1] == ["--summary"]
    board = args[1] if args[:1] == ["--progress"] and len(args) > 1 else None
    args = args[1:] if summary else args[2:] if board else args
    if len(args) != 1:
        return usage(f"start one rank per device of a prepared job with {_TORCHRUN.format(n='N', d='JOB_DIR')} (JOB_DIR written by "
                     "python -m harness sim=realrun sim.launcher=prepare sim.job_dir=JOB_DIR), or print its figures with "
                     "python -m simulators.realrun --summary JOB_DIR")
    d = Path(args[0])
    if not (d / JOB_FILE).is_file():
        return usage(f"no job in {d} ({d / JOB_FILE} is missing): write one with python -m harness sim=realrun sim.launcher=prepare "
                     f"sim.job_dir={d}")
    try:
        key = key_from_env(d)
        job = read_sealed(d / JOB_FILE, key)
        if summary:
            print(json.dumps(read_results(job, d, "torchrun", key).summary(), indent=1))
            return 0
    except RealRunError as e:
        return usage(str(e))
    missing = [v for v in _TORCHRUN_ENV if v not in os.environ]
    if missing:
        return usage(f"python -m simulators.realrun runs one rank of a job and torchrun starts it ({', '.join(missing)} not set): "
                     f"{_TORCHRUN.format(n=job.world, d=d)} (across hosts add --nnodes, --node-rank and --rdzv-endpoint)")
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != job.world:
        return usage(f"the job in {d} needs {job.world} ranks, torchrun started {world}: {_TORCHRUN.format(n=job.world, d=d)}")
    run_rank([str(d)], rank, int(os.environ.get("LOCAL_RANK", rank)), "env://", board, key)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
