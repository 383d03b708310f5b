"""Calibrate a CPU "device" and the gloo link between two of them on this machine.

``python -m harness.calibrate [--threads 1] [--write]``

Measures, with the process pinned to ``threads`` cores and ``torch.set_num_threads(threads)``:

* single-precision GEMM throughput (``torch.mm`` of two n x n matrices, median of repetitions,
  ``2 n^3`` FLOPs per call): the device's ``peak_tflops``;
* memory bandwidth: ``dst.copy_(src)`` of a tensor much larger than the caches, bytes read
  plus bytes written per second (the roofline's ``work_bytes`` counts both): ``mem_bw_GBps``;
* the gloo link: two processes pinned to their own cores (with the idle spinners of
  ``sim=realrun`` on them, :class:`~simulators.realrun.timing.IdleSpinners`) ping-pong tensors of growing
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
* the same for a receive (:func:`harness.app.link_probes._recv_after_gap`): rank 1 computes ``gap`` seconds, then
  waits for a small message from a hot sender; from the ``isend`` to the end of rank 1's next
  op, beyond the op's own time, fitted the same way: cpu2's ``host_comm: {recv_cold_us,
  recv_tau_us}``, which the simulator adds to the first reader of each received tensor;
* (the simulator uses it only with ``host_comm.recv_when: busy``) what a receive
  costs a rank that waited for it: two ranks relay a small message with a short op before
  each send, against a plain relay plus the op timed alone (:func:`harness.app.link_probes._relay_cpu`), the
  ``recv_idle_us`` of that model, written into ``host_comm`` (unused under the default
  ``recv_when: always``).

``python -m harness.calibrate --drift SECONDS`` measures instead how much this machine's speed
moves over time (:func:`drift`): what bounds any comparison of a simulated step with a
measured one here.

It prints the figures and a YAML snippet; ``--write`` rewrites ``conf/cluster/device/cpu_host.yaml``
and ``conf/cluster/cpu2.yaml`` with them (the device kind is this CPU's profile name, so that
``costs=profiled`` finds the profiles of ``python -m harness.profile device=cpu threads=1``).
A physically impossible figure (:func:`calibration_problems`: a negative latency or cost, a
cold rank paying less than a hot one, a bandwidth <= 0 or beyond any core's, a fit that
misses its measurements by more than a factor of two - what a busy machine's stalls produce)
ends the command in one ``error:`` line naming each, exit status 1, and nothing is written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.core.machine import cpu_model, device_name

from simulators.realrun.timing import pin_to_cores
from harness.app.link_probes import MAX_BW_BPS, fit_problems, gloo_link

REPO = Path(__file__).resolve().parents[2]


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

    from simulators.realrun.timing import IdleSpinners, pinned, steady_malloc

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


#: a CPU thread's fp32 GEMM rate above this (FLOP/s) is a timing fault, not a core
MAX_FLOPS_PER_THREAD = 1e12


def calibration_problems(flops: float, copy_bps: float, threads: int, link: dict[str, Any]) -> list[str]:
    """Every physically impossible figure of a calibration (the device's and
    :func:`harness.app.link_probes.fit_problems`), one phrase each; empty when it may be written."""
    import math

    out = []
    if not (math.isfinite(flops) and 0 < flops <= MAX_FLOPS_PER_THREAD * threads):
        out.append(f"GEMM rate {flops / 1e9:.3g} GFLOP/s is no rate of {threads} thread(s) (0 to {MAX_FLOPS_PER_THREAD * threads / 1e9:g})")
    if not (math.isfinite(copy_bps) and 0 < copy_bps <= MAX_BW_BPS):
        out.append(f"copy bandwidth {copy_bps / 1e9:.3g} GB/s is no memory's (0 to {MAX_BW_BPS / 1e9:g} GB/s)")
    return out + fit_problems(link)


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
# `kind` names the CPU these figures were measured on, at {threads} thread(s): costs=profiled reads
# results/profiles/<slug of kind>/ (written by `python -m harness.profile device=cpu threads={threads}`) on that
# CPU only, and on any other says in one line to run this calibration there (docs/profiling.md).
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
# The figures are this CPU's, the one the device kind names (device/cpu_host.yaml): on another CPU
# costs=profiled refuses cpu2 in one line that says what to run there (docs/profiling.md).
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
    from harness.core.machine import thread_count

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
    problems = calibration_problems(flops, bw, a.threads, link)
    if a.json:
        Path(a.json).write_text(json.dumps({"gemm_flops": flops, "copy_Bps": bw, "threads": a.threads, "kind": kind, **link,
                                            "problems": problems}, indent=1))
    if problems:
        print(f"error: an impossible calibration, {'not written' if a.write else 'not to be written'}: {'; '.join(problems)} - a busy "
              "machine's stalls do this: rerun when it is quiet (python -m harness.calibrate --drift 60 shows how much it moves)",
              file=sys.stderr)
        return 1
    if a.write:
        (REPO / "conf" / "cluster" / "device" / "cpu_host.yaml").write_text(dev)
        (REPO / "conf" / "cluster" / "cpu2.yaml").write_text(clu)
        print("wrote conf/cluster/device/cpu_host.yaml and conf/cluster/cpu2.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
