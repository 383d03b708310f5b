"""The figure and the README of ``python -m experiments llm_plans``, written from its tables."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._llm_block_splits import readme_lines as block_lines
from experiments.common import series_style, style

#: the speed goals of the issue: (case, seconds)
SPEED_GOALS: tuple[tuple[str, float, str], ...] = (
    ("llama3_405b@16384", 10.0, "Llama 3 405B on 16,384 H100"), ("gpt3_175b@1024", 2.0, "GPT-3 175B on 1,024 A100"))
#: the ranking goal on BLOOM's sweep: the configuration ranked first within this of the best published
RANK_GOAL = 0.95


def plot_throughput(plans: pd.DataFrame, path: Path) -> None:
    """Simulated tokens/s per GPU against the GPU count, one panel per model preset: the searched
    plan, the published one and FSDP (a cross where the plan runs out of memory)."""
    style()
    import matplotlib.pyplot as plt

    pre = plans[plans["kind"] == "preset"] if "kind" in plans else plans.iloc[0:0]
    models = list(dict.fromkeys(pre["model"])) if len(pre) else []
    cols = min(3, max(len(models), 1))
    rows = max(1, math.ceil(len(models) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False)
    for ax, model in zip(axes.flat, models):
        part = pre[pre["model"] == model].sort_values("gpus")
        for i, (name, label) in enumerate((("searched", "searched"), ("published", "published"), ("fsdp", "FSDP"))):
            col = f"{name}_tokens_per_s_per_gpu"
            if col not in part:
                continue
            ran = part[col].notna()
            oom = ran & part.get(f"{name}_oom", pd.Series(False, index=part.index)).fillna(False).astype(bool)
            ok = ran & ~oom
            kw = series_style(i)
            if ok.any():
                ax.plot(part.loc[ok, "gpus"], part.loc[ok, col], label=label, **kw)
            if oom.any():
                ax.plot(part.loc[oom, "gpus"], part.loc[oom, col], "x", color=kw["color"], markersize=8, linestyle="none",
                        label=f"{label}, out of memory")
        ax.set_xscale("log", base=2)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("tokens/s per GPU")
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    for ax in list(axes.flat)[: len(models)]:
        ax.legend(fontsize=6)
    fig.suptitle("simulated throughput: searched plan against the published one and FSDP (x: out of memory)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path)
    plt.close(fig)


def _pct(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * float(x):+.1f} %"


def _s(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{float(x):.3g}"


def goal_lines(plans: pd.DataFrame, sweep_summary: dict[str, Any]) -> list[str]:
    """The goals table: never slower, the gains, the two search times, the ranking on BLOOM's sweep."""
    lines = ["## Goals", "", "| figure | goal | here |", "|---|---|---|"]
    compared = plans[plans["gain"].notna()] if "gain" in plans else plans.iloc[0:0]
    if len(compared):
        slower = compared[~compared["never_slower"].astype(bool)]
        g = compared["gain"].astype(float)
        best = compared.loc[g.idxmax()]
        unfit = plans[(plans["published_oom"] == True) & plans["never_slower"].notna()] if "published_oom" in plans else plans.iloc[0:0]  # noqa: E712
        lines.append(f"| searched plan against the published one, same model, GPUs and batch | never slower in simulation; the gain on "
                     f"each case reported | {len(compared) - len(slower)} of {len(compared)} cases never slower"
                     + (f" (slower: {', '.join(slower['case'])})" if len(slower) else "")
                     + f"; gain median {_pct(float(np.median(g)))}, largest {_pct(float(g.max()))} ({best['case']})"
                     + (f"; on {len(unfit)} more the published plan does not fit in the simulated memory and the searched one "
                        f"{'does' if unfit['never_slower'].astype(bool).all() else 'not always'}" if len(unfit) else "") + " |")
    else:
        lines.append("| searched plan against the published one | never slower in simulation | no case compared in this run |")
    for case, goal, what in SPEED_GOALS:
        hit = plans[(plans["case"] == case)] if "case" in plans else plans.iloc[0:0]
        secs = float(hit["search_s"].iloc[0]) if len(hit) and "search_s" in hit and pd.notna(hit["search_s"].iloc[0]) else None
        here = "not run here (the full run has it)" if secs is None else f"{secs:.2f} s ({'met' if secs <= goal else 'missed'})"
        lines.append(f"| search time, {what} | <= {goal:g} s on this 2-core machine | {here} |")
    if sweep_summary.get("ranked"):
        r = sweep_summary["ratio"]
        lines.append(f"| BLOOM's topology sweep: published throughput of the configuration the simulation ranks first against the best "
                     f"published one | within 5 % | {100 * r:.1f} % ({sweep_summary['top_case']} against {sweep_summary['best_case']}; "
                     f"{'met' if r >= RANK_GOAL else 'missed'}) |")
    return lines + [""]


def beat_lines(plans: pd.DataFrame) -> list[str]:
    """Where the search beats the published configuration, by how much, and which choices made it."""
    lines = ["## Where the search beats the published configuration", ""]
    if "gain" not in plans:
        return lines + ["No case had a published plan in this run.", ""]
    won = plans[plans["gain"].astype(float) > 0.01].sort_values("gain", ascending=False)
    lines.append(f"The searched plan is more than 1 % faster than the published one on {len(won)} of "
                 f"{int(plans['gain'].notna().sum())} cases (simulated step).  The choices that differ, counted over those cases:")
    lines.append("")
    kinds = Counter(d.split(":")[0].strip() for w in won["what_differs"].fillna("") for d in w.split(" (")[0].split(";") if ":" in d)
    moves = Counter(d.strip() for w in won["what_differs"].fillna("") for d in w.split(" (")[0].split(";") if ":" in d)
    for k, n in kinds.most_common():
        common = [f"{m.split(': ', 1)[1]} ({c})" for m, c in moves.most_common() if m.startswith(k + ":")][:3]
        lines.append(f"* {k}: {n} cases; most often {', '.join(common)}")
    if not kinds:
        lines.append("* none")
    lines += ["", "| case | GPUs | published plan | searched plan | published step s | searched step s | gain | what differs (step parts moved) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in won.to_dict("records"):
        lines.append(f"| {r['case']} | {r['gpus']} | {r.get('published_plan', '')} | {r.get('searched_plan', '')} | {_s(r.get('published_step_s'))} | "
                     f"{_s(r.get('searched_step_s'))} | {_pct(r['gain'])} | {r.get('what_differs', '')} |")
    return lines + [""]


def all_lines(plans: pd.DataFrame) -> list[str]:
    """Every case: the three plans' steps, the gain, the search time and completeness."""
    lines = ["## Every case", "", "Simulated step in seconds (OOM: the plan does not fit in memory; a blank: the plan is not valid on "
             "this problem, see `plans.csv`).", "",
             "| case | GPUs | published | FSDP | searched | gain | searched plan | search s | complete |", "|---|---|---|---|---|---|---|---|---|"]
    for r in plans.to_dict("records"):
        if r.get("not_expressed"):
            continue

        def cell(name: str) -> str:
            v = r.get(f"{name}_step_s")
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                return ""
            return _s(v) + (" OOM" if r.get(f"{name}_oom") is True else "")

        lines.append(f"| {r['case']} | {r['gpus']} | {cell('published')} | {cell('fsdp')} | {cell('searched')} | {_pct(r.get('gain'))} | "
                     f"{r.get('searched_plan', '')} | {_s(r.get('search_s'))} | {r.get('search_complete', '')} |")
    return lines + [""]


def sweep_lines(sweep: pd.DataFrame, summary: dict[str, Any]) -> list[str]:
    """BLOOM's topology sweep ranked by the simulator: over the sweep, then per model variant."""
    lines = ["## BLOOM's topology sweep, ranked by the simulator", ""]
    if not summary.get("ranked"):
        return lines + ["No sweep configuration was simulated in this run.", ""]
    lines += [f"BigScience measured {summary['configs']} configurations on 384 A100 (repeats pooled by their mean; "
              f"{summary['published_oom']} ran out of memory).  {_rank_sentence(summary)}  The sweep is one snapshot per "
              "configuration, noisy by a few per cent (harness/data/llm/README.md), and mixes model variants and precisions; "
              "ranked within each:", ""]
    for variant, s in summary.get("variants", {}).items():
        if s.get("ranked"):
            lines.append(f"* {variant} ({s['configs']} configurations): {_rank_sentence(s)}")
    lines += ["", "| case | variant | plan | published TFLOP/s | simulated TFLOP/s | simulated rank | OOM (published / simulated) |",
              "|---|---|---|---|---|---|---|"]
    for r in sweep.sort_values("simulated_rank").to_dict("records"):
        rank = "" if not isinstance(r["simulated_rank"], float) or not math.isfinite(r["simulated_rank"]) else int(r["simulated_rank"])
        lines.append(f"| {r['case']} | {r['variant']} | {r['plan']} | {_s(r['published'])} | {_s(r['simulated'])} | {rank} | "
                     f"{'yes' if r['published_oom'] else 'no'} / {'yes' if r['simulated_oom'] else 'no'} |")
    return lines + [""]


def _rank_sentence(s: dict[str, Any]) -> str:
    """What the ranking says: the first configuration, its published throughput against the best, the OOM verdicts."""
    top = (f"published {s['top_published']:.1f} TFLOP/s per GPU" if s["top_published"] > 0 else "which ran out of memory in the sweep")
    return (f"The simulation ranks {s['top_case']} ({s['top_plan']}) first, {top}, against the best published "
            f"{s['best_published']:.1f} ({s['best_case']}): {100 * s['ratio']:.1f} %.  Out of memory: "
            f"{s['false_oom']} configurations the simulation calls out of memory ran, {s['missed_oom']} it calls fitting did not.")


def write_readme(out: Path, plans: pd.DataFrame, sweep: pd.DataFrame, sweep_summary: dict[str, Any], blocks: pd.DataFrame,
                 sols: dict[Any, Any], detail: Sequence[tuple[str, int]], cmd: str, seconds: float, quick: bool) -> None:
    """The README: what was compared, the goals, where the search wins and why, every case, the
    BLOOM ranking, the block splits and the rows not expressed."""
    lines = ["# Searched LLM plans against the published ones", "",
             f"Generated by `{cmd}` ({seconds:.0f} s on this machine" + (", a smoke run on a few cases" if quick else "") + ").  Each case "
             "is one model, cluster, GPU count, global batch and precision; three plans are simulated on it with the default cost "
             "model: the **published** (hand-tuned) plan, **FSDP** and the plan of **`algo=hybrid_search`**, seeded with the published "
             "plan (FSDP where none is published).  Cases: every published configuration of "
             "`harness/data/llm/published_llm_training.csv` the harness can express (`experiments/_llm_rows.py` states what it "
             "assumes where a row is blank) and each model preset at three GPU counts (`experiments/_llm_plans_cases.py`).  "
             "Tables: `plans.csv`, `bloom_sweep.csv`, `block_splits.csv`, `block_layers.csv`; figure: `throughput_vs_gpus.png`.", ""]
    lines += goal_lines(plans, sweep_summary)
    lines += beat_lines(plans)
    lines += [_CAVEAT, ""]
    lines += ["![throughput](throughput_vs_gpus.png)", ""]
    lines += sweep_lines(sweep, sweep_summary)
    lines += block_lines(blocks, sols, detail)
    lines += all_lines(plans)
    missing = plans[plans["not_expressed"].fillna("") != ""] if "not_expressed" in plans else plans.iloc[0:0]
    if len(missing):
        lines += ["## Rows not expressed", ""] + [f"* {r['case']}: {r['not_expressed']}" for r in missing.to_dict("records")] + [""]
    (out / "README.md").write_text("\n".join(lines))


_CAVEAT = (
    "How to read a gain: both plans are simulated by the same simulator and cost model, so a gain is what the simulation "
    "credits the searched choices with, not a measured speed-up.  Part of it is framework features the published runs did "
    "not have: Megatron-LM's 2021 DDP and DeepSpeed's pipeline engine reduced gradients after the backward "
    "(`overlapped grad reduce off -> on` in the table), which the search's space (Megatron-LM as it runs today) always "
    "overlaps.  A recomputation or micro-batch change is credited in full by the simulation's memory model: a plan it "
    "calls fitting is within the device's memory by its own activation and optimizer accounting, not by a measured "
    "allocator.")
