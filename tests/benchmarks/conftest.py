"""Benchmarks are opt-in: ``pytest tests/benchmarks -m bench``.

Every benchmark times the fixed workloads of :mod:`tests.benchmarks.reference` right before and
right after its body (the ``reference`` fixture) and records its figure beside them in its
``extra_info``: ``figure_s`` (its fastest round), ``reference_*_s`` and ``ratio_*`` (the figure
over each reference).  A run writes a JSON file only when asked (``--benchmark-json PATH``);
one into ``results/`` replaces committed figures and is refused unless
``HARNESS_RECORD_BENCHMARKS=1`` says that is meant (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.benchmarks.reference import WORKLOADS, Reference, measure

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "results"
#: the environment variable that allows a benchmark run to write its JSON under results/
RECORD_ENV = "HARNESS_RECORD_BENCHMARKS"


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("benchmark_json", None)
    if path is not None and RESULTS in Path(path).resolve().parents and os.environ.get(RECORD_ENV) != "1":
        raise pytest.UsageError(f"--benchmark-json {path} would replace committed figures under results/: write to a scratch "
                                f"path (outputs/benchmarks/...), or set {RECORD_ENV}=1 to record new ones")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # this hook sees every collected item of the session: mark only the ones in this folder
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.bench)


@pytest.fixture(autouse=True)
def reference(request: pytest.FixtureRequest) -> Iterator[Reference]:
    """The fixed workloads timed before the benchmark (and again after it, by
    :func:`tests.helpers.assert_goal` or here), recorded beside its figure."""
    ref = measure()
    yield ref
    bench: Any = request.node.funcargs.get("benchmark")
    if bench is None or bench.stats is None:
        return
    ref.finish()
    if "figure_s" in bench.extra_info:  # tests.helpers.assert_goal recorded the figure and its ratios
        return
    st = bench.stats.stats
    stat = "min" if st.rounds > 1 else "median"  # as assert_goal: a fastest round beside the fastest sample
    bench.extra_info.update({**ref.info(), "figure_s": st.min, "reference_stat": stat,
                             **{f"ratio_{kind}": st.min / ref.seconds(kind, stat) for kind in WORKLOADS}})
