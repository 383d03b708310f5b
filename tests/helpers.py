"""What tests share: small graphs and clusters that need no capture, and a tiny captured model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from harness.core.capture import TensorSpec
from harness.core.cluster import Cluster, build_cluster
from harness.core.errors import UserError
from harness.core.graph import BATCHED, FORWARD, OpGraph

REPO = Path(__file__).resolve().parents[1]
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
