"""``python -m experiments llm_plans``: the cases, the plan diffs, the BLOOM ranking, the outputs
(experiments/llm_plans.py and its helpers)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments import llm_plans
from experiments._llm_plans_cases import (
    PRESET_GPUS, SWEEP_GROUP, Case, preset_cases, preset_recipes, row_cases, split_overrides, sweep_key,
)
from experiments._llm_plans_run import SPLIT_KINDS, describe_plan, diff_plans, explain, split_delta, time_split
from experiments._llm_rows import Published, RowJob
from harness.app.compose import compose

PLAN = {"tp": 8, "pp": 8, "dp": 16, "cp": 1, "ep": 1, "vpp": 3, "schedule": "interleaved", "micro_batch": 1, "recompute": "selective",
        "sequence_parallel": True, "zero": 1, "stages": [4] * 24, "overlap_grad_reduce": True, "overlap_param_gather": True}


def test_time_split_adds_up_to_the_step() -> None:
    row = {"step_time_s": 10.0, "bubble_fraction": 0.1, "comm_exposed_s": {"tp": 1.0, "cp": 0.0, "ep": 0.0, "pp": 0.5, "dp": 0.25}}
    split = time_split(row, recompute_s=2.0)
    assert set(split) == set(SPLIT_KINDS)
    assert sum(split.values()) == pytest.approx(10.0)
    assert split["bubble"] == pytest.approx(1.0) and split["recompute"] == 2.0 and split["compute"] == pytest.approx(5.25)


def test_plan_diff_names_each_changed_choice() -> None:
    other = {**PLAN, "tp": 4, "pp": 16, "dp": 16 * 8 * 8 // (4 * 16), "vpp": 1, "schedule": "zb_h1", "recompute": "full",
             "sequence_parallel": False, "stages": [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 9]}
    d = diff_plans(PLAN, other)
    assert d[:2] == ["TP: 8 -> 4", "PP: 8 -> 16"]
    assert "schedule: interleaved -> zb_h1" in d and "SP: on -> off" in d and "recompute: selective -> full" in d
    assert "stages: even -> uneven" in d
    assert diff_plans(PLAN, dict(PLAN)) == []
    assert diff_plans(PLAN, {**PLAN, "stages": [5, 3] + [4] * 22}) == ["stages: even -> uneven"]
    assert diff_plans(PLAN, {**PLAN, "stages": [5] + [4] * 22 + [4]}) == ["stages: re-cut"]
    assert describe_plan(PLAN) == "tp 8 x pp 8 x dp 16, interleaved vpp 3, mb 1, recompute selective, SP, ZeRO 1"


def test_explanation_lists_the_choices_then_the_parts_that_moved() -> None:
    split = {k: 0.0 for k in SPLIT_KINDS}
    a = {"plan": PLAN, "step_s": 10.0, "split": {**split, "compute": 8.0, "recompute": 2.0}}
    b = {"plan": {**PLAN, "recompute": "none"}, "step_s": 8.0, "split": {**split, "compute": 8.0}}
    assert explain(a, b) == "recompute: selective -> none (recompute -2 s)"
    assert explain(a, dict(a)) == "the search keeps the published plan"
    assert explain({"error": "x"}, b) == ""
    assert split_delta(a["split"], b["split"], 10.0) == [("recompute", -2.0)]


def test_search_overrides_compose_into_the_seed_plan() -> None:
    ov = llm_plans.search_overrides(PLAN, 3.0)
    cfg = compose(["model=gpt3_175b", "cluster=superpod_a100", "cluster.nodes=128", *ov])
    assert cfg.algo.name == "hybrid_search" and cfg.algo.budget_s == 3.0
    seed = dict(cfg.algo.seed_plan)
    assert seed["tp"] == 8 and seed["sequence_parallel"] is True and list(seed["stages"]) == [4] * 24
    assert set(seed) <= set(llm_plans.SEED_KEYS)
    assert llm_plans.search_overrides(None, None) == ["algo=hybrid_search"]


def test_every_row_is_a_case_and_its_plan_is_algo_overrides() -> None:
    cases = row_cases()
    assert len(cases) == 91  # every row of the published table, expressed or with its reason
    for c in cases:
        assert all(o.startswith(("algo=", "algo.")) for o in c.published)
        assert not any(o.startswith("algo") for o in c.base)
        assert c.reason or c.published
    base, plan = split_overrides(["model=llm", "algo=megatron", "algo.tp=2", "precision=amp_bf16"])
    assert base == ("model=llm", "precision=amp_bf16") and plan == ("algo=megatron", "algo.tp=2")


def test_preset_cases_take_the_published_recipe_with_dp_derived() -> None:
    rows = row_cases(["MEG21-T1-1", "TT-H200-1", "TT-T1-1"])
    presets = {k: PRESET_GPUS[k] for k in ("gpt3_175b", "llama3_8b", "mixtral_8x7b")}
    recipes = preset_recipes(presets, rows)
    assert "mixtral_8x7b" not in recipes  # no published run of a MoE shape: FSDP is its baseline
    assert recipes["llama3_8b"].key == "TT-T1-1"  # an H100 run for an H100 cluster, not the faster H200 one
    cases = preset_cases(presets, recipes)
    assert [c.gpus for c in cases] == [*PRESET_GPUS["gpt3_175b"][1], *PRESET_GPUS["llama3_8b"][1], *PRESET_GPUS["mixtral_8x7b"][1]]
    for c in cases:
        assert f"cluster.nodes={c.gpus // 8}" in c.base
        assert not any(o.startswith("algo.dp=") for o in c.published)
        assert bool(c.published) == (c.model != "mixtral_8x7b")
    gpt = cases[0]
    assert "algo.tp=8" in gpt.published and "algo.vpp=3" in gpt.published  # Korthikanti's GPT-3 configuration
    assert "algo=fsdp" in cases[3].published  # torchtitan's FSDP run of Llama 3 8B


def test_preset_counts_run_from_8_to_16384_gpus_on_whole_nodes() -> None:
    counts = [g for _, gs in PRESET_GPUS.values() for g in gs]
    assert min(counts) == 8 and max(counts) == 16384 and all(g % 8 == 0 for g in counts)


def _sweep_case(key: str, tp: int, published: float | None, oom: bool = False) -> Case:
    job = RowJob(key, SWEEP_GROUP, "BLOOM", (), "", (), 384, 2048, 2048, "amp_bf16", "full", 12, 1, 2, 8, "1f1b",
                 None if published is None else Published("tflops_per_gpu", published), None, oom)
    return Case(key, "row", "BLOOM", 384, ("model=bloom_176b", f"model.name={key.lower()}"), ("algo=megatron", f"algo.tp={tp}"), "", "", job)


def test_bloom_ranking_takes_the_simulators_first_and_pools_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configuration the simulation ranks first (the fastest that fits) is compared by its
    published throughput (repeats pooled by their mean) with the best published one."""
    monkeypatch.setattr(llm_plans, "_published_tflops", lambda case: {"A": 140.0, "A2": 150.0, "B": 150.0, "C": math.nan}[case.key])
    monkeypatch.setattr(llm_plans, "_sim_tflops", lambda case, sim: 1000.0 / sim["step_s"])
    res = [
        {"case": _sweep_case("A", 4, 140.0), "published": {"step_s": 10.0, "oom": False, "plan": PLAN}},
        {"case": _sweep_case("A2", 4, 150.0), "published": {"step_s": 10.0, "oom": False, "plan": PLAN}},  # a repeat of A
        {"case": _sweep_case("B", 8, 150.0), "published": {"step_s": 11.0, "oom": False, "plan": PLAN}},
        {"case": _sweep_case("C", 2, None, oom=True), "published": {"step_s": 5.0, "oom": True, "plan": PLAN}},
    ]
    assert sweep_key(res[0]["case"]) == sweep_key(res[1]["case"])
    by, summary = llm_plans.bloom_ranking(res)
    assert len(by) == 3 and int(by.loc[by["case"] == "A", "repeats"].iloc[0]) == 2
    assert summary["top_case"] == "A" and summary["top_published"] == pytest.approx(145.0)
    assert summary["best_case"] == "B" and summary["ratio"] == pytest.approx(145.0 / 150.0)
    assert summary["false_oom"] == 0 and summary["published_oom"] == 1 and summary["missed_oom"] == 0
    assert summary["variants"]["BLOOM, amp_bf16"]["ratio"] == pytest.approx(summary["ratio"])
    # a configuration that ran out of memory in the sweep but that the simulation ranks first scores 0
    res[3]["published"] = {"step_s": 5.0, "oom": False, "plan": PLAN}
    _, summary = llm_plans.bloom_ranking(res)
    assert summary["top_case"] == "C" and summary["ratio"] == 0.0 and summary["missed_oom"] == 1


def test_quick_run_writes_its_tables_figure_and_readme(tmp_path) -> None:
    out = tmp_path / "plans"
    assert llm_plans.main(["--quick", "--rows", "KOR22-1b", "--presets", "--costs", "analytical", "--out", str(out)]) == 0
    for name in ("plans.csv", "bloom_sweep.csv", "block_splits.csv", "block_layers.csv", "throughput_vs_gpus.png", "README.md"):
        assert (out / name).exists(), name
    plans = pd.read_csv(out / "plans.csv")
    row = plans.iloc[0]
    assert row["case"] == "KOR22-1b" and bool(row["never_slower"])
    assert row["searched_step_s"] <= row["published_step_s"] * (1 + 1e-9)
    readme = (out / "README.md").read_text()
    assert "## Goals" in readme and "KOR22-1b" in readme and "rediscover Megatron" in readme
    blocks = pd.read_csv(out / "block_splits.csv")
    assert set(blocks["solver"]) == {"pase", "optcnn", "optcnn_table1"}


def test_mistakes_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    for args, fragment in ((["--rows", "NOPE"], "unknown published row"), (["--presets", "gpt9"], "unknown preset"),
                           (["--costs", "nope"], "unknown cost model"), (["--budget", "-1"], "--budget")):
        with pytest.raises(SystemExit) as e:
            llm_plans.main([*args, "--quick", "--out", str(tmp_path)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1
