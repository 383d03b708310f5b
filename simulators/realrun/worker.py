"""A rank of a real run: pin it, join the process group, compile its generated program with the
communication helpers it calls, run and time its steps (and the interleaved in-situ profile),
and save what it measured (:func:`run_rank`; :func:`spawn_entry` under ``torch.multiprocessing``,
:mod:`simulators.realrun.__main__` under torchrun)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from simulators.realrun.execgraph import TensorMeta, initial_state, resolve
from simulators.realrun.board import (P_BARRIER, P_COLLECTIVE, P_DONE, P_DRAIN, P_FINAL, P_LOAD, P_PROFILE, P_PROFILE_WAIT, P_RECV,
                                      P_RENDEZVOUS, P_SETUP, P_STEP, Progress)
from simulators.realrun.job import TRACE_ALLREDUCE, TRACE_DRAIN, TRACE_OP, TRACE_RECV, TRACE_SEND, Job, RankProgram
from simulators.realrun.sealed import JOB_FILE, RECORD_FILE, read_sealed, write_sealed


def _setup_rank(job: Job, rank: int, local_rank: int) -> tuple[Any, Any]:
    import torch

    if job.device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(job.cores[local_rank % len(job.cores)]))  # this host's cores: by local rank
    if job.steady_malloc:
        from simulators.realrun.timing import steady_malloc

        steady_malloc()
    torch.set_num_threads(job.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if job.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device()), torch
    return torch.device("cpu"), torch


def _compile(prog: RankProgram, device: Any, dist: Any, pg: Any, dp_group: Any, k: int, row: Any, pos: int = 0,
             trace: list[tuple[int, int, float, float]] | None = None) -> tuple[Any, Any, list[float]]:
    """This rank's ``post(PH, RB)`` (posts the step's early receives, returns their buffers and
    handles), ``step(PH, RB, P)`` and the step's ``[send seconds, wait seconds]`` (summed by
    ``step``, reset by the caller); ``pos`` is its position among the k data-parallel ranks
    (its batch shard and, with channel parallelism, its slice of the features).  With a
    ``trace`` list, every op, send and wait appends ``(kind, id, start, end)`` to it
    (perf_counter seconds; kinds :data:`TRACE_KINDS`).  ``row`` is the rank's row of the
    progress board (:class:`Progress`): every wait and collective marks itself there."""
    import torch

    W: list[Any] = []
    pc = time.perf_counter
    acc = [0.0, 0.0]  # this step's seconds in sends, and waiting for messages and collectives
    rec = trace.append if trace is not None else None

    class _Timed:
        """A communication handle whose ``wait`` counts into the step's wait time."""

        __slots__ = ("h", "kind", "id", "phase", "detail")

        def __init__(self, h: Any, kind: int, ident: int, phase: int, detail: int) -> None:
            self.h, self.kind, self.id, self.phase, self.detail = h, kind, ident, phase, detail

        def wait(self) -> None:
            row[3] = self.detail
            row[0] = self.phase
            t = pc()
            self.h.wait()
            t1 = pc()
            row[0] = P_STEP
            acc[1] += t1 - t
            if rec is not None:
                rec((self.kind, self.id, t, t1))

    def _op(i: int, t0: float) -> float:
        t1 = pc()
        if rec is not None:
            rec((TRACE_OP, i, t0, t1))
        return t1 - t0

    def _send(t: Any, dst: int, tag: int, perm: Any = None) -> None:
        t0 = pc()
        if perm is not None:
            t = t.permute(perm)
        c = t if t.is_contiguous() else t.contiguous()
        W.append(dist.isend(c, dst, group=pg, tag=tag))
        W.append(c)
        t1 = pc()
        acc[0] += t1 - t0
        if rec is not None:
            rec((TRACE_SEND, tag, t0, t1))

    def _irecv(t: Any, src: int, tag: int) -> Any:
        return _Timed(dist.irecv(t, src, group=pg, tag=tag), TRACE_RECV, tag, P_RECV, src << 32 | tag)

    def _drain(w: list[Any]) -> None:
        row[0] = P_DRAIN
        t0 = pc()
        for x in w:
            if hasattr(x, "wait"):
                x.wait()
        w.clear()
        t1 = pc()
        row[0] = P_STEP
        acc[1] += t1 - t0
        if rec is not None:
            rec((TRACE_DRAIN, -1, t0, t1))

    def _empty(meta: TensorMeta) -> Any:
        return torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=device)

    def _empty_strided(meta: TensorMeta) -> Any:
        return meta.empty_strided(device)

    def _own(t: Any, perm: Any, copy: bool) -> Any:
        p = t.permute(perm) if perm is not None else t
        if p.is_contiguous() and t._base is None and not copy:
            return p
        return p.clone(memory_format=torch.contiguous_format)

    def _allreduce(t: Any, i: int) -> Any:
        return _Timed(dist.all_reduce(t, group=dp_group, async_op=True), TRACE_ALLREDUCE, i, P_COLLECTIVE, i)

    def _collective(op: Any, *args: Any) -> None:
        """A blocking collective over the data-parallel ranks, marked on the progress board."""
        row[3] = -1
        row[0] = P_COLLECTIVE
        op(*args, group=dp_group)
        row[0] = P_STEP

    # channel parallelism: conversions between representations (see ChannelPlan), blocking
    # collectives over the k data-parallel ranks; rows are samples (batch-major), columns features
    def _ag_rows(t: Any) -> Any:  # L [b, f] -> R [k*b, f]
        out = torch.empty((k * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
        _collective(dist.all_gather, list(out.chunk(k, 0)), t.contiguous())
        return out

    def _ag_cols(t: Any) -> Any:  # C [B, f/k] -> R [B, f]
        parts = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for _ in range(k)]
        _collective(dist.all_gather, parts, t.contiguous())
        return torch.cat(parts, 1)

    def _a2a_lc(t: Any) -> Any:  # L [b, f] -> C [k*b, f/k]: feature block q goes to rank q
        b, f = t.shape
        send = t.reshape(b, k, f // k).transpose(0, 1).contiguous()
        recv = torch.empty_like(send)
        _collective(dist.all_to_all_single, recv, send)
        return recv.view(k * b, f // k)

    def _a2a_cl(t: Any) -> Any:  # C [k*b, f/k] -> L [b, f]: rows of rank q go to rank q
        rows, o = t.shape
        send = t.contiguous()
        recv = torch.empty_like(send)
        _collective(dist.all_to_all_single, recv, send)
        return recv.view(k, rows // k, o).transpose(0, 1).reshape(rows // k, k * o)

    def _ar(t: Any) -> Any:  # P [B, f] -> R [B, f], summed in place
        _collective(dist.all_reduce, t)
        return t

    def _rows(t: Any) -> Any:  # R -> L: this rank's samples
        b = t.shape[0] // k
        return t.narrow(0, pos * b, b)

    def _cols(t: Any) -> Any:  # R -> C: this rank's features
        o = t.shape[1] // k
        return t.narrow(1, pos * o, o).contiguous()

    ns: dict[str, Any] = {
        "K": prog.consts, "DEV": device, "_pc": time.perf_counter, "_op": _op, "_send": _send, "_irecv": _irecv, "_drain": _drain,
        "_empty": _empty, "_empty_strided": _empty_strided, "_own": _own, "_allreduce": _allreduce,
        "_ag_rows": _ag_rows, "_ag_cols": _ag_cols, "_a2a_lc": _a2a_lc, "_a2a_cl": _a2a_cl, "_ar": _ar, "_rows": _rows, "_cols": _cols,
    }
    for i, t in enumerate(prog.targets):
        ns[f"F{i}"] = resolve(t)
    exec(compile(prog.code, f"<realrun rank {prog.rank}>", "exec"), ns)
    step = ns["step"]
    return ns.get("post", lambda PH, RB: ()), (lambda PH, RB, P: step(PH, RB, W, P)), acc


def _minor_faults() -> int:
    """This process's minor page faults so far (0 where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def _run_job(job: Job, rank: int, device: Any, out_dir: str, row: Any, seal_key: str) -> None:
    """Build this rank's state and program for one job, run and time its steps, save the record
    (sealed with ``seal_key``); ``row``: the rank's row of the progress board (:class:`Progress`), in
    phase :data:`P_SETUP`."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    dp_group = None
    dp = job.mode in ("data_parallel", "channel_parallel")
    if dp:
        dp_group = pg if sorted(job.dp_devices) == list(range(job.world)) else dist.new_group(sorted(job.dp_devices))
    prog = job.programs[rank]
    k = len(job.dp_devices)
    pos = job.dp_devices.index(rank) if rank in job.dp_devices else 0
    if dp:
        PH = initial_state(job.source, job.eg, job.seed, device, batch=job.full_batch, shard=(pos, k))
        for j, rows in job.param_rows.items():  # channel-parallel layers: this rank's rows (output features) of W and b
            PH[j] = PH[j].narrow(0, pos * rows, rows).clone()
    else:
        PH = initial_state(job.source, job.eg, job.seed, device)
    RB = {j: job.eg.placeholders[j].meta.empty(device) for j in prog.recv_params}
    events: list[tuple[int, int, float, float]] | None = [] if job.trace else None
    post, step, acc = _compile(prog, device, dist, pg, dp_group, k, row, pos, events)
    traces: list[np.ndarray] = []  # [events, 4] per measured step: kind, id, start, end (perf_counter seconds)
    if job.interleave_profile:
        from simulators.realrun.timing import dead_inputs, in_situ_step

        ref_ph = initial_state(job.source, job.eg, job.seed, device)
        ref_dead = dead_inputs(job.eg)
        ref_fns = [resolve(ins.target) for ins in job.eg.instrs]
    reference: list[np.ndarray] = []
    starts, ends, busy, sent, waited, faults = [], [], [], [], [], []
    outputs: dict[str, Any] | None = None
    for s in range(job.warmup + job.steps):
        P = post(PH, RB)  # before the barrier: the peers know of every receive when the step starts
        acc[0] = acc[1] = 0.0
        row[2] = s
        row[0] = P_BARRIER
        dist.barrier()
        row[0] = P_STEP
        f0 = _minor_faults()
        t0 = time.perf_counter()
        b, outs = step(PH, RB, P)
        del P
        if job.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        faults.append(_minor_faults() - f0)
        starts.append(t0)
        ends.append(t1)
        busy.append(b)
        sent.append(acc[0])
        waited.append(acc[1])
        if events is not None:
            if s >= job.warmup:
                traces.append(np.array(events, dtype=np.float64).reshape(len(events), 4))
            events.clear()
        if s == 0 and job.collect:
            row[3] = -1
            row[0] = P_COLLECTIVE
            outputs = {key: (v.detach().cpu().clone() if hasattr(v, "detach") else v) for key, v in outs.items()}
            if dp and "loss" in outs and rank in job.dp_devices:
                loss = outs["loss"].detach().clone()
                dist.all_reduce(loss, group=dp_group)
                outputs["loss"] = (loss / len(job.dp_devices)).cpu()
            if rank in job.dp_devices:
                for key in job.gather:  # the slices of a channel-parallel layer's parameters, concatenated
                    t = outs[key].detach().contiguous()
                    parts = [torch.empty_like(t) for _ in job.dp_devices]
                    dist.all_gather(parts, t, group=dp_group)
                    outputs[key] = torch.cat(parts, 0).cpu()
            row[0] = P_STEP
        del outs
        if job.interleave_profile:
            # the ranks take turns, the others waiting at a barrier - not at the next step's: one
            # that posted its receives a whole reference step before its peer stalled ~40 ms on
            # one message in every such step (gloo over loopback, measured with sim.trace)
            row[0] = P_PROFILE_WAIT
            dist.barrier()
            if s % job.world == rank:
                row[0] = P_PROFILE
                t_ref = in_situ_step(job.eg, ref_ph, device, ref_dead, ref_fns)
                if s >= job.warmup:
                    reference.append(t_ref)
                row[0] = P_PROFILE_WAIT
            dist.barrier()
    row[0] = P_FINAL
    dist.barrier()
    rec = {"rank": rank, "start": starts, "end": ends, "busy": busy, "send": sent, "wait": waited, "faults": faults, "host": socket.gethostname(), "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
           "threads": torch.get_num_threads(), "outputs": outputs, "nodes": prog.nodes, "sends": prog.sends, "recvs": prog.recvs,
           "reference": np.asarray(reference).reshape(len(reference), job.eg.num_nodes), "trace": traces}
    write_sealed(Path(out_dir, RECORD_FILE.format(rank=rank)), rec, seal_key)


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``;
    elsewhere nothing): a rank whose launcher is gone has no one to report to."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG


def run_rank(job_dirs: Sequence[str], rank: int, local_rank: int, init_method: str, board: str | None, key: str) -> None:
    """One rank: load the jobs written in ``job_dirs`` (sealed with ``key``: a job file without
    its seal is refused unread, :mod:`simulators.realrun.sealed`), pin, join the group once,
    then run each job in turn (they share world size, backend, device and threads), telling the
    launcher what it does on the progress ``board`` (:class:`Progress`); a failing job leaves
    ``rank<r>.error`` in its directory."""
    import datetime

    import torch.distributed as dist

    from simulators.realrun.timing import IdleSpinners

    _die_with_parent()
    progress = Progress(board, rank)
    progress.set(P_LOAD)
    jobs = [read_sealed(Path(d, JOB_FILE), key) for d in job_dirs]
    first = jobs[0]
    device, _ = _setup_rank(first, rank, local_rank)
    progress.set(P_RENDEZVOUS)
    dist.init_process_group(first.backend, init_method=init_method, rank=rank, world_size=first.world,
                            timeout=datetime.timedelta(seconds=max(j.timeout_s for j in jobs)))
    # the spinners are started after the rendezvous, on this rank's own (already pinned) cores
    try:
        with IdleSpinners(os.sched_getaffinity(0) if first.spin_idle and hasattr(os, "sched_getaffinity") else []):
            for k, (job, d) in enumerate(zip(jobs, job_dirs)):
                progress.set(P_SETUP, job=k, step=0)
                try:
                    _run_job(job, rank, device, d, progress.row, key)
                except Exception:
                    Path(d, f"rank{rank}.error").write_text(traceback.format_exc())
                    raise
        progress.set(P_DONE)
    finally:
        dist.destroy_process_group()


def spawn_entry(local_rank: int, job_dirs: Sequence[str], init_method: str, board: str, key: str) -> None:
    """A rank started by ``torch.multiprocessing`` (``key``, the job's seal, comes through its
    start-up pipe): it leads its own process group, which its idle spinners join, so that the
    launcher ends it and them with one signal."""
    os.setpgid(0, 0)
    run_rank(job_dirs, local_rank, local_rank, init_method, board, key)
