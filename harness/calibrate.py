"""Calibrate a CPU "device" and the gloo link between two of them on this machine.

``python -m harness.calibrate [--threads 1] [--write]``

Measures, with the process pinned to ``threads`` cores and ``torch.set_num_threads(threads)``:

* single-precision GEMM throughput (``torch.mm`` of two n x n matrices, median of repetitions,
  ``2 n^3`` FLOPs per call): the device's ``peak_tflops``;
* memory bandwidth: ``dst.copy_(src)`` of a tensor much larger than the caches, bytes read
  plus bytes written per second (the roofline's ``work_bytes`` counts both): ``mem_bw_GBps``;
* the gloo link: two processes pinned to their own cores ping-pong tensors of growing size
  with ``send``/``recv`` on loopback; half a round trip per size, then a least-squares fit of
  ``t = lat + bytes / bw``: ``lat_us`` and ``bw_GBps`` of cpu2's links.  A two-rank gloo
  all-reduce is timed too, for comparison with the ring formula of the cost model.

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

from harness.profile import cpu_model, device_name, pin_to_cores

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


SIZES = [4, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _pingpong(rank: int, world: int, init: str, threads: int, reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    pin_to_cores(threads, offset=rank * threads)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    peer = 1 - rank
    res: dict[str, Any] = {"p2p": {}, "allreduce": {}}
    for size in SIZES:
        t = torch.ones(max(1, size // 4))
        r = max(3, reps if size <= (1 << 20) else reps // 4)
        ts = []
        for k in range(r + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
            if k >= 2:
                ts.append((time.perf_counter() - t0) / 2)
        res["p2p"][size] = statistics.median(ts)
        ts = []
        for k in range(r + 2):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if k >= 2:
                ts.append(time.perf_counter() - t0)
        res["allreduce"][size] = statistics.median(ts)
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def gloo_link(threads: int = 1, reps: int = 50) -> dict[str, Any]:
    """Half round trip and all-reduce times per size between two pinned gloo ranks, and the
    alpha-beta fit ``lat_s``, ``bw_Bps`` (least squares over the sizes)."""
    import numpy as np
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res.json")
        mp.spawn(_pingpong, args=(2, f"file://{d}/rdzv", threads, reps, out), nprocs=2, join=True)
        res = json.loads(Path(out).read_text())
    sizes = np.array([float(s) for s in res["p2p"]])
    t = np.array(list(res["p2p"].values()))
    A = np.vstack([np.ones_like(sizes), sizes]).T
    # weight by 1/t so that small messages (latency) count as much as big ones (bandwidth)
    coef, *_ = np.linalg.lstsq(A / t[:, None], np.ones_like(t), rcond=None)
    lat = max(float(coef[0]), float(t.min()) * 0.5)
    bw = 1.0 / float(coef[1]) if coef[1] > 0 else float(sizes[-1] / t[-1])
    return {"lat_s": lat, "bw_Bps": bw, "p2p_s": res["p2p"], "allreduce_s": res["allreduce"]}


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


def cluster_yaml(lat: float, bw: float, threads: int, when: str, allreduce: dict[str, float]) -> str:
    ar = ", ".join(f"{int(s) // 1024} KiB {t * 1e6:.0f} us" for s, t in allreduce.items() if int(s) >= 65536)
    return f"""# cpu2: two CPU devices of {threads} core(s) each on this machine - the cluster the real-run
# tests and the simulator-accuracy experiment (python -m experiments sim_accuracy) run on:
# sim=realrun pins rank r to its own core(s) with {threads} torch thread(s), and the ranks talk
# gloo over loopback. Device figures: conf/cluster/device/cpu_host.yaml.
# Link: gloo send/recv between two pinned processes, half a ping-pong round trip per size,
# least-squares alpha-beta fit; measured by `python -m harness.calibrate --threads {threads} --write`
# on {when}: latency {lat * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s.
# (gloo all-reduce of 2 ranks, for comparison with the ring formula: {ar}.)
defaults:
  - device: cpu_host
_target_: harness.cluster.build_cluster
name: cpu2
gpus: 2          # devices per host (CPU devices here)
nodes: 1
intra: {{topology: mesh, cls: loopback, bw_GBps: {bw / 1e9:.3f}, lat_us: {lat * 1e6:.2f}}}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="cores and torch threads per device (default 1, as cpu2)")
    ap.add_argument("--reps", type=int, default=50, help="ping-pong repetitions per size")
    ap.add_argument("--write", action="store_true", help="rewrite conf/cluster/device/cpu_host.yaml and conf/cluster/cpu2.yaml")
    ap.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    a = ap.parse_args(argv)
    import torch

    pin_to_cores(a.threads)
    torch.set_num_threads(a.threads)
    when = _dt.date.today().isoformat() + f" (torch {torch.__version__})"
    flops = gemm_flops(a.threads)
    bw = copy_bandwidth(a.threads)
    print(f"GEMM fp32: {flops / 1e9:.1f} GFLOP/s   copy: {bw / 1e9:.2f} GB/s   ({a.threads} thread(s), {cpu_model()})")
    link = gloo_link(a.threads, a.reps)
    print(f"gloo p2p: latency {link['lat_s'] * 1e6:.1f} us, bandwidth {link['bw_Bps'] / 1e9:.2f} GB/s")
    for s, t in link["p2p_s"].items():
        print(f"  {int(s):>10} B  one-way {t * 1e6:9.1f} us   all-reduce {link['allreduce_s'][s] * 1e6:9.1f} us")
    kind = device_name("cpu", a.threads)
    dev = device_yaml(kind, flops, bw, _mem_gib_per_device(2), a.threads, when)
    clu = cluster_yaml(link["lat_s"], link["bw_Bps"], a.threads, when, link["allreduce_s"])
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
