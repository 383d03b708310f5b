"""llm_accuracy's quick run (issue 34): ``python -m experiments llm_accuracy --quick``, a handful
of published rows (:data:`experiments.llm_accuracy.QUICK_ROWS`) simulated, re-run under their
held-out in-situ factors and written up, in under a minute (the issue's goal:
GOALS["quick"] x the ``python`` reference of :mod:`tests.benchmarks.reference`, about 14 ms on the
2-core VM: 60 s; the work is interpreter-bound - Hydra composing each row's config, the plans'
simulations, the tables and the figure)."""

from __future__ import annotations

from experiments import llm_accuracy
from tests.helpers import assert_goal

#: the goal as a ratio to the python reference: 60 s
GOALS = {"quick": 4300}


def test_llm_accuracy_quick(benchmark, reference, tmp_path):
    out = tmp_path / "quick"
    rc = benchmark.pedantic(lambda: llm_accuracy.main(["--quick", "--out", str(out)]), rounds=2, iterations=1, warmup_rounds=0)
    assert rc == 0 and (out / "README.md").stat().st_size > 0
    benchmark.extra_info["rows"] = len(llm_accuracy.QUICK_ROWS)
    assert_goal(benchmark, reference, "python", GOALS["quick"], "llm_accuracy --quick")
