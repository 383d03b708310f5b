"""Shared fixtures: small graphs, clusters and cost models that need no capture."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI is reproducible); set
# HYPOTHESIS_PROFILE=explore to draw fresh random examples and hunt for new counterexamples.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

from harness.cluster import Cluster, build_cluster
from harness.costs import AnalyticalCostModel
from harness.graph import BATCHED, FORWARD, OpGraph

DEVICE = {"kind": "TestGPU", "peak_tflops": 10.0, "mem_bw_GBps": 500.0, "mem_GiB": 16}


def make_cluster(gpus: int = 4, nodes: int = 1, topology: str = "switch", bw_GBps: float = 10.0, lat_us: float = 0.0, mem_GiB: float = 16) -> Cluster:
    inter = {"cls": "ib", "bw_GBps": bw_GBps / 2, "lat_us": lat_us} if nodes > 1 else None
    return build_cluster(
        "test", {**DEVICE, "mem_GiB": mem_GiB}, gpus=gpus, nodes=nodes,
        intra={"topology": topology, "cls": "nvlink", "bw_GBps": bw_GBps, "lat_us": lat_us}, inter=inter,
    )


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


@pytest.fixture
def cluster4() -> Cluster:
    return make_cluster(4)


@pytest.fixture
def costs4(cluster4: Cluster) -> AnalyticalCostModel:
    return AnalyticalCostModel(cluster4, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=0.0)
