"""Capture time of every zoo model (goal: resnet50 at batch 64 under 10 s)."""

from __future__ import annotations

import pytest

from experiments.common import zoo_models
from harness.compose import compose
from harness.core.capture import capture
from harness.run import build


@pytest.mark.parametrize("name", zoo_models())
def test_capture(benchmark, name):
    cfg = compose([f"model={name}"] + (["model.batch_size=64"] if name == "resnet50" else []))
    src = build(cfg)[0]
    g = benchmark.pedantic(lambda: capture(src.build, src.inputs, src.target, src.loss, src.batch_size, name=name), rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update({"nodes": g.num_nodes, "edges": g.num_edges, "batch": src.batch_size})
