"""How a speed goal is judged (``tests/helpers.assert_goal``, docs/benchmarks.md) and that a benchmark
run writes committed figures only when asked - without timing anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _pytest.outcomes import XFailed

from tests.benchmarks.reference import WORKLOADS, Reference, numpy_work, python_work
from tests.helpers import REGRESSION, assert_goal

REPO = Path(__file__).resolve().parents[1]


def fake_benchmark(rounds_s: list[float]) -> Any:
    s = sorted(rounds_s)
    stats = SimpleNamespace(min=s[0], max=s[-1], median=s[len(s) // 2], rounds=len(s))
    return SimpleNamespace(stats=SimpleNamespace(stats=stats), extra_info={})


def fake_reference(seconds: float, load: float = 0.0) -> Reference:
    """Samples of ``seconds`` and 1.5x that per workload, taken (before and after) at ``load``."""
    return Reference(samples={k: [seconds, 1.5 * seconds] for k in WORKLOADS}, finished=True, loads=[load, load])


def test_a_goal_is_a_ratio_to_the_reference_of_the_same_run() -> None:
    bench = fake_benchmark([0.30, 0.20, 0.25])
    assert_goal(bench, fake_reference(0.010), "numpy", 20.0, "x")  # 0.20 s / 10 ms = 20: met
    e = bench.extra_info
    assert e["figure_s"] == 0.20 and e["reference_stat"] == "min" and e["ratio_numpy"] == pytest.approx(20.0)
    assert e["goal_ratio"] == 20.0 and e["goal_reference"] == "numpy" and e["reference_numpy_s"] == 0.010
    # the same code on a machine twice as slow: the same ratio, the same verdict
    assert_goal(fake_benchmark([0.60, 0.40, 0.50]), fake_reference(0.020), "numpy", 20.0, "x")
    # a single round is set beside the median reference sample
    one = fake_benchmark([0.20])
    assert_goal(one, fake_reference(0.010), "python", 20.0, "x")
    assert one.extra_info["reference_stat"] == "median" and one.extra_info["ratio_python"] == pytest.approx(0.20 / 0.0125)


def test_an_unmet_goal_is_an_xfail_and_far_beyond_it_on_a_steady_machine_a_failure() -> None:
    with pytest.raises(XFailed, match=r"x: 0.3 s = 30x the numpy reference .* goal 20x: not met in this run"):
        assert_goal(fake_benchmark([0.30]), Reference(samples={k: [0.010] for k in WORKLOADS}, finished=True, loads=[0.5]),
                    "numpy", 20.0, "x")
    slow = 20.0 * REGRESSION * 1.01 * 0.010
    with pytest.raises(AssertionError, match="on a steady machine - a regression"):
        assert_goal(fake_benchmark([slow]), Reference(samples={k: [0.010] for k in WORKLOADS}, finished=True, loads=[0.5]),
                    "numpy", 20.0, "x")
    # the same figure on a busy machine (a load average above its cores) is an xfail
    with pytest.raises(XFailed, match="not met on a busy machine"):
        assert_goal(fake_benchmark([slow]), Reference(samples={k: [0.010] for k in WORKLOADS}, finished=True, loads=[999.0]),
                    "numpy", 20.0, "x")


def test_the_reference_workloads_are_fixed_work() -> None:
    assert python_work() == python_work() and numpy_work() == numpy_work()
    ref = Reference()
    ref.take(1)
    ref.finish()
    ref.finish()  # the samples after the benchmark are taken once
    assert all(len(v) == 1 + 5 for v in ref.samples.values()) and len(ref.loads) == 2
    assert ref.seconds("numpy") <= ref.seconds("numpy", "median") <= ref.seconds("numpy", "max")


def test_a_benchmark_run_writes_committed_figures_only_when_asked(tmp_path: Path) -> None:
    target = REPO / "results" / "scaling" / "benchmarks_never_written.json"
    cmd = [sys.executable, "-m", "pytest", "tests/benchmarks/test_bench_capture.py", "-m", "bench", "-k", "no_such_benchmark",
           "-p", "no:cacheprovider", "--benchmark-json", str(target)]
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RECORD_BENCHMARKS"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert "would replace committed figures under results/" in r.stderr and "HARNESS_RECORD_BENCHMARKS=1" in r.stderr
    assert not target.exists()
    # a scratch path is fine (nothing selected: nothing run, no file either)
    scratch = tmp_path / "b.json"
    r = subprocess.run(cmd[:-1] + [str(scratch)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 5, r.stdout[-2000:] + r.stderr[-2000:]  # 5: no test collected
