"""What a real run measured (:class:`Measured`), read back from the records its ranks saved
(:func:`read_results`); see :mod:`simulators.realrun` for the figures' definitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulators.realrun.timing import rank_cores
from simulators.realrun.job import Job, RealRunError
from simulators.realrun.sealed import RECORD_FILE, read_sealed


@dataclass
class Measured:
    """What a real run measured, read back from the ranks."""

    mode: str
    backend: str
    device: str
    world: int
    threads: int
    warmup: int
    steps: int
    step_s: np.ndarray  # [steps] measured steps (warm-up dropped)
    rank_step_s: np.ndarray  # [world] mean per rank
    rank_busy_s: np.ndarray  # [world]
    cores: list[list[int]]
    oversubscribed: bool
    launcher: str
    records: list[dict[str, Any]]
    span_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [steps] first start to last end (one host)
    rank_send_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean per step in send calls
    rank_wait_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean per step waiting for messages / collectives
    rank_faults: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [world] mean minor page faults per step
    reference_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [reference steps, nodes] interleaved in-situ profile
    reference_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [reference steps] the rank that ran each
    #: ``sim.trace``: per rank [steps, events, 4] = kind (:data:`TRACE_KINDS`), id, start, end in seconds
    #: from the step's first rank start (one host; else the rank's own start); empty without it
    trace: list[np.ndarray] = field(default_factory=list)

    @property
    def step_time_s(self) -> float:
        return float(self.step_s.mean())

    def timeline(self) -> dict[str, np.ndarray]:
        """``sim.trace``: every rank's events (op calls, sends, waits) in program order, each
        with its mean start, end and duration over the measured steps (seconds from the step's
        start): arrays ``rank, kind`` (index into :data:`TRACE_KINDS`), ``id`` (node or message
        tag), ``start_s, end_s, duration_s``; empty arrays without a trace.  Means, not medians:
        the events' durations are skewed (a wait is now and then milliseconds long), and only
        means add up to the mean step that ``measured_step_time_s`` reports."""
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "kind", "id", "start_s", "end_s", "duration_s")}
        for r, ev in enumerate(self.trace):
            if not ev.size:
                continue
            e = ev.shape[1]
            cols["rank"].append(np.full(e, r, dtype=np.int64))
            cols["kind"].append(ev[0, :, 0].astype(np.int64))
            cols["id"].append(ev[0, :, 1].astype(np.int64))
            cols["start_s"].append(ev[:, :, 2].mean(axis=0))
            cols["end_s"].append(ev[:, :, 3].mean(axis=0))
            cols["duration_s"].append((ev[:, :, 3] - ev[:, :, 2]).mean(axis=0))
        return {k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64 if k in ("rank", "kind", "id") else np.float64))
                for k, v in cols.items()}

    def outputs(self) -> dict[str, Any]:
        """Loss, gradients and updated parameters of the first step, merged over the ranks."""
        out: dict[str, Any] = {}
        for rec in self.records:
            for k, v in (rec.get("outputs") or {}).items():
                out.setdefault(k, v)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "measured_step_time_s": self.step_time_s,
            "measured_step_time_std_s": float(self.step_s.std()),
            "measured_step_time_median_s": float(np.median(self.step_s)),
            "measured_step_times_s": self.step_s.tolist(),
            "measured_span_s": float(self.span_s.mean()) if len(self.span_s) else None,
            "measured_steps": self.steps,
            "measured_warmup": self.warmup,
            "measured_rank_step_s": self.rank_step_s.tolist(),
            "measured_rank_busy_s": self.rank_busy_s.tolist(),
            "measured_rank_send_s": self.rank_send_s.tolist(),
            "measured_rank_wait_s": self.rank_wait_s.tolist(),
            "measured_rank_page_faults": self.rank_faults.tolist(),
            "measured_reference_step_s": float(self.reference_s.sum(axis=1).mean()) if len(self.reference_s) else None,
            "measured_reference_steps": int(len(self.reference_s)),
            "measured_reference_rank_step_s": [float(self.reference_s[self.reference_rank == r].sum(axis=1).mean())
                                               if (self.reference_rank == r).any() else None for r in range(self.world)],
            "realrun": {
                "mode": self.mode, "backend": self.backend, "device": self.device, "world_size": self.world,
                "threads_per_rank": self.threads, "cores": self.cores, "oversubscribed": self.oversubscribed,
                "launcher": self.launcher, "ops_per_rank": [r["nodes"] for r in self.records],
                "sends_per_rank": [r["sends"] for r in self.records],
            },
        }


def read_results(job: Job, d: Path, launcher: str, key: str) -> Measured:
    """What the ranks of ``job`` measured, from the records they saved in ``d`` (``rank<r>.sealed``,
    sealed with ``key``: :mod:`simulators.realrun.sealed`); a rank's ``rank<r>.error``, a missing
    record or one without the run's seal raises :class:`RealRunError`."""
    recs = []
    for r in range(job.world):
        err = d / f"rank{r}.error"
        if err.exists():
            raise RealRunError(f"rank {r} failed:\n{err.read_text()[-4000:]}")
        f = d / RECORD_FILE.format(rank=r)
        if not f.exists():
            raise RealRunError(f"rank {r} wrote no result into {d}")
        recs.append(read_sealed(f, key))
    start = np.array([r["start"] for r in recs])[:, job.warmup:]
    end = np.array([r["end"] for r in recs])[:, job.warmup:]
    busy = np.array([r["busy"] for r in recs])[:, job.warmup:]
    one_host = len({r["host"] for r in recs}) == 1
    # a step lasts as long as its longest rank (from leaving the barrier to its last wait);
    # the span from the first start to the last end also counts the barrier's exit skew
    step = (end - start).max(axis=0)
    span = end.max(axis=0) - start.min(axis=0) if one_host else step
    _, over = rank_cores(job.world, job.threads)
    per_rank = [np.array([r[key] for r in recs])[:, job.warmup:].mean(axis=1) for key in ("send", "wait", "faults")]
    ref = np.concatenate([r["reference"] for r in recs])  # each rank's [its reference steps, nodes]
    ref_rank = np.concatenate([np.full(len(r["reference"]), r["rank"], dtype=np.int64) for r in recs])
    trace = []
    if job.trace:
        origin = start.min(axis=0) if one_host else None
        for q, r in enumerate(recs):
            ev = np.stack(r["trace"]) if len(r["trace"]) else np.zeros((0, 0, 4))
            ev[:, :, 2:] -= (origin if origin is not None else start[q])[:, None, None]
            trace.append(ev)
    return Measured(job.mode, job.backend, job.device, job.world, job.threads, job.warmup, job.steps, step, (end - start).mean(axis=1),
                    busy.mean(axis=1), [list(r["cores"]) for r in recs], over if job.device == "cpu" else False, launcher, recs, span,
                    *per_rank, reference_s=ref, reference_rank=ref_rank, trace=trace)
