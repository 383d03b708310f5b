"""The pipeline simulator end to end (simulators/pipeline.py): transformer and CNN stack graphs,
real cluster presets and the analytical cost model, through ``simulators.simulate.simulate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.core.cluster import preset
from harness.core.costs import AnalyticalCostModel
from harness.core.llm.plan import plan_from_degrees
from harness.core.llm.source import LLMModel
from harness.core.llm.stack import StackGraph
from simulators.gantt import plot_gantt
from simulators.pipeline import build_pipeline_taskgraph, simulate_pipeline
from harness.core.llm.memory import STATE_BYTES
from simulators.pipeline_figures import CAT, COMM_KINDS, MEMORY_KINDS
from simulators.simulate import simulate

KEYS = ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "peak_memory_max_bytes", "memory_breakdown",
        "bubble_fraction", "comm_exposed_s", "pipeline")


def small_llm(layers: int = 8, batch: int = 64, seq: int = 1024, **kw) -> StackGraph:
    """A GPT-like model small enough to simulate in milliseconds (hidden 1024, 16 heads)."""
    return LLMModel(name="tiny", layers=layers, hidden=1024, heads=16, seq_len=seq, vocab=32000, batch_size=batch, **kw).stack_graph("amp_bf16")


@pytest.fixture(scope="module")
def h100x16():
    cluster = preset("superpod_h100", nodes=2)
    return cluster, AnalyticalCostModel(cluster)


def test_a_step_reports_the_llm_figures(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm()
    plan = plan_from_degrees(g, 16, tp=2, pp=4, micro_batch=2, zero=1)
    res = simulate(g, plan, cluster, costs)
    ex = res.extras
    assert set(KEYS) <= set(ex)
    assert 0 < ex["mfu"] <= ex["hfu"] < 1
    assert ex["mfu"] == pytest.approx(ex["hfu"])  # no recomputation: hardware = model FLOPs
    assert ex["tokens_per_s_per_gpu"] == pytest.approx(64 * 1024 / res.step_time_s / 16)
    assert set(ex["comm_exposed_s"]) == set(COMM_KINDS) and ex["comm_exposed_s"]["tp"] > 0
    assert ex["comm_exposed_s"]["cp"] == ex["comm_exposed_s"]["ep"] == 0
    assert 0 < ex["bubble_fraction"] < 1
    assert set(ex["memory_breakdown"]) == set(MEMORY_KINDS)
    assert sum(ex["memory_breakdown"].values()) == ex["peak_memory_max_bytes"] == max(res.peak_memory_bytes)
    assert ex["pipeline"]["m"] == 64 // (2 * 2) and ex["pipeline"]["pp"] == 4
    assert len(res.device_busy_s) == len(res.peak_memory_bytes) == 4  # one entry per stage
    assert not res.oom
    assert json.loads(json.dumps(res.summary()))  # result.json's figures are plain JSON
    again = simulate(g, plan, cluster, costs)
    assert again.step_time_s == res.step_time_s  # deterministic


def test_middle_stages_hold_pp_minus_s_micro_batches(h100x16) -> None:
    # uniform blocks on the middle stages: 1F1B leaves (pp - s) micro-batches' activations on stage s
    cluster, costs = h100x16
    g = small_llm(layers=8)
    plan = plan_from_degrees(g, 16, tp=2, pp=4, stages=[3, 2, 2, 3])
    tg, info = build_pipeline_taskgraph(g, plan, cluster, costs)
    res = simulate_pipeline(g, plan, cluster, costs)
    static = sum(info.static.values())
    for s in (1, 2):
        stored = sum(info.units[u].stored_bytes for u in info.stage_units[s])
        assert res.peak_memory_bytes[s] - static[s] == (4 - s) * stored


def test_recomputation_trades_memory_for_time(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm()
    runs = {r: simulate(g, plan_from_degrees(g, 16, tp=2, pp=4, recompute=r, sequence_parallel=True), cluster, costs)
            for r in ("none", "selective", "full")}
    acts = {r: x.extras["memory_breakdown"]["activations"] for r, x in runs.items()}
    assert acts["full"] < acts["selective"] < acts["none"]
    assert runs["full"].step_time_s > runs["none"].step_time_s
    assert runs["full"].extras["hfu"] > runs["full"].extras["mfu"]
    recompute = runs["full"].taskgraph.meta["cat"] == CAT["R"]
    assert recompute.any() and not (runs["none"].taskgraph.meta["cat"] == CAT["R"]).any()


def test_interleaving_shrinks_the_bubble(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm(layers=16, batch=64)
    one = simulate(g, plan_from_degrees(g, 16, tp=2, pp=4, micro_batch=1, stages=[5, 4, 4, 5]), cluster, costs)
    two = simulate(g, plan_from_degrees(g, 16, tp=2, pp=4, vpp=2, micro_batch=1, stages=[3, 2, 2, 2, 2, 2, 2, 3]), cluster, costs)
    assert two.extras["pipeline"]["schedule"] == "interleaved"
    assert two.extras["bubble_fraction"] < one.extras["bubble_fraction"]
    zb = simulate(g, plan_from_degrees(g, 16, tp=2, pp=4, schedule="zb_h1", stages=[5, 4, 4, 5]), cluster, costs)
    assert zb.extras["bubble_fraction"] < one.extras["bubble_fraction"]
    assert (zb.taskgraph.meta["cat"] == CAT["W"]).any()


def test_out_of_memory_is_a_verdict(h100x16) -> None:
    cluster, costs = h100x16
    g = LLMModel(name="big", layers=40, hidden=8192, heads=64, seq_len=4096, batch_size=32).stack_graph("amp_bf16")
    res = simulate(g, plan_from_degrees(g, 16, tp=2, pp=1, zero=0), cluster, costs)  # ~33B parameters x 16 bytes / 2
    assert res.oom and res.oom_devices == [0]
    assert res.extras["memory_breakdown"]["optimizer"] == pytest.approx(STATE_BYTES["amp_bf16"][2] / 2 * g.spec.param_count(), rel=0.01)


def test_tied_embedding_across_stages(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm(tied_embeddings=True)
    res = simulate(g, plan_from_degrees(g, 16, tp=2, pp=4), cluster, costs)
    tied = [lab for lab in res.taskgraph.label if "tied embedding" in lab]
    assert len(tied) == 2  # the first and the last stage all-reduce the shared gradient
    one = simulate(g, plan_from_degrees(g, 16, tp=2, pp=1), cluster, costs)
    assert not any("tied embedding" in lab for lab in one.taskgraph.label)


def test_zero3_fsdp_step(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm(batch=32)
    res = simulate(g, plan_from_degrees(g, 16, tp=1, pp=1, zero=3, micro_batch=1), cluster, costs)
    dp = res.taskgraph.meta["cat"] == CAT["dp"]
    m = 32 // 16
    assert dp.sum() == (2 + 1) * m * g.num_nodes  # a gather for forward and backward, a reduce-scatter, per unit and micro-batch
    mb = res.extras["memory_breakdown"]
    P = g.spec.param_count()
    assert mb["weights"] + mb["gradients"] + mb["optimizer"] == pytest.approx(sum(STATE_BYTES["amp_bf16"]) * P / 16, rel=1e-3)  # 18 bytes under bf16


def test_context_and_expert_parallelism(h100x16) -> None:
    cluster, costs = h100x16
    g = small_llm(seq=8192, batch=16)
    cp = simulate(g, plan_from_degrees(g, 16, tp=2, pp=2, cp=2), cluster, costs)
    assert cp.extras["pipeline"]["m"] == 16 // 2
    assert cp.bytes_by_class["cp"] > 0
    moe = LLMModel(name="moe", layers=4, hidden=1024, heads=16, seq_len=1024, experts=8, top_k=2, expert_ffn_hidden=2048,
                   batch_size=32).stack_graph("amp_bf16")
    ep = simulate(moe, plan_from_degrees(moe, 16, tp=1, pp=2, ep=4), cluster, costs)
    assert ep.extras["comm_exposed_s"]["ep"] > 0 and ep.bytes_by_class["ep"] > 0
    assert any("(experts)" in lab for lab in ep.taskgraph.label)  # expert gradients reduce over their own group


def test_outputs_trace_and_picture(h100x16, tmp_path: Path) -> None:
    cluster, costs = h100x16
    g = small_llm()
    res = simulate(g, plan_from_degrees(g, 16, tp=2, pp=4, vpp=2, stages=[2, 1, 1, 1, 1, 1, 1, 2]), cluster, costs)
    res.write_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "stage 0 (n0/gpu0)" in names and any(n.startswith("pp send") for n in names)
    plot_gantt(res, tmp_path / "gantt.png", title="tiny")
    assert (tmp_path / "gantt.png").stat().st_size > 10_000


def test_gpipe_on_a_cnn() -> None:
    from harness.app.compose import compose
    from harness.app.run import build

    src, cluster, _, _, _ = build(compose(["model=resnet50", "cluster=h100x8"]))
    costs = AnalyticalCostModel(cluster)
    g = src.stack_graph("fp32")
    plan = plan_from_degrees(g, 8, pp=4, dp=2, micro_batch=4, schedule="gpipe")
    res = simulate(g, plan, cluster, costs)
    assert res.extras["pipeline"]["m"] == 64 // (2 * 4)
    assert 0 < res.extras["bubble_fraction"] < 1 and res.extras["mfu"] > 0
    acts = np.array(res.peak_memory_bytes) - sum(build_pipeline_taskgraph(g, plan, cluster, costs)[1].static.values())
    assert acts[0] > 0


def test_sixteen_thousand_gpus_are_a_few_thousand_tasks() -> None:
    # Llama 3 405B on 16,384 H100s (tp 8, pp 16, dp 128, m = 16): one representative per stage
    from harness.core.llm.source import LLMModel as M

    g = M(name="llama3_405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, seq_len=8192, vocab=128256,
          batch_size=2048).stack_graph("amp_bf16")
    cluster = preset("superpod_h100", nodes=2048)
    res = simulate(g, plan_from_degrees(g, 16384, tp=8, pp=16, sequence_parallel=True, zero=1), cluster, AnalyticalCostModel(cluster))
    assert sum(res.num_tasks.values()) < 20_000
    assert res.extras["pipeline"]["m"] == 16
    assert res.extras["bubble_fraction"] == pytest.approx(15 / 31, abs=0.05)  # (p-1)/(m+p-1), compute nearly uniform


def test_large_pictures_draw_one_bar_per_pass(h100x16, tmp_path: Path, monkeypatch) -> None:
    from simulators import pipeline_gantt

    cluster, costs = h100x16
    g = small_llm()
    plan = plan_from_degrees(g, 16, tp=2, pp=4, micro_batch=2, recompute="full", schedule="zb_h1")
    res = simulate(g, plan, cluster, costs)
    rep, start, end, cat = pipeline_gantt.merged_passes(res.taskgraph, res.timeline)
    m = res.extras["pipeline"]["m"]
    assert len(rep) == 4 * (3 * m + 1)  # per stage F, B and W of every micro-batch, and the optimizer step
    assert sorted(set(cat.tolist())) == sorted(CAT[k] for k in ("F", "B", "W", "opt"))
    assert (end > start).all()
    monkeypatch.setattr(pipeline_gantt, "MERGE_FROM", 0)
    plot_gantt(res, tmp_path / "merged.png")
    assert (tmp_path / "merged.png").stat().st_size > 10_000
