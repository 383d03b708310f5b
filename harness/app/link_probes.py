"""The gloo link probes of ``python -m harness.calibrate``: two ranks pinned to their own cores
measure what a message and an all-reduce cost on this machine, and what a message costs the
cores of its endpoints (the module docstring of :mod:`harness.app.calibrate` says what each probe
measures and which figure of ``conf/cluster/cpu2.yaml`` it gives); :func:`gloo_link` runs them
all and fits them.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from simulators.realrun.timing import rank_cores

SIZES = [4, 256, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
#: all-reduces smaller than this are left out of the collective's fit (gloo reduces a few bytes
#: far faster than a ring; gradients are larger)
COLL_FIT_MIN = 256
#: bytes of the large messages whose extra compute cost gives the endpoints' copy bandwidth
BIG_MSG = 1 << 20


def _pingpong(rank: int, world: int, init: str, cores_of: list[list[int]], reps: int, rounds: int, out: str, spin: bool) -> None:
    import torch
    import torch.distributed as dist

    from simulators.realrun.timing import IdleSpinners, steady_malloc

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


#: the fits a calibration refuses to write (:func:`fit_problems`): a bandwidth above this
#: (bytes/s) is no core's memory copy nor loopback link
MAX_BW_BPS = 1e12
#: a latency or a per-message cost above this (seconds) is a stalled machine, not a message
MAX_LAT_S = 1.0
#: a fit whose curve misses the measured points by more than a factor of two (the root mean
#: square of log(predicted / measured) above log 2) does not describe them; the committed cpu2
#: fits miss single points by 2-30 %
MAX_LOG_RMS = math.log(2.0)
#: the saturating fit's plateau, hot + cold, may reach at most this multiple of the slowest
#: measured median: beyond, cold is an extrapolation past the measured gaps
MAX_PLATEAU = 3.0


def log_rms(predicted: Any, measured: Any) -> float:
    """Root mean square of ``log(predicted / measured)``: how far a fit misses, as a factor (a
    slow outlier and a fast one count alike); infinite where a prediction is not a time (<= 0)."""
    import numpy as np

    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if (p <= 0).any() or (m <= 0).any():
        return math.inf
    return float(np.sqrt(np.mean(np.log(p / m) ** 2)))


def _misses(rms: float, points: str) -> str:
    return "predicts a time <= 0" if math.isinf(rms) else f"misses its {points} by a factor {math.exp(rms):.2g} (RMS)"


def _us(x: float) -> str:
    return f"{x * 1e6:.0f} us"


def gap_fit_problems(what: str, gaps: dict[str, list[float]], hot: float, cold: float, tau: float) -> list[str]:
    """What makes a ``hot + cold (1 - exp(-gap / tau))`` fit (:func:`fit_send_gap`) physically
    impossible: a negative or non-finite figure (a cost is >= 0, and a cold rank pays at least
    what a hot one does: cold >= 0), a plateau far above every measured median, or a curve that
    misses the medians by more than :data:`MAX_LOG_RMS`."""
    import numpy as np

    if not all(math.isfinite(x) for x in (hot, cold, tau)):
        return [f"{what} fit is not finite (hot {hot}, cold {cold}, tau {tau})"]
    out = []
    if hot < 0:
        out.append(f"{what} fit has a negative hot cost ({_us(hot)})")
    if cold < 0 or tau <= 0:
        return out + [f"{what} fit has cold {_us(cold)}, tau {_us(tau)}: a cold rank cannot pay less than a hot one"]
    g = np.array([float(k) for k in gaps])
    t = np.array([statistics.median(v) for v in gaps.values()])
    if hot + cold > MAX_PLATEAU * t.max():
        out.append(f"{what} fit levels off at {_us(hot + cold)}, over {MAX_PLATEAU:g}x its slowest median ({_us(t.max())})")
    rms = log_rms(hot + cold * (1.0 - np.exp(-g / tau)), t)
    if rms > MAX_LOG_RMS:
        out.append(f"{what} fit {_misses(rms, 'medians')}")
    return out


def alpha_beta_problems(what: str, sizes: Any, t: Any, lat: float, bw: float, hops: float = 1.0) -> list[str]:
    """What makes a ``hops * lat + bytes / bw`` fit of the times ``t`` at ``sizes`` impossible:
    a negative latency, a bandwidth <= 0, either not finite or beyond :data:`MAX_LAT_S` / :data:`MAX_BW_BPS`,
    or a line that misses the measured times by more than :data:`MAX_LOG_RMS`."""
    import numpy as np

    if not (math.isfinite(lat) and math.isfinite(bw)) or lat < 0 or lat > MAX_LAT_S:
        return [f"{what} latency {lat * 1e6:.1f} us is not a latency (0 to {MAX_LAT_S:g} s)"]
    if not 0 < bw <= MAX_BW_BPS:
        return [f"{what} bandwidth {bw / 1e9:.3g} GB/s is not a bandwidth (0 to {MAX_BW_BPS / 1e9:g} GB/s)"]
    s, m = np.asarray(sizes, float), np.asarray(t, float)
    rms = log_rms(hops * lat + s / bw, m)
    return [f"{what} fit {_misses(rms, 'measured times')}"] if rms > MAX_LOG_RMS else []


def fit_problems(link: dict[str, Any]) -> list[str]:
    """Every physically impossible figure of a :func:`gloo_link` result, one phrase each (empty:
    the calibration may be written)."""
    import numpy as np

    out: list[str] = []
    sizes = np.array([float(s) for s in link["p2p_s"]])
    out += alpha_beta_problems("link", sizes, list(link["p2p_s"].values()), link["lat_s"], link["bw_Bps"])
    big = sizes >= COLL_FIT_MIN
    coll = np.array(list(link["allreduce_s"].values()), float)
    out += alpha_beta_problems("all-reduce", sizes[big], coll[big], link["coll_lat_s"], link["coll_bw_Bps"], hops=2.0)
    for key, what in (("msg_cpu_s", "per-message cost"), ("recv_idle_s", "waited-for receive cost")):
        v = float(link.get(key, 0.0))
        if not (math.isfinite(v) and 0 <= v <= MAX_LAT_S):
            out.append(f"{what} {v * 1e6:.1f} us is not a cost (0 to {MAX_LAT_S:g} s)")
    copy = float(link["copy_cpu_Bps"])
    if not (math.isfinite(copy) and 0 < copy <= MAX_BW_BPS):
        out.append(f"a message's copy rate {copy / 1e9:.3g} GB/s is not a bandwidth (its 1 MiB messages cost no more than its small ones)")
    for prefix, what in (("send", "send-after-gap"), ("recv", "receive-after-gap")):
        if f"{prefix}_gap_s" in link:
            fit = (link[f"{prefix}_{k}_s"] for k in ("hot", "cold", "tau"))
            out += gap_fit_problems(what, link[f"{prefix}_gap_s"], *fit)
    return out


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
    runs :class:`~simulators.realrun.timing.IdleSpinners` on the ranks' cores, as ``sim=realrun`` does."""
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
    return fit_link(res, busy, gaps, recv_gaps, spin)


def fit_link(res: dict[str, Any], busy: dict[str, list[float]], gaps: dict[str, list[float]], recv_gaps: dict[str, list[float]],
             spin: bool = True) -> dict[str, Any]:
    """The figures of :func:`gloo_link` from what its two ranks measured: ``res`` (mean one-way
    ``p2p`` and ``allreduce`` seconds per size, the per-message costs), the busy-sender
    arrivals, and the send- and receive-after-gap medians per gap."""
    import numpy as np

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
