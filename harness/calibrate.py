"""Calibrate a CPU "device" and the gloo link between two of them on this machine.

``python -m harness.calibrate [--threads 1] [--write]``

Measures, with the process pinned to ``threads`` cores and ``torch.set_num_threads(threads)``:

* single-precision GEMM throughput (``torch.mm`` of two n x n matrices, median of repetitions,
  ``2 n^3`` FLOPs per call): the device's ``peak_tflops``;
* memory bandwidth: ``dst.copy_(src)`` of a tensor much larger than the caches, bytes read
  plus bytes written per second (the roofline's ``work_bytes`` counts both): ``mem_bw_GBps``;
* the gloo link: two processes pinned to their own cores (with the idle spinners of
  ``sim=realrun`` on them, :class:`~harness.core.timing.IdleSpinners`) ping-pong tensors of growing
  size with ``isend``/``irecv`` on loopback, a stream of round trips per size without barriers
  in between, as a real run's messages follow one another, every receive posted before the
  stream starts, as ``sim=realrun`` posts a step's receives; the *mean* half round trip per
  size (a slow wake-up of the peer is part of what a step pays), then a least-squares fit of
  ``t = lat + bytes / bw``: ``lat_us`` and ``bw_GBps`` of cpu2's links;
* the collective: a stream of two-rank asynchronous gloo all-reduces per size (issued back to
  back, then waited for, as a data-parallel backward pass does), the mean, fitted to the
  ring formula of the cost model (``2(p-1) lat + 2(p-1)/p bytes / bw``): cpu2's
  ``collective: {lat_us, bw_GBps}``, which the cost model uses for all-reduce instead of the
  links' figures - gloo's all-reduce of small tensors costs several link latencies more than
  a ring of two sends.  The sizes are visited ``--rounds`` times, and each figure is the mean
  over the rounds, so that a slow spell of a shared machine spreads over all sizes;
* (reported, not modelled) how late a small message arrives when its sender goes on
  computing after posting it, as a real run's ranks do, with the receive posted before the
  round (as ``sim=realrun`` does) and after it (``early_recv: false``: gloo's event-loop thread
  then sends the payload, once it gets the core);
* what a message costs the endpoints' cores: both ranks run a matmul loop alone and while
  exchanging small and 1 MiB messages (``isend`` / ``irecv``, as a real run's transfers); the
  slowdown per message and side, and per byte: cpu2's ``host_comm: {per_message_us,
  copy_GBps}``, with which the simulator charges every transfer to both endpoints' compute
  (and takes it out of the link's one-way time, which holds it already);
* how a send's cost grows with the compute since the rank's previous send: rank 0 computes
  ``gap`` seconds of matmuls before each ``isend`` of 4 KiB or 256 KiB; the medians per gap,
  fitted to ``hot + cold (1 - exp(-gap / tau))``: cpu2's ``host_comm: {send_cold_us,
  send_tau_us}``, the extra a sender pays beyond ``per_message_us`` (which was measured with
  sends every few hundred microseconds);
* the same for a receive (:func:`_recv_after_gap`): rank 1 computes ``gap`` seconds, then
  waits for a small message from a hot sender; from the ``isend`` to the end of rank 1's next
  op, beyond the op's own time, fitted the same way: cpu2's ``host_comm: {recv_cold_us,
  recv_tau_us}``, which the simulator adds to the first reader of each received tensor;
* (the simulator uses it only with ``host_comm.recv_when: busy``) what a receive
  costs a rank that waited for it: two ranks relay a small message with a short op before
  each send, against a plain relay plus the op timed alone (:func:`_relay_cpu`), the
  ``recv_idle_us`` of that model, written into ``host_comm`` (unused under the default
  ``recv_when: always``).

``python -m harness.calibrate --drift SECONDS`` measures instead how much this machine's speed
moves over time (:func:`drift`): what bounds any comparison of a simulated step with a
measured one here.

It prints the figures and a YAML snippet; ``--write`` rewrites ``conf/cluster/device/cpu_host.yaml``
and ``conf/cluster/cpu2.yaml`` with them (the device kind is this CPU's profile name, so that
``costs=profiled`` finds the profiles of ``python -m harness.profile device=cpu threads=1``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.core.timing import cpu_model, device_name, pin_to_cores, rank_cores

REPO = Path(__file__).resolve().parents[1]


def gemm_flops(threads: int = 1, n: int = 1024, reps: int = 20) -> float:
    """FLOP/s of an fp32 n x n x n matrix multiply (median of ``reps``)."""
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    for _ in range(3):
        torch.mm(a, b, out=out)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        ts.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(ts)


def copy_bandwidth(threads: int = 1, mib: int = 512, reps: int = 10) -> float:
    """Bytes/s of a large tensor copy, counting bytes read plus bytes written."""
    import torch

    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t0)
    return 2.0 * n * 4 / statistics.median(ts)


SIZES = [4, 256, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
#: all-reduces smaller than this are left out of the collective's fit (gloo reduces a few bytes
#: far faster than a ring; gradients are larger)
COLL_FIT_MIN = 256
#: bytes of the large messages whose extra compute cost gives the endpoints' copy bandwidth
BIG_MSG = 1 << 20


def _pingpong(rank: int, world: int, init: str, cores_of: list[list[int]], reps: int, rounds: int, out: str, spin: bool) -> None:
    import torch
    import torch.distributed as dist

    from harness.core.timing import IdleSpinners, steady_malloc

    cores = cores_of[rank]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    steady_malloc()  # as sim=realrun's ranks
    torch.set_num_threads(len(cores))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    peer = 1 - rank
    p2p: dict[int, list[float]] = {s: [] for s in SIZES}
    coll: dict[int, list[float]] = {s: [] for s in SIZES}

    def stream(n: int, t: Any, what: str) -> float:
        # a real run posts a step's receives before its barrier (sim.early_recv), so that gloo
        # sends every tensor from the producing thread at once: so do these ping-pongs
        hs = [dist.irecv(t, peer, tag=j) for j in range(n)] if what == "p2p" else []
        dist.barrier()
        t0 = time.perf_counter()
        if what == "p2p":
            for j in range(n):
                if rank == 0:
                    dist.isend(t, peer, tag=j).wait()
                    hs[j].wait()
                else:
                    hs[j].wait()
                    dist.isend(t, peer, tag=j).wait()
        else:  # asynchronous all-reduces issued back to back, then waited for (a data-parallel backward pass)
            for h in [dist.all_reduce(t, async_op=True) for _ in range(n)]:
                h.wait()
        return time.perf_counter() - t0

    msg_cpu: list[float] = []
    big_cpu: list[float] = []
    with IdleSpinners(cores if spin else []):
        # streams of messages, as a real run's follow one another: the mean per message counts
        # the slow ones (a peer that has to be woken) the median would drop; the sizes are
        # visited ``rounds`` times, so that a slow minute of a shared machine spreads over all.
        # What a message costs the cores is sampled after every size, so that it too spreads
        # over the whole calibration (three samples in a row gave 66 us one hour and 102 us the
        # next on the cpu2 VM); its median is the figure
        for _ in range(rounds):
            for size in SIZES:
                t = torch.ones(max(1, size // 4))
                r = max(4, reps if size <= (1 << 20) else reps // 8)
                stream(2, t, "p2p")
                p2p[size].append(stream(r, t, "p2p") / (2 * r))
                stream(2, t, "allreduce")
                coll[size].append(stream(r, t, "allreduce") / r)
                msg_cpu.append(_message_cpu(rank, peer, n_msg=64, reps=3))
                big_cpu.append(_message_cpu(rank, peer, n_msg=32, reps=3, numel=BIG_MSG // 4))
        relay = [_relay_cpu(rank, peer, n_hops=200, reps=5) for _ in range(rounds)]
        busy = {"late": _busy_sender(rank, peer, reps=20 * rounds, early=False), "early": _busy_sender(rank, peer, reps=20 * rounds)}
        gaps = _send_after_gap(rank, peer, rounds)
        recv_gaps = _recv_after_gap(rank, peer, rounds)
    if rank == 0:
        Path(out).write_text(json.dumps({"p2p": {s: statistics.fmean(v) for s, v in p2p.items()},
                                         "allreduce": {s: statistics.fmean(v) for s, v in coll.items()},
                                         "msg_cpu_s": statistics.median(msg_cpu), "big_msg_cpu_s": statistics.median(big_cpu),
                                         "msg_cpu_samples_s": msg_cpu,
                                         "recv_idle_s": statistics.fmean(relay)}))
    if rank == 1:
        Path(out + ".busy").write_text(json.dumps(busy))
        Path(out + ".recv_gaps").write_text(json.dumps(recv_gaps))
    else:
        Path(out + ".gaps").write_text(json.dumps(gaps))
    dist.destroy_process_group()


def _message_cpu(rank: int, peer: int, n_msg: int, reps: int, numel: int = 64) -> float:
    """Compute time one message costs each endpoint's core: both ranks run the same matmul
    loop, alone and then exchanging ``n_msg`` small messages each way (``isend`` spread over
    the loop, ``irecv`` posted up front, as a real run's transfers), and the slowdown of the
    loop per message (a send plus a receive) is returned, halved: one side of one message."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(96, 96), torch.randn(96, 96)
    every = 8
    msgs = [torch.ones(numel) for _ in range(n_msg)]
    inbox = [torch.empty(numel) for _ in range(n_msg)]

    def loop(talk: bool) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        hs = [dist.irecv(x, peer, tag=j) for j, x in enumerate(inbox)] if talk else []
        for j in range(n_msg * every):
            torch.mm(a, b)
            if talk and j % every == every - 1:
                hs.append(dist.isend(msgs[j // every], peer, tag=j // every))
        t = time.perf_counter() - t0  # the compute, before waiting for the last messages
        for h in hs:
            h.wait()
        return t

    loop(False), loop(True)
    alone = statistics.median(loop(False) for _ in range(reps))
    talking = statistics.median(loop(True) for _ in range(reps))
    return max(0.0, (talking - alone) / n_msg / 2)


def _relay_op(a: Any, b: Any) -> None:
    """The short op the relay and the receive-after-gap sweep time after a receive: three
    matmuls of ``a`` and ``b`` (64 x 64)."""
    import torch

    for _ in range(3):
        torch.mm(a, b)


def _relay_cpu(rank: int, peer: int, n_hops: int, reps: int) -> float:
    """What a receive costs a rank that waited for it: the two ranks relay a small message
    back and forth ``n_hops`` times (receives posted up front, as ``sim=realrun`` posts them),
    plainly and with a short op (three 64 x 64 matmuls) before each send, as a chain of ops
    split across two ranks does; the op's own time (timed alone) taken out of the difference,
    the rest per hop is what the woken rank's op pays for the receive that woke it (gloo's
    receiving thread shares its core and its caches): ``host_comm.recv_idle_us``."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    msg = torch.ones(16)

    def op() -> None:
        _relay_op(a, b)

    def relay(with_op: bool) -> float:
        mine = [j for j in range(n_hops) if j % 2 != rank]  # hop j is sent by rank j % 2
        hs = {j: dist.irecv(torch.empty(16), peer, tag=j) for j in mine}
        sent = []
        dist.barrier()
        t0 = time.perf_counter()
        for j in range(n_hops):
            if j % 2 == rank:
                if with_op:
                    op()
                sent.append(dist.isend(msg, peer, tag=j))
            else:
                hs[j].wait()
        t = time.perf_counter() - t0
        for h in sent:
            h.wait()
        return t / n_hops

    def op_alone() -> float:
        t0 = time.perf_counter()
        for _ in range(200):
            op()
        return (time.perf_counter() - t0) / 200

    relay(False), relay(True), op_alone()
    plain, with_op, alone = [], [], []
    for _ in range(reps):
        plain.append(relay(False))
        with_op.append(relay(True))
        alone.append(op_alone())
    return max(0.0, statistics.median(with_op) - statistics.median(plain) - statistics.median(alone))


def _matmul_s(a: Any, b: Any, n: int = 50) -> float:
    """Seconds of one ``torch.mm(a, b)``, the mean of ``n``: the unit of the compute stretches
    the message measurements put between sends."""
    import torch

    t0 = time.perf_counter()
    for _ in range(n):
        torch.mm(a, b)
    return (time.perf_counter() - t0) / n


#: compute between two sends of the gap sweep (seconds) and the message sizes it sends (bytes)
SEND_GAPS = [5e-5, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2]
SEND_GAP_SIZES = [4096, 262144]


def _send_after_gap(rank: int, peer: int, rounds: int, n_msg: int = 24) -> dict[str, list[float]]:
    """Seconds rank 0 spends inside ``isend`` after computing ``gap`` seconds since its previous
    send (matmuls in between; the receives posted before the round, as ``sim=realrun`` posts
    them): per gap (key), the median over ``n_msg`` sends, per size and round.  On the cpu2 VM
    a send right after another costs tens of microseconds and one after milliseconds of compute
    a few hundred: the network stack's code and data have left the caches."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(96, 96), torch.randn(96, 96)
    mm = _matmul_s(a, b)
    out: dict[str, list[float]] = {str(g): [] for g in SEND_GAPS}
    for _ in range(rounds):
        for size in SEND_GAP_SIZES:
            for gap in SEND_GAPS:
                n = max(1, int(round(gap / mm)))
                msgs = [torch.ones(size // 4) for _ in range(n_msg)]
                hs = [dist.irecv(torch.empty(size // 4), peer, tag=j) for j in range(n_msg)] if rank == 1 else []
                dist.barrier()
                ts = []
                if rank == 0:
                    for j in range(n_msg):
                        for _ in range(n):
                            torch.mm(a, b)
                        t1 = time.perf_counter()
                        hs.append(dist.isend(msgs[j], peer, tag=j))
                        ts.append(time.perf_counter() - t1)
                for h in hs:
                    h.wait()
                if rank == 0:
                    out[str(gap)].append(statistics.median(ts[2:]))
    return out


def _recv_after_gap(rank: int, peer: int, rounds: int, n_msg: int = 24) -> dict[str, list[float]]:
    """What a receive costs rank 1 after it computed ``gap`` seconds (matmuls) since its
    previous network traffic, then waited for a small message (receive posted before the
    round, as ``sim=realrun`` posts them): from rank 0's ``isend`` (rank 0 spins meanwhile, so
    that its send stays hot) to rank 1's wait returning, plus how much longer rank 1's first op
    after the wait (three 64 x 64 matmuls) takes than the same op right after it; per gap
    (key), the median over ``n_msg`` rounds, per round.  It grows with the gap
    (figures: results/calibration/README.md): the receiver's network stack leaves the
    caches as the sender's does (:func:`_send_after_gap`)."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(96, 96), torch.randn(96, 96)
    mm = _matmul_s(a, b)
    ra, rb = torch.randn(64, 64), torch.randn(64, 64)
    stamp = torch.zeros(1, dtype=torch.float64)
    out: dict[str, list[float]] = {str(g): [] for g in SEND_GAPS}
    for _ in range(rounds):
        for gap in SEND_GAPS:
            n = max(1, int(round(gap / mm)))
            ts = []
            for j in range(n_msg):
                h = dist.irecv(stamp, peer, tag=j) if rank == 1 else None
                dist.barrier()
                if rank == 1:
                    for _ in range(n):
                        torch.mm(a, b)
                    h.wait()
                    t_woke = time.perf_counter()
                    _relay_op(ra, rb)
                    t_op = time.perf_counter() - t_woke
                    t1 = time.perf_counter()
                    _relay_op(ra, rb)
                    ts.append(t_woke - float(stamp.item()) + t_op - (time.perf_counter() - t1))
                else:
                    t_end = time.perf_counter() + n * mm + 3e-4  # until the receiver waits
                    while time.perf_counter() < t_end:
                        pass
                    stamp[0] = time.perf_counter()
                    dist.isend(stamp, peer, tag=j).wait()
            if rank == 1:
                out[str(gap)].append(statistics.median(ts[2:]))
    return out


def fit_send_gap(gaps: dict[str, list[float]]) -> tuple[float, float, float]:
    """``isend`` seconds against the compute gap before it, fitted to ``hot + cold * (1 -
    exp(-gap / tau))`` (least squares on each gap's median over sizes and rounds, tau on a
    grid): ``(hot_s, cold_s, tau_s)``, with ``cold >= 0``.  The simulator charges a sender
    ``cold * (1 - exp(-gap / tau))`` on top of its per-message cost (``host_comm.send_us``,
    by default ``per_message_us``: a hot send is in that calibrated cost already)."""
    import numpy as np

    g = np.array(sorted(float(k) for k in gaps))
    t = np.array([statistics.median(gaps[k]) for k in sorted(gaps, key=float)])
    best = (float("inf"), float(t.min()), 0.0, 1e-3)
    for tau in np.geomspace(1e-4, 5e-2, 80):
        x = 1.0 - np.exp(-g / tau)
        A = np.vstack([np.ones_like(x), x]).T
        (hot, cold), *_ = np.linalg.lstsq(A, t, rcond=None)
        if cold < 0:
            hot, cold = float(t.mean()), 0.0
        err = float(((hot + cold * x - t) ** 2).sum())
        if err < best[0]:
            best = (err, float(hot), float(cold), float(tau))
    return best[1], best[2], best[3]


def _busy_sender(rank: int, peer: int, reps: int, after_s: float = 0.005, early: bool = True) -> list[float]:
    """Post-to-arrival seconds of a small message that rank 0 posts (``isend``) between two
    ``after_s`` stretches of compute, as a real run's rank does after producing a tensor; rank 1 waits
    for it (one host, so both read the same monotonic clock).  ``early``: rank 1 posts its
    receive before the barrier that starts the round, as ``sim=realrun`` does (``early_recv``);
    else after it, so that its notice reaches rank 0 while rank 0 computes, and gloo sends the
    payload from its event-loop thread once that thread gets the core.  Reported, not modelled."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(96, 96), torch.randn(96, 96)
    n_mm = max(1, int(after_s / _matmul_s(a, b)))
    stamp = torch.zeros(1, dtype=torch.float64)
    out = []
    for _ in range(reps):
        h = dist.irecv(stamp, peer) if rank == 1 and early else None
        dist.barrier()
        if rank == 0:
            for _ in range(n_mm):
                torch.mm(a, b)
            stamp[0] = time.perf_counter()
            h = dist.isend(stamp, peer)
            for _ in range(n_mm):
                torch.mm(a, b)
            h.wait()
        else:
            (h if h is not None else dist.irecv(stamp, peer)).wait()
            out.append(time.perf_counter() - float(stamp.item()))
    return out


def drift(seconds: float = 60.0, window_s: float = 2.0, threads: int = 1, spin: bool = True) -> dict[str, Any]:
    """How much this machine's speed moves: one fixed CPU workload (a 128^3 matmul and an
    element-wise op over 1.2 MB, the mix of a small model's step) run back to back for
    ``seconds`` on ``threads`` pinned cores, with the idle spinners and the allocator setting of
    a real run's rank; the median time of one iteration in each ``window_s`` window.  Returns
    the windows (seconds per iteration), their ``spread`` ((max - min) / median) and ``cv``
    (standard deviation / mean).  A profile and a real run taken a minute apart on a machine
    with a spread of s can disagree by about s with no fault of the simulator's."""
    import numpy as np
    import torch

    from harness.core.timing import IdleSpinners, pinned, steady_malloc

    steady_malloc()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g)
    x = torch.randn(300_000, generator=g)
    windows: list[float] = []
    with pinned(threads) as cores, IdleSpinners(cores if spin else []):
        for _ in range(3):  # warm-up
            torch.mm(a, b), torch.relu(x)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            w_end = min(end, time.perf_counter() + window_s)
            ts = []
            while time.perf_counter() < w_end or not ts:
                t0 = time.perf_counter()
                torch.mm(a, b)
                torch.relu(x)
                ts.append(time.perf_counter() - t0)
            windows.append(statistics.median(ts))
    w = np.asarray(windows)
    return {"windows_s": windows, "window_s": window_s, "cores": cores, "spread": float((w.max() - w.min()) / np.median(w)),
            "cv": float(w.std() / w.mean())}


def _fit(sizes: Any, t: Any) -> tuple[float, float]:
    """Least-squares ``t = a + b * bytes`` weighted by ``1 / t`` (small messages, where the
    latency shows, count as much as big ones): ``(a, b)``, both kept positive."""
    import numpy as np

    A = np.vstack([np.ones_like(sizes), sizes]).T
    coef, *_ = np.linalg.lstsq(A / t[:, None], np.ones_like(t), rcond=None)
    a = max(float(coef[0]), float(t.min()) * 0.5)
    b = float(coef[1]) if coef[1] > 0 else float(t[-1] / sizes[-1])
    return a, b


def gloo_link(threads: int = 1, reps: int = 50, spin: bool = True, rounds: int = 3) -> dict[str, Any]:
    """Mean one-way time of a stream of ping-pong messages and mean time of a stream of
    all-reduces per size between two pinned gloo ranks, and their alpha-beta fits: the link's
    ``lat_s``, ``bw_Bps`` (``t = lat + bytes / bw``) and the collective's ``coll_lat_s``,
    ``coll_bw_Bps`` in the ring formula of two ranks (``t = 2 lat + bytes / bw``).  ``spin``
    runs :class:`~harness.core.timing.IdleSpinners` on the ranks' cores, as ``sim=realrun`` does."""
    import numpy as np
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # each rank on its own cores, as sim=realrun places them: a message between two cores costs
    # a cross-core wake-up that two processes sharing one core would not pay
    cores_of, _ = rank_cores(2, threads)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res.json")
        mp.spawn(_pingpong, args=(2, f"file://{d}/rdzv", cores_of, reps, rounds, out, spin), nprocs=2, join=True)
        res = json.loads(Path(out).read_text())
        busy = json.loads(Path(out + ".busy").read_text())
        gaps = json.loads(Path(out + ".gaps").read_text())
        recv_gaps = json.loads(Path(out + ".recv_gaps").read_text())
    sizes = np.array([float(s) for s in res["p2p"]])
    lat, inv_bw = _fit(sizes, np.array(list(res["p2p"].values())))
    big = sizes >= COLL_FIT_MIN
    a, b = _fit(sizes[big], np.array(list(res["allreduce"].values()))[big])
    return {"lat_s": lat, "bw_Bps": 1.0 / inv_bw, "coll_lat_s": a / 2, "coll_bw_Bps": 1.0 / b, "spin_idle": spin, "msg_cpu_s": res["msg_cpu_s"],
            "recv_idle_s": res["recv_idle_s"],
            "busy_sender_mean_s": statistics.fmean(busy["early"]), "busy_sender_median_s": statistics.median(busy["early"]),
            "busy_sender_late_mean_s": statistics.fmean(busy["late"]), "busy_sender_late_median_s": statistics.median(busy["late"]),
            "copy_cpu_Bps": BIG_MSG / max(res["big_msg_cpu_s"] - res["msg_cpu_s"], 1e-9), "msg_cpu_samples_s": res.get("msg_cpu_samples_s", []),
            "send_gap_s": gaps, **dict(zip(("send_hot_s", "send_cold_s", "send_tau_s"), fit_send_gap(gaps))),
            "recv_gap_s": recv_gaps, **dict(zip(("recv_hot_s", "recv_cold_s", "recv_tau_s"), fit_send_gap(recv_gaps))),
            "p2p_s": res["p2p"], "allreduce_s": res["allreduce"]}


def _mem_gib_per_device(devices: int) -> float:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8.0
    return round(total / 2**30 / devices, 1)


def device_yaml(kind: str, flops: float, bw: float, mem_gib: float, threads: int, when: str) -> str:
    return f"""# One CPU "device": {threads} core(s) of this machine running {threads} torch thread(s)
# ({cpu_model()}). Measured by `python -m harness.calibrate --threads {threads} --write` on {when}:
# fp32 GEMM (torch.mm 1024^3, median) {flops / 1e9:.1f} GFLOP/s; tensor copy {bw / 1e9:.1f} GB/s
# (bytes read + written). mem_GiB: this machine's memory divided among cpu2's two devices.
# `kind` is the profile name of this CPU at {threads} thread(s), so costs=profiled reads
# results/profiles/<slug of kind>/ (written by `python -m harness.profile device=cpu threads={threads}`).
kind: "{kind}"
peak_tflops: {{float32: {flops / 1e12:.5f}}}
mem_bw_GBps: {bw / 1e9:.2f}
mem_GiB: {mem_gib}
"""


def _send_gap_comment(link: dict[str, Any]) -> str:
    if "send_gap_s" not in link:
        return ""
    gaps = link["send_gap_s"]
    return f"""# A send costs more the longer its rank computed since its previous send: isend of 4 KiB and 256 KiB after
# {", ".join(f"{float(g) * 1e3:g}" for g in gaps)} ms of matmuls took (median) {", ".join(f"{statistics.median(v) * 1e6:.0f}" for v in gaps.values())} us;
# fitted to hot + cold (1 - exp(-gap / tau)): hot {link["send_hot_s"] * 1e6:.0f} us, cold {link["send_cold_s"] * 1e6:.0f} us, tau {link["send_tau_s"] * 1e6:.0f} us.
# The simulator adds cold (1 - exp(-gap / tau)) to each send's cost (send_cold_us, send_tau_us).
"""


def _samples(link: dict[str, Any]) -> str:
    v = link.get("msg_cpu_samples_s") or []
    if len(v) < 2:
        return ""
    return f" (median of {len(v)} samples spread over the calibration, {min(v) * 1e6:.0f}-{max(v) * 1e6:.0f} us)"


def _recv_gap_comment(link: dict[str, Any]) -> str:
    if "recv_gap_s" not in link:
        return ""
    gaps = link["recv_gap_s"]
    return f"""# So does a receive: a rank that computed {", ".join(f"{float(g) * 1e3:g}" for g in gaps)} ms of matmuls, then waited for a small
# message from a hot sender, took (median) {", ".join(f"{statistics.median(v) * 1e6:.0f}" for v in gaps.values())} us from the isend to the end of its next op, beyond the op;
# fitted: hot {link["recv_hot_s"] * 1e6:.0f} us, cold {link["recv_cold_s"] * 1e6:.0f} us, tau {link["recv_tau_s"] * 1e6:.0f} us. The simulator adds cold (1 - exp(-gap / tau)) to the
# first reader of each received tensor, the gap being the compute its device ran since its previous one (recv_cold_us, recv_tau_us).
"""


def cluster_yaml(link: dict[str, Any], threads: int, when: str) -> str:
    lat, bw, clat, cbw = link["lat_s"], link["bw_Bps"], link["coll_lat_s"], link["coll_bw_Bps"]
    extra = f", send_cold_us: {link['send_cold_s'] * 1e6:.1f}, send_tau_us: {link['send_tau_s'] * 1e6:.0f}" if "send_cold_s" in link else ""
    extra += f", recv_idle_us: {link['recv_idle_s'] * 1e6:.1f}" if "recv_idle_s" in link else ""
    extra += f", recv_cold_us: {link['recv_cold_s'] * 1e6:.1f}, recv_tau_us: {link['recv_tau_s'] * 1e6:.0f}" if "recv_cold_s" in link else ""
    relay = (f"""# A receiver that waited for its message pays {link['recv_idle_s'] * 1e6:.1f} us in the op after the wait: two ranks relaying a
# message with three 64x64 matmuls before each send took that much per hop more than a plain relay plus the matmuls.
# The simulator's host_comm.recv_when: busy charges it (recv_idle_us) instead of per_message_us to a receiver that
# waited, and per_message_us only to one that computes when the message arrives; cpu2 keeps recv_when: always (the
# default), and python -m experiments sim_accuracy reports both models (results/sim_accuracy/README.md).
""" if "recv_idle_s" in link else "")
    ar = ", ".join(f"{int(s) // 1024} KiB {t * 1e6:.0f} us" for s, t in link["allreduce_s"].items() if int(s) >= 65536)
    spin = "with" if link.get("spin_idle", True) else "without"
    return f"""# cpu2: two CPU devices of {threads} core(s) each on this machine - the cluster the real-run
# tests and the simulator-accuracy experiment (python -m experiments sim_accuracy) run on:
# sim=realrun pins rank r to its own core(s) with {threads} torch thread(s), and the ranks talk
# gloo over loopback. Device figures: conf/cluster/device/cpu_host.yaml.
# Measured by `python -m harness.calibrate --threads {threads} --write` on {when}, {spin} idle spinners
# on the ranks' cores (as sim=realrun runs): two pinned processes, streams of messages (mean per message).
# Link: gloo isend/irecv (receives posted first), half a ping-pong round trip per size, least-squares alpha-beta fit:
# latency {lat * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s.
# collective: gloo all-reduce of 2 ranks ({ar}), fitted to the ring formula
# 2(p-1) lat + 2(p-1)/p bytes / bw: lat {clat * 1e6:.1f} us, bw {cbw / 1e9:.2f} GB/s (the cost model uses it
# for all-reduce instead of the links' figures).
# host_comm: what a transfer costs each endpoint's core in compute (gloo's sends and receives are
# CPU copies on the ranks' own cores): both ranks run a matmul loop alone and while exchanging
# small and 1 MiB messages; slowdown per message and side {link["msg_cpu_s"] * 1e6:.1f} us, bytes at {link["copy_cpu_Bps"] / 1e9:.2f} GB/s{_samples(link)}.
{relay}{_send_gap_comment(link)}{_recv_gap_comment(link)}# Not modelled: a small message posted by a rank that goes on computing arrives after
# {link.get("busy_sender_mean_s", float("nan")) * 1e6:.0f} us on average (median {link.get("busy_sender_median_s", float("nan")) * 1e6:.0f} us) with its receive posted before the step, as
# sim=realrun does; {link.get("busy_sender_late_mean_s", float("nan")) * 1e6:.0f} us (median {link.get("busy_sender_late_median_s", float("nan")) * 1e6:.0f} us) posted later (sim.early_recv=false).
defaults:
  - device: cpu_host
_target_: harness.core.cluster.build_cluster
name: cpu2
gpus: 2          # devices per host (CPU devices here)
nodes: 1
intra: {{topology: mesh, cls: loopback, bw_GBps: {bw / 1e9:.3f}, lat_us: {lat * 1e6:.2f}}}
collective: {{lat_us: {clat * 1e6:.2f}, bw_GBps: {cbw / 1e9:.3f}}}
host_comm: {{per_message_us: {link["msg_cpu_s"] * 1e6:.1f}, copy_GBps: {link["copy_cpu_Bps"] / 1e9:.3f}{extra}}}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="cores and torch threads per device (default 1, as cpu2)")
    ap.add_argument("--reps", type=int, default=50, help="ping-pong repetitions per size")
    ap.add_argument("--write", action="store_true", help="rewrite conf/cluster/device/cpu_host.yaml and conf/cluster/cpu2.yaml")
    ap.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the message sizes (default 3)")
    ap.add_argument("--no-spin", action="store_true", help="measure the link without idle spinners on the ranks' cores")
    ap.add_argument("--drift", type=float, default=None, metavar="SECONDS",
                    help="only measure how much this machine's speed moves over SECONDS (2 s windows), and exit")
    a = ap.parse_args(argv)
    import torch

    from harness.core.errors import ProfileError
    from harness.core.timing import thread_count

    try:
        thread_count(a.threads, "--threads")
    except ProfileError as e:
        ap.error(str(e))

    if a.drift is not None:
        d = drift(a.drift, threads=a.threads, spin=not a.no_spin)
        w = d["windows_s"]
        print(f"one fixed workload on core(s) {d['cores']}, {len(w)} windows of {d['window_s']:g} s: median iteration "
              f"{statistics.median(w) * 1e6:.0f} us, fastest {min(w) * 1e6:.0f} us, slowest {max(w) * 1e6:.0f} us; "
              f"spread (max - min) / median {d['spread'] * 100:.0f} %, cv {d['cv'] * 100:.1f} %")
        if a.json:
            Path(a.json).write_text(json.dumps(d, indent=1))
        return 0

    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pin_to_cores(a.threads)
    torch.set_num_threads(a.threads)
    when = _dt.date.today().isoformat() + f" (torch {torch.__version__})"
    flops = gemm_flops(a.threads)
    bw = copy_bandwidth(a.threads)
    print(f"GEMM fp32: {flops / 1e9:.1f} GFLOP/s   copy: {bw / 1e9:.2f} GB/s   ({a.threads} thread(s), {cpu_model()})")
    if allowed is not None:
        os.sched_setaffinity(0, allowed)  # the two ranks choose their cores among all of them
    link = gloo_link(a.threads, a.reps, spin=not a.no_spin, rounds=a.rounds)
    print(f"gloo p2p: latency {link['lat_s'] * 1e6:.1f} us, bandwidth {link['bw_Bps'] / 1e9:.2f} GB/s; "
          f"all-reduce (ring fit): latency {link['coll_lat_s'] * 1e6:.1f} us, bandwidth {link['coll_bw_Bps'] / 1e9:.2f} GB/s")
    print(f"a small message posted by a rank that goes on computing arrives after {link['busy_sender_mean_s'] * 1e6:.0f} us "
          f"(mean; median {link['busy_sender_median_s'] * 1e6:.0f} us) when the receive was posted before the step, as "
          f"sim=realrun does; {link['busy_sender_late_mean_s'] * 1e6:.0f} us (median {link['busy_sender_late_median_s'] * 1e6:.0f} us) "
          "when it was posted while the sender computes")
    print(f"isend after a gap of compute: {', '.join(f'{float(g) * 1e3:g} ms {statistics.median(v) * 1e6:.0f} us' for g, v in link['send_gap_s'].items())}; "
          f"fit hot {link['send_hot_s'] * 1e6:.0f} us + cold {link['send_cold_s'] * 1e6:.0f} us (1 - exp(-gap / {link['send_tau_s'] * 1e6:.0f} us))")
    print(f"a receive after a gap of compute: {', '.join(f'{float(g) * 1e3:g} ms {statistics.median(v) * 1e6:.0f} us' for g, v in link['recv_gap_s'].items())}; "
          f"fit hot {link['recv_hot_s'] * 1e6:.0f} us + cold {link['recv_cold_s'] * 1e6:.0f} us (1 - exp(-gap / {link['recv_tau_s'] * 1e6:.0f} us))")
    print(f"a message's compute cost: {link['msg_cpu_s'] * 1e6:.1f} us per side to busy ranks; {link['recv_idle_s'] * 1e6:.1f} us "
          "to a receiver that waited for it (in its next op)")
    for s, t in link["p2p_s"].items():
        print(f"  {int(s):>10} B  one-way {t * 1e6:9.1f} us   all-reduce {link['allreduce_s'][s] * 1e6:9.1f} us")
    kind = device_name("cpu", a.threads)
    dev = device_yaml(kind, flops, bw, _mem_gib_per_device(2), a.threads, when)
    clu = cluster_yaml(link, a.threads, when)
    print("\n# conf/cluster/device/cpu_host.yaml\n" + dev + "\n# conf/cluster/cpu2.yaml\n" + clu)
    if a.json:
        Path(a.json).write_text(json.dumps({"gemm_flops": flops, "copy_Bps": bw, "threads": a.threads, "kind": kind, **link}, indent=1))
    if a.write:
        (REPO / "conf" / "cluster" / "device" / "cpu_host.yaml").write_text(dev)
        (REPO / "conf" / "cluster" / "cpu2.yaml").write_text(clu)
        print("wrote conf/cluster/device/cpu_host.yaml and conf/cluster/cpu2.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
