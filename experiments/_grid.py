"""Running many (model, cluster, algorithm) jobs in worker processes with a time limit each.

The parent captures every graph once (memoised by the model source), then forks one worker
per job, so a worker starts with the graphs in memory; a job that exceeds its limit is
terminated and recorded as a timeout, one that raises as an error with its message:
nothing already computed is lost, and the table says why a cell is empty.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tqdm import tqdm


@dataclass(frozen=True)
class Job:
    key: tuple[tuple[str, str], ...]  # (column, value) pairs that identify the job in the table
    overrides: tuple[str, ...]
    fn: Callable[[Sequence[str]], dict[str, Any]] | None = None  # this job's own runner (else run_jobs')


def _worker(conn: Any, fn: Callable[[Sequence[str]], dict[str, Any]], overrides: Sequence[str]) -> None:
    try:
        conn.send(("ok", fn(overrides)))
    except BaseException as e:  # noqa: BLE001 - the parent records what went wrong
        conn.send(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", traceback.format_exc()))
    finally:
        conn.close()


def run_jobs(jobs: Iterable[Job], fn: Callable[[Sequence[str]], dict[str, Any]], timeout_s: float, workers: int = 2,
             desc: str = "jobs") -> list[dict[str, Any]]:
    """Run ``fn(job.overrides)`` for every job in forked workers, at most ``workers`` at a time.

    Each result row gets ``status`` (ok / error / timeout), ``error`` and ``wall_s``.
    """
    from simulators.engine import warm_up

    warm_up()  # forked workers inherit the compiled event loop: no job pays numba's start-up
    ctx = mp.get_context("fork")
    jobs = list(jobs)
    rows: dict[int, dict[str, Any]] = {}
    running: dict[int, tuple[Any, Any, float]] = {}
    todo = list(range(len(jobs)))[::-1]
    bar = tqdm(total=len(jobs), desc=desc, unit="job")
    while todo or running:
        while todo and len(running) < workers:
            i = todo.pop()
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(child, jobs[i].fn or fn, jobs[i].overrides), daemon=True)
            p.start()
            child.close()
            running[i] = (p, parent, time.perf_counter())
        time.sleep(0.02)
        for i, (p, conn, t0) in list(running.items()):
            elapsed = time.perf_counter() - t0
            msg = None
            if conn.poll():
                try:
                    msg = conn.recv()
                except EOFError:
                    msg = ("error", "worker died without a result", "")
            elif not p.is_alive():
                msg = ("error", f"worker exited with code {p.exitcode} (killed for memory?)", "")
            elif elapsed > timeout_s:
                p.terminate()
                msg = ("timeout", f"no result within {timeout_s:g} s", "")
            if msg is None:
                continue
            p.join(5)
            conn.close()
            if msg[0] == "ok":
                row = {**msg[1], "status": "ok", "error": "", "wall_s": elapsed}
            else:
                row = {"status": msg[0], "error": msg[1], "wall_s": elapsed}
            rows[i] = {**dict(jobs[i].key), **row}
            del running[i]
            bar.update(1)
    bar.close()
    return [rows[i] for i in range(len(jobs))]
