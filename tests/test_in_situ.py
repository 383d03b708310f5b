"""``costs.in_situ`` (a kernel's sustained fraction of its isolated rate) and llm_accuracy's
held-out estimate of it (:mod:`experiments._llm_in_situ`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments._llm_in_situ import balanced_median, fold_of, held_out_factors, implied_factor
from harness.app.compose import compose
from harness.app.run import build
from harness.core.calibrated import CalibratedCostModel
from harness.core.costs import CostModelError
from harness.core.graph import OpGraph
from harness.core.kernels import ATTN, GEMM, MEM, NCOLS, KernelTable
from harness.core.precision import MATH
from tests.helpers import refused, run_harness


def costs(*overrides: str) -> CalibratedCostModel:
    c = build(compose(["model=lenet5", "cluster=dgx_a100", *overrides]))[2]
    assert isinstance(c, CalibratedCostModel)
    return c


def kernels() -> KernelTable:
    rows = [(GEMM, [1, 4096, 4096, 4096]), (MEM, [10**9]), (ATTN, [32, 2048, 2048, 128, 1, 0, 1])]
    dims = [d + [0] * (NCOLS - len(d)) for _, d in rows]
    return KernelTable(np.arange(3), [k for k, _ in rows], dims, [-1] * 3, [MATH.index("bf16")] * 3, [False] * 3)


# ---------------------------------------------------------------------------- the knob
@pytest.mark.parametrize("f", [0.5, 0.8, 0.97])
def test_in_situ_divides_every_kernel_time(f):
    base, slow = costs(), costs(f"costs.in_situ={f}")
    np.testing.assert_allclose(slow.kernel_times(kernels(), 0, 3), base.kernel_times(kernels(), 0, 3) / f, rtol=1e-12)
    src = build(compose(["model=lenet5", "cluster=dgx_a100"]))[0]
    lg = src.layer_graph(precision="bf16")
    for a, b in zip(slow.layer_times(lg, 0, 0.5), base.layer_times(lg, 0, 0.5)):
        np.testing.assert_allclose(a, b / f, rtol=1e-12)
    assert "in_situ" in slow.report() and "in_situ" not in base.report() and slow.describe()["in_situ"] == f


def test_in_situ_leaves_communication_alone():
    base, slow = costs(), costs("costs.in_situ=0.5")
    assert slow.allreduce_time(1e9, [0, 1, 2, 3]) == base.allreduce_time(1e9, [0, 1, 2, 3])


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "nan", "fast"])
def test_a_bad_in_situ_is_refused_naming_the_key(bad):
    refused(lambda: costs(f"costs.in_situ={bad}"), "costs.in_situ", kind=CostModelError)


@pytest.mark.parametrize("bad", ["-0.2", "nan", "inf", "fast"])
@pytest.mark.parametrize("model", ["calibrated", "analytical"])
def test_a_bad_overlap_slowdown_is_refused_naming_the_key(bad, model):
    refused(lambda: build(compose(["model=lenet5", "cluster=dgx_a100", f"costs={model}", f"costs.overlap_slowdown={bad}"])),
            "costs.overlap_slowdown", kind=CostModelError)


def test_a_bad_overlap_slowdown_on_the_command_line_is_one_line(tmp_path):
    p = run_harness("costs.overlap_slowdown=nan", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 1 and "Traceback" not in p.stderr and not (tmp_path / "result.json").exists()
    assert p.stderr.strip().splitlines()[-1] == "error: costs.overlap_slowdown must be a finite number >= 0, got nan"


def test_the_overlap_slowdown_is_reported_and_leaves_kernels_alone():
    base, off = costs(), costs("costs.overlap_slowdown=0")
    assert base.overlap_slowdown == pytest.approx(0.189) and off.overlap_slowdown == 0.0
    np.testing.assert_array_equal(base.kernel_times(kernels(), 0, 3), off.kernel_times(kernels(), 0, 3))
    assert "overlap_slowdown" in base.report() and "overlap_slowdown" not in off.report()
    assert base.describe()["overlap_slowdown"] == pytest.approx(0.189)


def test_a_bad_in_situ_on_the_command_line_is_one_line():
    p = run_harness("costs.in_situ=2")
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "costs.in_situ must be in (0, 1], got 2" in p.stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------------------- the held-out estimate
def test_balanced_median_gives_each_fold_one_vote():
    # six rows of one source at 0.9 and one row each of two others at 0.5 and 0.6: per row the median is 0.9, per fold 0.6
    v, f = [0.9] * 6 + [0.5, 0.6], ["a"] * 6 + ["b", "c"]
    assert float(np.median(v)) == 0.9 and balanced_median(v, f) == 0.6
    assert math.isnan(balanced_median([], []))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.3, 1.5), min_size=1, max_size=12), st.integers(1, 4))
def test_balanced_median_of_single_rows_is_the_lower_median_and_repeats_do_not_vote(values, k):
    folds = [f"s{i}" for i in range(len(values))]
    lower = sorted(values)[(len(values) - 1) // 2]
    assert balanced_median(values, folds) == lower
    assert balanced_median([v for v in values for _ in range(k)], [f for f in folds for _ in range(k)]) == lower


def frame(ratios: dict[str, list[float]]) -> pd.DataFrame:
    rows = [{"row_id": f"{g}-{i}", "group": g, "status": "simulated", "ratio": r} for g, rs in ratios.items() for i, r in enumerate(rs)]
    return pd.DataFrame(rows)


def test_a_folds_factor_never_reads_its_own_rows():
    base = {"megatron_sc21_table1": [0.8, 0.82], "torchtitan": [0.7, 0.75, 0.78], "bloom_176b": [0.7],
            "bloom_176b_topology_sweep": [0.6, 0.65, 0.7, 0.72], "mosaic_llm_foundry_fsdp": [0.65]}
    f = held_out_factors(frame(base))
    assert set(f) == {"megatron_sc21_table1", "torchtitan", "bloom", "mosaic_llm_foundry_fsdp"}  # BLOOM's two groups: one fold
    assert fold_of("bloom_176b") == fold_of("bloom_176b_topology_sweep") == "bloom"
    for fold, own in (("torchtitan", ["torchtitan"]), ("bloom", ["bloom_176b", "bloom_176b_topology_sweep"])):
        moved = {g: ([r * 3 for r in rs] if g in own else rs) for g, rs in base.items()}
        assert held_out_factors(frame(moved))[fold] == f[fold]          # its own rows do not move it
    assert held_out_factors(frame({"a": [1.3], "b": [1.4]})) == {"a": 1.0, "b": 1.0}  # never faster than alone
    assert math.isnan(held_out_factors(frame({"a": [0.8, 0.9]}))["a"])             # nothing to learn from


def test_the_calibrated_runs_preset_is_what_the_committed_runs_imply():
    """``costs=calibrated_runs`` carries the factor every source of results/llm_accuracy/rows.csv
    implies together (each source one vote), to the two decimals the preset gives."""
    from harness.app.compose import CONF

    rows = pd.read_csv(CONF.parent / "results" / "llm_accuracy" / "rows.csv")
    implied = implied_factor(rows[(rows["status"] == "simulated") & (rows["ratio"] > 0)])
    preset = costs("costs=calibrated_runs")
    assert preset.in_situ == pytest.approx(round(implied, 2), abs=1e-9)
    assert costs().in_situ == 1.0    # the default: the kernels as measured


@pytest.mark.parametrize("cluster", ["dgx_a100", "cpu2"])   # a device with kernel fits, and one the roofline costs
def test_in_situ_leaves_a_measured_node_time_as_measured(cluster):
    base, slow = (build(compose(["model=lenet5", f"cluster={cluster}", *o]))[2] for o in ((), ("costs.in_situ=0.5",)))
    src = build(compose(["model=lenet5", f"cluster={cluster}"]))[0]
    g = src.op_graph()
    g = OpGraph.from_dict({**g.to_dict(), "node_time_s": {"*": [1e-3] + [None] * (g.num_nodes - 1)}})
    t, t0 = slow.node_times(g, 0), base.node_times(g, 0)
    assert t[0] == t0[0] == 1e-3                                          # measured: as measured
    np.testing.assert_allclose(t[1:], t0[1:] / 0.5, rtol=1e-12)           # modelled: over the factor
