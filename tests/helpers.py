"""What tests share: small graphs and clusters that need no capture, and a tiny captured model."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from torch import nn

from harness.core.capture import TensorSpec
from harness.core.cluster import Cluster, build_cluster
from harness.core.errors import UserError
from harness.core.graph import BATCHED, FORWARD, OpGraph
from harness.core.strategy import Strategy

REPO = Path(__file__).resolve().parents[1]
DEVICE = {"kind": "TestGPU", "peak_tflops": 10.0, "mem_bw_GBps": 500.0, "mem_GiB": 16}


def make_cluster(gpus: int = 4, nodes: int = 1, topology: str = "switch", bw_GBps: float = 10.0, lat_us: float = 0.0, mem_GiB: float = 16) -> Cluster:
    inter = {"cls": "ib", "bw_GBps": bw_GBps / 2, "lat_us": lat_us} if nodes > 1 else None
    return build_cluster(
        "test", {**DEVICE, "mem_GiB": mem_GiB}, gpus=gpus, nodes=nodes,
        intra={"topology": topology, "cls": "nvlink", "bw_GBps": bw_GBps, "lat_us": lat_us}, inter=inter,
    )


def preset_cluster(*overrides: str) -> Cluster:
    """The cluster a job would get from ``overrides`` (``cluster=superpod_a100``, ``cluster.nodes=4``),
    through Hydra's composition of conf/ and the preset's ``_target_``, without building the rest."""
    from hydra.utils import instantiate

    from harness.app.compose import compose

    return instantiate(compose(list(overrides)).cluster, _convert_="all")


def make_graph(n: int, edges: list[tuple[int, int]], flops: list[float] | None = None, nbytes: list[int] | None = None, role: int = BATCHED) -> OpGraph:
    """A plain DAG: node i does flops[i] FLOPs (default 1 GFLOP), edge e moves nbytes[e] bytes."""
    flops = flops if flops is not None else [1e9] * n
    nb = nbytes if nbytes is not None else [1_000_000] * len(edges)
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    out_b = np.zeros(n, np.int64)
    for (a, _), b in zip(edges, nb):
        out_b[a] = max(out_b[a], b)
    return OpGraph(
        names=[f"v{i}" for i in range(n)], targets=["aten.mm.default"] * n, phase=np.full(n, FORWARD), layer=np.zeros(n),
        layer_names=["l"], flops=flops, out_bytes=out_b, work_bytes=np.zeros(n, np.int64), free=np.zeros(n, bool),
        batch_role=np.full(n, role), coloc=np.full(n, -1), src=src, dst=dst, nbytes=nb, meta={"model": "test", "batch_size": 8},
    )


# ---------------------------------------------------------------------------- random DAGs (hypothesis)
@st.composite
def random_dags(draw, max_nodes: int = 25):
    n = draw(st.integers(1, max_nodes))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=3 * n)))) if pairs else []
    flops = draw(st.lists(st.floats(0.0, 5e9), min_size=n, max_size=n))
    nbytes = draw(st.lists(st.integers(0, 50_000_000), min_size=len(edges), max_size=len(edges)))
    return make_graph(n, edges, flops, nbytes)


def random_topo_order(g: OpGraph, seed: int) -> np.ndarray:
    """A random topological numbering (Kahn with random tie-breaks)."""
    rng = np.random.default_rng(seed)
    indeg = np.bincount(g.dst, minlength=g.num_nodes)
    ready = [v for v in range(g.num_nodes) if indeg[v] == 0]
    order = np.empty(g.num_nodes, np.int64)
    k = 0
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        order[v] = k
        k += 1
        for w in g.successors(v).tolist():
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order



def random_placement(g: OpGraph, ndev: int, seed: int) -> Strategy:
    """A seeded random placement of g on ``ndev`` devices, in a random topological order."""
    rng = np.random.default_rng(seed)
    return Strategy.placement(rng.integers(0, ndev, g.num_nodes), random_topo_order(g, seed))


def receiving_cluster(ndev: int, per_message_us: float) -> Cluster:
    """CPU-like ranks on a loopback mesh whose receives preempt the op they arrive during
    (``host_comm.recv_when: busy``)."""
    return build_cluster("cpu", DEVICE, gpus=ndev, intra={"topology": "mesh", "cls": "loopback", "bw_GBps": 1.0, "lat_us": 50.0},
                         host_comm={"per_message_us": per_message_us, "recv_idle_us": 5.0, "copy_GBps": 4.0, "recv_when": "busy"})

# ---------------------------------------------------------------------------- a tiny model to capture
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


IMG = [TensorSpec((3, 8, 8))]
LABEL = TensorSpec((), "int64", 10)


def run_harness(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 600) -> "subprocess.CompletedProcess[str]":
    """``python -m harness ARGS`` in a subprocess as a user runs it (one-line errors: HYDRA_FULL_ERROR=0),
    from ``cwd`` (default the repo), with ``env`` added to the environment."""
    import os
    import subprocess
    import sys

    full = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd or REPO, env=full, capture_output=True, text=True,
                          timeout=timeout)


def user_error(exc: BaseException) -> UserError:
    """The UserError ``exc`` is or was caused by (Hydra's InstantiationException wraps it)."""
    e: BaseException | None = exc
    while e is not None and not isinstance(e, UserError):
        e = e.__cause__
    assert e is not None, f"not a user error: {type(exc).__name__}: {exc}"
    return e


def refused(fn: Callable[[], Any], *fragments: str, kind: type[UserError] = UserError) -> UserError:
    """Run ``fn``; it must raise a ``kind`` whose message is one line and holds every fragment."""
    import pytest

    with pytest.raises(Exception) as info:
        fn()
    err = user_error(info.value)
    assert isinstance(err, kind), f"{type(err).__name__} is not a {kind.__name__}: {err}"
    msg = str(err)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return err


# ---------------------------------------------------------------------------- speed goals (tests/benchmarks)
#: an unmet speed goal is an expected failure (the machine's noise, or a goal not reached yet) up to
#: this multiple of the goal, and beyond it a failure unless the machine was busy (docs/benchmarks.md)
REGRESSION = 2.0


def assert_goal(benchmark: Any, reference: Any, kind: str, goal: float, what: str, figure_s: float | None = None,
                stat: str | None = None, key: str = "", regression: float = REGRESSION) -> None:
    """A benchmark's speed goal, stated as a ratio: its figure over the ``kind`` workload of
    ``reference`` (:mod:`tests.benchmarks.reference`, timed in the same run, before and after) at
    most ``goal``.  The figure is ``figure_s``, or the fastest round (the one a shared machine's
    drift moves least; a single round: that round); ``stat`` is the reference statistic beside
    it (default: ``min`` for a fastest round of several, ``median`` otherwise).  Records the
    figure, the reference and the ratio in ``extra_info`` (keys prefixed ``key_`` when given).  An
    unmet goal is an xfail carrying the figures; a ratio beyond ``regression`` x the goal fails
    (a regression), unless the machine was busy around the benchmark (``reference.busy()``:
    there every figure is an xfail)."""
    import pytest

    reference.finish()
    st = benchmark.stats.stats
    fig = st.min if figure_s is None else figure_s
    stat = stat or ("min" if figure_s is None and st.rounds > 1 else "median")
    ref = reference.seconds(kind, stat)
    ratio = fig / ref
    pre = f"{key}_" if key else ""
    benchmark.extra_info.update({**reference.info(), f"{pre}figure_s": fig, f"{pre}reference_stat": stat, f"{pre}goal_reference": kind,
                                 f"{pre}goal_ratio": goal, "best_s": st.min, "median_s": st.median,
                                 **{f"{pre}ratio_{k}": fig / reference.seconds(k, stat) for k in reference.samples}})
    load = "/".join(f"{x:.1f}" for x in reference.loads)
    text = (f"{what}: {fig:.4g} s = {ratio:.3g}x the {kind} reference ({stat} {ref * 1e3:.1f} ms in this run, spread "
            f"{reference.spread(kind) * 100:.0f} %, load average {load}), goal {goal:.3g}x")
    if ratio <= goal:
        return
    if reference.busy():
        pytest.xfail(f"{text}: not met on a busy machine")
    assert ratio <= regression * goal, f"{text}: over {regression:g}x the goal on a steady machine - a regression"
    pytest.xfail(f"{text}: not met in this run")


def kernel_graph(rows: list[tuple[int, list[int], int, int]], rnn: bool = False) -> OpGraph:
    """One node per kernel row (kind, dims, batch column, math mode), each its own layer-less op."""
    from harness.core.kernels import NCOLS, KernelTable

    n = len(rows)
    kt = KernelTable(list(range(n)), [r[0] for r in rows], [list(r[1]) + [0] * (NCOLS - len(r[1])) for r in rows],
                     [r[2] for r in rows], [r[3] for r in rows], [rnn] * n)
    return OpGraph(names=[f"k{i}" for i in range(n)], targets=["aten.mm.default"] * n, phase=[0] * n, layer=[0] * n,
                   layer_names=["l"], flops=kt.flops(), out_bytes=[0] * n, work_bytes=[0] * n, free=[False] * n,
                   batch_role=[0] * n, coloc=[-1] * n, src=[], dst=[], nbytes=[], kernels=kt)
