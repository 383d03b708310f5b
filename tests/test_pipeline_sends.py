"""Pipeline sends between stages (:mod:`harness.core.llm.pipeline_links`): Megatron-LM's
scatter/gather (SC'21 Sec. 4.1) - without sequence parallelism each tensor-parallel rank sends
``1/t`` of the boundary activation and the next stage all-gathers it - shared by the pipeline
simulator and the plan search."""

from __future__ import annotations

import pytest

from harness.app.compose import compose
from harness.app.run import run
from harness.core.fabric import Group, collective_time, fabric_of
from harness.core.llm.pipeline_links import p2p_time_between, stage_send_time
from harness.core.llm.plan import ParallelPlan
from tests.helpers import preset_cluster


@pytest.mark.parametrize("preset, stride, a, b", [("superpod_a100", 8, 0, 1), ("dgx_h100", 2, 0, 1), ("jean_zay_a100", 8, 0, 1)])
@pytest.mark.parametrize("nbytes", [1e5, 1.2e8])
def test_a_split_send_is_its_piece_across_plus_an_all_gather(preset, stride, a, b, nbytes):
    f = fabric_of(preset_cluster(f"cluster={preset}", "cluster.nodes=2"))
    assert stage_send_time(f, nbytes, stride, a, b) == p2p_time_between(f, nbytes, stride, a, b)
    t = min(stride, 8)
    expect = p2p_time_between(f, nbytes / t, stride, a, b) + collective_time(f, "all_gather", nbytes, Group(t, 1))
    assert stage_send_time(f, nbytes, stride, a, b, t) == pytest.approx(expect)


def test_across_nodes_the_split_send_of_a_large_activation_is_faster():
    """The NIC carries 1/8 of it and NVLink, several times faster than a GPU's share of the NICs,
    gathers the rest."""
    f = fabric_of(preset_cluster("cluster=superpod_a100", "cluster.nodes=2"))
    assert f.intra_bw > 2 * f.inter_bw
    assert stage_send_time(f, 1.2e8, 8, 0, 1, 8) < stage_send_time(f, 1.2e8, 8, 0, 1)


def test_the_plan_splits_its_sends_only_without_sequence_parallelism():
    assert ParallelPlan(tp=8, pp=2, dp=1).send_split == 8
    assert ParallelPlan(tp=8, pp=2, dp=1, sequence_parallel=True).send_split == 1   # the activation is already sharded
    assert ParallelPlan(tp=8, pp=2, dp=1, scatter_gather=False).send_split == 1
    assert ParallelPlan(tp=1, pp=2, dp=1).send_split == 1


def test_megatron_runs_its_scatter_gather_unless_told_not_to():
    base = ["model=gpt3_175b", "model.layers=8", "model.batch_size=16", "cluster=superpod_a100", "cluster.nodes=2", "algo=megatron",
            "algo.tp=8", "algo.pp=2", "algo.micro_batch=1", "algo.recompute=full", "precision=amp_fp16", "output.gantt=false",
            "output.trace=false", "output.worth=false"]
    split, whole = (run(compose(base + [f"algo.scatter_gather={v}"])).row for v in ("true", "false"))
    assert split["algo_params"]["scatter_gather"] is True and whole["algo_params"]["scatter_gather"] is False
    assert split["bytes_by_class"]["pp"] * 8 == pytest.approx(whole["bytes_by_class"]["pp"])
    assert split["step_time_s"] < whole["step_time_s"]
