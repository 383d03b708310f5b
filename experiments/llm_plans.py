"""Searched LLM plans beside the published (hand-tuned) ones and FSDP, on every published configuration and every model preset.

For each published configuration of ``harness/data/llm/published_llm_training.csv`` that the
harness can express (the rows as :mod:`experiments._llm_rows` reads them, with the assumptions
it states) and for each model preset at three GPU counts from 8 to 16,384
(:data:`experiments._llm_plans_cases.PRESET_GPUS`), three plans are simulated side by side on
the same model, cluster, global batch and precision:

* **published**: the row's own plan (``algo=megatron`` with its degrees, or ``algo=fsdp`` where
  the row ran FSDP); for a preset, the plan of the published run of its shape with the
  data-parallel degree its GPU count leaves (none where no run has its shape);
* **FSDP**: ``algo=fsdp`` (ZeRO-3 over every GPU; torchtitan's FSDP + TP 8 where the batch has
  fewer sequences than GPUs), with the published plan's recomputation (full without one);
* **searched**: ``algo=hybrid_search``, seeded with the published plan (else FSDP), so that it is
  never slower than it in simulation; its search time.

Outputs (``results/llm_plans/``; ``--quick``: a scratch dir): ``plans.csv`` (every case: the three
plans, their simulated step, tokens/s and model TFLOP/s per GPU, MFU, memory, OOM, the search's
time and completeness, what differs between the searched and the published plan and which parts
of the step moved), ``bloom_sweep.csv`` (BLOOM's topology sweep ranked by the simulator: the
published throughput of the configuration ranked first against the best published one),
``block_splits.csv`` and ``block_layers.csv`` (PaSE's DP and OptCNN's elimination on one
transformer block over a TP group: do they rediscover Megatron's column/row split;
:mod:`algorithms.block_splits`), ``throughput_vs_gpus.png`` (simulated tokens/s per GPU against
the GPU count per model, searched against published and FSDP) and a README written from these
tables.  Every simulated figure uses the harness's default cost model (``costs=calibrated``) unless
``--costs`` names another.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from tqdm import tqdm

from algorithms.llm_search_seeds import SEED_KEYS
from experiments._llm_block_splits import block_split_table, layer_table
from experiments._llm_figures import convention_flops
from experiments._llm_plans_cases import (
    PRESET_GPUS, QUICK_BUDGET_S, QUICK_PRESETS, QUICK_ROWS, SWEEP_GROUP, Case, preset_cases, preset_recipes, row_cases, spec_of_overrides,
    sweep_key,
)
from experiments._llm_plans_report import plot_throughput, write_readme
from experiments._llm_plans_run import describe_plan, explain, simulate
from experiments._llm_rows import load_rows, override_value
from experiments.common import experiment_args, output_dir, print_table
from harness.app.compose import CONF
from harness.core.errors import OptionError

#: the presets whose block is split over a TP group (a dense GPT, Llama's GQA, a MoE's attention)
BLOCK_MODELS: tuple[tuple[str, str], ...] = (
    ("gpt_1p7b", "superpod_a100"), ("gpt3_175b", "superpod_a100"), ("gpt_1t", "superpod_a100"), ("bloom_176b", "jean_zay_a100"),
    ("llama3_8b", "superpod_h100"), ("llama3_70b", "superpod_h100"), ("llama3_405b", "superpod_h100"),
    ("nemotron4_340b", "superpod_h100"), ("mixtral_8x7b", "superpod_h100"),
)
QUICK_BLOCK_MODELS: tuple[tuple[str, str], ...] = (("gpt3_175b", "superpod_a100"),)
#: blocks shown layer by layer in the README
BLOCK_DETAIL: tuple[tuple[str, int], ...] = (("gpt3_175b", 8), ("llama3_70b", 8))


def search_overrides(seed: dict[str, Any] | None, budget_s: float | None) -> list[str]:
    """``algo=hybrid_search`` seeded with a simulated plan (``algo.seed_plan``: its degrees,
    schedule, micro-batch, recomputation, ZeRO, stages and overlap flags), with a budget."""
    out = ["algo=hybrid_search"]
    if budget_s is not None:
        out.append(f"algo.budget_s={budget_s:g}")
    if seed:
        parts = [f"{k}:{_hydra(seed[k])}" for k in SEED_KEYS if k in seed]
        out.append("algo.seed_plan={" + ",".join(parts) + "}")
    return out


def _hydra(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra(x) for x in v) + "]"
    return str(v)


def fsdp_overrides(case: Case, recompute: str, gpus: int, batch: int) -> list[str]:
    """FSDP over every GPU, or torchtitan's FSDP + TP 8 (with SP) when the batch has fewer sequences than GPUs."""
    if batch and batch % gpus == 0:
        return ["algo=fsdp", f"algo.recompute={recompute}"]
    return ["algo=fsdp", "algo.tp=8", "algo.sequence_parallel=true", f"algo.recompute={recompute}"]


def run_case(case: Case, budget_s: float | None) -> dict[str, Any]:
    """The three plans of one case (module docstring), each a :func:`simulate` answer."""
    out: dict[str, Any] = {"case": case}
    if case.reason:
        return out
    pub = simulate(case.base + case.published) if case.published else None
    batch = int(override_value(case.base, "model.batch_size") or 0) or _preset_batch(case)
    recompute = override_value(case.published, "algo.recompute") or "full"
    fsdp = simulate(case.base + tuple(fsdp_overrides(case, recompute, case.gpus, batch)))
    seed = pub if pub is not None and "error" not in pub else (fsdp if "error" not in fsdp else None)
    found = simulate(case.base + tuple(search_overrides(seed["plan"] if seed else None, budget_s)))
    out.update(published=pub, fsdp=fsdp, searched=found, seeded_with="published" if seed is pub and pub else "fsdp" if seed else "none")
    return out


def _preset_batch(case: Case) -> int:
    from harness.app.compose import compose

    return int(compose([o for o in case.base if o.startswith("model")]).model.batch_size)


def case_row(res: dict[str, Any]) -> dict[str, Any]:
    """One row of ``plans.csv``."""
    case: Case = res["case"]
    row: dict[str, Any] = {"case": case.key, "kind": case.kind, "model": case.model, "gpus": case.gpus,
                           "group": case.row.group if case.row else "preset", "published_source": case.source,
                           "not_expressed": case.reason}
    for name in ("published", "fsdp", "searched"):
        r = res.get(name)
        if r is None:
            continue
        if "error" in r:
            row[f"{name}_error"] = r["error"]
            continue
        row.update({f"{name}_plan": describe_plan(r["plan"]), f"{name}_step_s": r["step_s"],
                    f"{name}_tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"], f"{name}_model_tflops_per_gpu": r["model_tflops_per_gpu"],
                    f"{name}_mfu": r["mfu"], f"{name}_peak_mem_gib": r["peak_mem_gib"], f"{name}_oom": r["oom"]})
    found, pub = res.get("searched"), res.get("published")
    if found is not None and "error" not in found:
        row.update({"search_s": found["search_s"], "search_complete": found["info"].get("search_complete"),
                    "candidates_total": found["info"].get("candidates_total"), "simulated": found["info"].get("simulated"),
                    "seeded_with": res.get("seeded_with")})
        if pub is not None and "error" not in pub:
            row["what_differs"] = explain(pub, found)
            if pub["oom"]:  # a plan that does not fit has no step to beat: the search's fits (or says it does not)
                row["never_slower"] = not found["oom"]
            else:
                row["gain"] = pub["step_s"] / found["step_s"] - 1.0
                row["never_slower"] = found["step_s"] <= pub["step_s"] * (1 + 1e-9) and not found["oom"]
    return row


def bloom_ranking(results: Sequence[dict[str, Any]]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """BLOOM's topology sweep ranked by the simulator: per configuration (repeats pooled) the
    published and the simulated throughput (TFLOP/s per GPU in BigScience's own convention, the
    96-coefficient hardware FLOPs: the same count for every configuration of one model and batch,
    so the simulated figure ranks as the simulated tokens/s); the configuration ranked first and
    its published throughput against the best published one (:func:`rank_summary`), over the
    whole sweep and per model variant and precision (``variants``)."""
    rows = []
    for res in results:
        case: Case = res["case"]
        if case.row is None or case.row.group != SWEEP_GROUP:
            continue
        sim = res.get("published")
        ok = sim is not None and "error" not in sim
        rows.append({"config": str(sweep_key(case)), "case": case.key, "variant": f"{case.model}, {case.row.precision}",
                     "plan": describe_plan(sim["plan"]) if ok else "", "published_tflops_per_gpu": _published_tflops(case),
                     "published_oom": case.row.published_oom, "simulated_step_s": sim["step_s"] if ok else math.nan,
                     "simulated_tflops_per_gpu": _sim_tflops(case, sim) if ok else math.nan,
                     "simulated_oom": sim["oom"] if ok else None})
    df = pd.DataFrame(rows)
    if df.empty:
        return df, {"configs": 0}
    by = df.groupby("config", sort=False).agg(case=("case", "first"), variant=("variant", "first"), plan=("plan", "first"),
                                               repeats=("case", "size"), published=("published_tflops_per_gpu", "mean"),
                                               simulated=("simulated_tflops_per_gpu", "first"), simulated_oom=("simulated_oom", "first"),
                                               published_oom=("published_oom", "any")).reset_index(drop=True)
    fits = by["simulated_oom"].map(lambda x: x is False)
    by["simulated_rank"] = by["simulated"].where(fits).rank(ascending=False, method="first")
    summary = rank_summary(by)
    summary["variants"] = {v: rank_summary(part) for v, part in by.groupby("variant", sort=False) if len(part) >= 3}
    return by, summary


def rank_summary(by: pd.DataFrame) -> dict[str, Any]:
    """The configuration the simulation ranks first (the highest simulated throughput among those
    it says fit) against the best published one: the published throughput of the first over the
    best's (0 when the first ran out of memory in the published run), the out-of-memory verdicts."""
    fits = by["simulated_oom"].map(lambda x: x is False)
    out: dict[str, Any] = {"configs": int(len(by)), "published_oom": int(by["published_oom"].sum()),
                           "false_oom": int((~fits & ~by["published_oom"]).sum()), "missed_oom": int((fits & by["published_oom"]).sum())}
    cands, ran = by[fits & by["simulated"].notna()], by[by["published"].notna()]
    if len(cands) and len(ran):
        top = cands.sort_values("simulated", ascending=False).iloc[0]
        best = ran.sort_values("published", ascending=False).iloc[0]
        top_pub = 0.0 if bool(top["published_oom"]) or not math.isfinite(float(top["published"])) else float(top["published"])
        out.update(ranked=int(len(cands)), top_case=top["case"], top_plan=top["plan"], top_published=top_pub, best_case=best["case"],
                   best_plan=best["plan"], best_published=float(best["published"]), ratio=top_pub / float(best["published"]))
    return out


def _published_tflops(case: Case) -> float:
    """A sweep row's published TFLOP/s per GPU (the CSV's column, whatever figure the row job compares; NaN: none)."""
    for r in load_rows():
        if r["row_id"] == case.key:
            try:
                return float(r["tflops_per_gpu"])
            except ValueError:
                return math.nan
    return math.nan


def _sim_tflops(case: Case, sim: dict[str, Any]) -> float:
    """The simulated step in BigScience's TFLOP/s per GPU (96 B s l h^2 (1 + s/6h + V/16lh))."""
    job = case.row
    assert job is not None
    flops = convention_flops("narayanan96", spec_of_overrides(case.base), job.batch, job.recompute, hardware=True)
    return flops / (case.gpus * sim["step_s"]) / 1e12


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("llm_plans", __doc__.splitlines()[0], "llm_plans",
                         quick=f"{len(QUICK_ROWS)} published rows, {len(QUICK_PRESETS)} presets at one GPU count, one block, "
                               f"searches of {QUICK_BUDGET_S:g} s")
    ap.add_argument("--rows", nargs="*", default=None, metavar="ROW_ID", help="published rows to run (default: all)")
    ap.add_argument("--presets", nargs="*", default=None, metavar="MODEL", help=f"presets to run (default: {', '.join(PRESET_GPUS)})")
    ap.add_argument("--budget", type=float, default=None, metavar="S",
                    help=f"algo.budget_s of each search (default: the algorithm's, none; --quick: {QUICK_BUDGET_S:g})")
    ap.add_argument("--costs", default=None, metavar="NAME", help="the cost model of every job (a conf/costs file; default: the config's)")
    a = ap.parse_args(argv)
    if not (CONF / "algo" / "hybrid_search.yaml").exists():
        raise OptionError("algo=hybrid_search is not registered (conf/algo/hybrid_search.yaml): this experiment compares its plans")
    if a.budget is not None and not (math.isfinite(a.budget) and a.budget >= 0):
        ap.error(f"--budget takes seconds >= 0, got {a.budget}")
    unknown = sorted(set(a.presets or ()) - set(PRESET_GPUS))
    if unknown:
        ap.error(f"unknown preset {unknown[0]!r}: one of {', '.join(PRESET_GPUS)}")
    t0 = time.perf_counter()
    all_rows = row_cases()
    ids = a.rows if a.rows is not None else (list(QUICK_ROWS) if a.quick else None)
    if ids is not None:
        missing = sorted(set(ids) - {c.key for c in all_rows})
        if missing:
            ap.error(f"unknown published row {missing[0]!r}: the ids are the row_id column of harness/data/llm/published_llm_training.csv")
    rows = [c for c in all_rows if ids is None or c.key in ids]
    presets = {k: PRESET_GPUS[k] for k in a.presets} if a.presets is not None else (dict(QUICK_PRESETS) if a.quick else dict(PRESET_GPUS))
    if a.costs is not None and not (CONF / "costs" / f"{a.costs}.yaml").exists():
        ap.error(f"unknown cost model {a.costs!r}: one of {', '.join(sorted(p.stem for p in (CONF / 'costs').glob('*.yaml')))}")
    extra = (f"costs={a.costs}",) if a.costs else ()
    cases = [replace(c, base=c.base + extra) for c in rows + preset_cases(presets, preset_recipes(presets, all_rows))]
    out = output_dir(a)
    budget = a.budget if a.budget is not None else (QUICK_BUDGET_S if a.quick else None)
    results = [run_case(c, budget) for c in tqdm(cases, desc="llm_plans", unit="case")]
    plans = pd.DataFrame([case_row(r) for r in results])
    plans.to_csv(out / "plans.csv", index=False)
    sweep, sweep_summary = bloom_ranking(results)
    sweep.to_csv(out / "bloom_sweep.csv", index=False)
    blocks, sols = block_split_table(QUICK_BLOCK_MODELS if a.quick else BLOCK_MODELS, tps=(8,) if a.quick else (2, 4, 8))
    blocks.to_csv(out / "block_splits.csv", index=False)
    detail = [(m, t) for m, t in BLOCK_DETAIL if any(k[:2] == (m, t) for k in sols)]
    pd.concat([layer_table(sols[(m, t, s)]).assign(model=m, tp=t, solver=s) for m, t in detail for s in ("pase", "optcnn")
               if (m, t, s) in sols] or [pd.DataFrame()]).to_csv(out / "block_layers.csv", index=False)
    plot_throughput(plans, out / "throughput_vs_gpus.png")
    cmd = "python -m experiments llm_plans" + (" --quick" if a.quick else "") + (f" --costs {a.costs}" if a.costs else "")
    write_readme(out, plans, sweep, sweep_summary, blocks, sols, detail, cmd, time.perf_counter() - t0, a.quick)
    shown = plans[plans["gain"].notna()] if "gain" in plans else plans
    print_table(shown.to_dict("records"), ["case", "gpus", "published_step_s", "searched_step_s", "gain", "search_s"],
                title="searched against published (simulated step)")
    print(f"wrote {Path(out) / 'README.md'}")
    return 0
