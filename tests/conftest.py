"""Shared fixtures: small clusters and cost models, and the tiny captured CNN of tests/helpers.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI is reproducible); set
# HYPOTHESIS_PROFILE=explore to draw fresh random examples and hunt for new counterexamples.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

# The graph cache (harness/core/graph_cache.py) of a test session lives in a fresh temporary
# directory that the CLI subprocesses inherit, so that no test depends on what an earlier run
# left in ~/.cache; HARNESS_CACHE_DIR set by the caller wins.
if "HARNESS_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["HARNESS_CACHE_DIR"] = tempfile.mkdtemp(prefix="harness-graph-cache-")

from harness.core.cluster import Cluster  # noqa: E402 - after HARNESS_CACHE_DIR is set
from harness.core.costs import AnalyticalCostModel  # noqa: E402 - after HARNESS_CACHE_DIR is set
from harness.core.graph import OpGraph  # noqa: E402 - after HARNESS_CACHE_DIR is set
from tests.helpers import IMG, LABEL, Tiny, make_cluster  # noqa: E402 - after HARNESS_CACHE_DIR is set


@pytest.fixture
def cluster4() -> Cluster:
    return make_cluster(4)


@pytest.fixture
def costs4(cluster4: Cluster) -> AnalyticalCostModel:
    return AnalyticalCostModel(cluster4, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=0.0)


@pytest.fixture(scope="module")
def tiny_graph() -> OpGraph:
    """The tiny CNN of tests/helpers.py captured at batch 8, once per test module (a module may change it)."""
    from harness.core.capture import capture

    return capture(Tiny, IMG, LABEL, batch_size=8, name="tiny")
