"""The figure and the README of ``python -m experiments llm_accuracy``, written from its tables
(``rows.csv``, ``summary.csv``, the 1F1B / interleaved pairs and the kernel-fit spread): every
sentence that states a figure reads it from a table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._llm_figures import CONVENTIONS
from experiments._llm_in_situ import in_situ_lines
from experiments._gpu_fit_spread import band_reading
from experiments._llm_tables import GOAL_MEDIAN, GOAL_ROW, GOAL_TAU, SWEEP, sweep_noise
from experiments.common import frame_markdown, md_cell, parity_plot

#: one colour and marker per group, distinct in black and white
GROUP_STYLE: dict[str, tuple[str, str]] = {
    "megatron_sc21_table1": ("#1b1b1b", "o"), "korthikanti_mlsys23": ("#4c72b0", "s"), "torchtitan": ("#dd8452", "^"),
    "bloom_176b": ("#55a868", "D"), "bloom_176b_topology_sweep": ("#8172b3", "v"), "mosaic_llm_foundry_fsdp": ("#937860", "P"),
}


def plot(df: pd.DataFrame, path: Path) -> None:
    """Predicted against published iteration time, log-log, with the +-10 % and +-25 % bands: the
    simulation filled and coloured by group, its re-run under the held-out in-situ factor hollow in
    the same colours, the formula baseline hollow grey."""
    ok = df[df["published_time_s"] > 0]
    vals = ok[["published_time_s", "simulated_time_s", "formula_time_s"]].to_numpy(dtype=float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if vals.size == 0:
        vals = np.array([1.0])

    def draw(ax: Any) -> None:
        f = ok[ok["formula_time_s"] > 0]
        ax.scatter(f["published_time_s"], f["formula_time_s"], marker="o", s=30, facecolors="none", edgecolors="#888888",
                   linewidths=0.9, label="formula baseline (one efficiency)")
        for group, (color, marker) in GROUP_STYLE.items():
            g = ok[(ok["group"] == group) & (ok["simulated_time_s"] > 0)]
            if len(g):
                ax.scatter(g["published_time_s"], g["simulated_time_s"], marker=marker, s=26, color=color, label=f"simulated, {group}")
        if "in_situ_time_s" in ok:
            label = "re-run under the held-out in-situ factor (hollow)"
            for group, (color, marker) in GROUP_STYLE.items():
                g = ok[(ok["group"] == group) & (ok["in_situ_time_s"] > 0)]
                if len(g):
                    ax.scatter(g["published_time_s"], g["in_situ_time_s"], marker=marker, s=22, facecolors="none", edgecolors=color,
                               linewidths=0.8, label=label)
                    label = None

    parity_plot(path, float(vals.min()) / 1.6, float(vals.max()) * 1.6, draw,
                xlabel="published iteration time, s (a rate converted with the row's FLOP convention)",
                ylabel="predicted iteration time, s", title="simulated vs published LLM training steps")




def _pct(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float, np.floating)) or not math.isfinite(float(x)) else f"{100 * float(x):.1f} %"


def _val(figure: str, x: Any) -> str:
    """A summary cell as the README prints it: a percentage for an error, a count, or a tau."""
    if not isinstance(x, (int, float, np.integer, np.floating)) or not math.isfinite(float(x)):
        return "n/a"
    if "|" in figure:
        return _pct(x)
    if "tau" in figure:
        return f"{float(x):.3f}"
    return f"{int(x)}"


def used_fits(column: pd.Series) -> str:
    """The fits the jobs used (``kernel_fit`` / ``fabric_fit`` cells: ``what: labels || ...``), each
    ``what`` once with the union of its labels."""
    seen: dict[str, set[str]] = {}
    for cell in column.dropna():
        for part in str(cell).split(" || "):
            if ": " in part:
                what, labels = part.split(": ", 1)
                seen.setdefault(what, set()).update(x for x in labels.split("; ") if x)
    return "; ".join(f"{w}: {', '.join(sorted(v))}" for w, v in sorted(seen.items()))


def verdict_lines(summary: pd.DataFrame) -> list[str]:
    """The verdict table: every summary figure with a goal, simulation beside formula."""
    in_situ = "in_situ" in summary and summary["in_situ"].notna().any()
    lines = ["| figure | rows | goal | simulation | formula | " + ("in-situ factor held out | " if in_situ else "") + "verdict |",
             "|---|---|---|---|---|" + ("---|" if in_situ else "") + "---|"]
    for r in summary.itertuples():
        lines.append(f"| {md_cell(r.figure)} | {md_cell(r.scope)} | {r.goal or '-'} | {_val(r.figure, r.simulation)} | "
                     f"{_val(r.figure, r.formula)} | " + (f"{_val(r.figure, r.in_situ)} | " if in_situ else "") + f"{r.verdict or '-'} |")
    return lines


def verdict_intro(in_situ: bool) -> list[str]:
    """What the verdict table's columns are."""
    if not in_situ:
        return ["The verdict is the simulation's (the kernels as measured); beside it, the formula baseline."]
    return ["The verdict is the simulation's (the kernels as measured).  Beside it: the formula baseline, and the simulation",
            "again with one in-situ factor held out by source (below: *One in-situ factor, held out by group*)."]


def direction_lines(sim: pd.DataFrame) -> list[str]:
    """Whether the misses share a direction across the groups (a shared offset is one of the
    per-GPU step, not of one framework's configuration)."""
    if sim.empty:
        return []
    r = sim["ratio"]
    gm = float(np.exp(np.log(r).mean()))
    fast, groups = int((r < 1).sum()), sim.groupby("group")["ratio"].median()
    line = (f"The simulation is faster than published on {fast} of {len(r)} rows and slower on {len(r) - fast} (geometric mean "
            f"ratio {gm:.2f}); the median ratio is below 1 in {int((groups < 1).sum())} of {len(groups)} groups.")
    if len(groups) > 1 and ((groups < 0.95).all() or (groups > 1.05).all()):
        line += (" A miss every group shares - frameworks, GPUs and fabrics alike - is one of the per-GPU step (the kernels' "
                 "rates, or time no kernel accounts for: launch gaps, host work) rather than of one framework's configuration.")
    return [line, ""]


def group_lines(df: pd.DataFrame) -> list[str]:
    """Per group: how far and which way the simulation misses, and what it leaves out there (the
    rows' assumptions, each named once with the rows it applies to)."""
    out = []
    for group, g in df.groupby("group", sort=False):
        sim = g[(g["status"] == "simulated") & (g["ratio"] > 0)]
        head = f"* **{group}** ({len(sim)} of {len(g)} rows simulated"
        if len(sim):
            r = sim["ratio"]
            slow = int((r > 1).sum())
            comm = (sim["comm_exposed_s"] / sim["simulated_time_s"]).median()
            head += (f"): median simulated / published time {r.median():.2f} (range {r.min():.2f}-{r.max():.2f}); the simulation "
                     f"is slower than published on {slow} and faster on {len(sim) - slow}; "
                     f"{int(((r - 1).abs() <= 0.2).sum())} within 20 %.  Of the simulated step, the pipeline bubble is "
                     f"{_pct(sim['bubble'].median())} and exposed communication {_pct(comm)} (medians).")
        else:
            head += ")."
        out.append(head)
        seen: dict[str, list[str]] = {}
        for row in g.itertuples():
            for a in str(row.assumptions or "").split(" | "):
                if a:
                    seen.setdefault(a, []).append(str(row.row_id))
        for a, ids in seen.items():
            out.append(f"  * {a} ({'every row' if len(ids) == len(g) else ', '.join(ids)}).")
    return out


def memory_floor_lines(df: pd.DataFrame, repeats: Sequence[tuple[str, str]]) -> list[str]:
    """What the sweep's repeated configurations say of its memory figures' own noise: the largest
    relative difference between two nvidia-smi readings of one configuration."""
    by = df.set_index("row_id")
    moves = []
    for a, b in repeats:
        ma, mb = float(by.loc[a, "published_mem_gib"]), float(by.loc[b, "published_mem_gib"])
        if ma > 0 and mb > 0:
            moves.append((abs(ma - mb) / ((ma + mb) / 2), a, b, ma, mb))
    if not moves:
        return []
    move, a, b, ma, mb = max(moves)
    return [f"Two runs of one configuration ({a} / {b}) published {ma:.0f} and {mb:.0f} GB: the sweep's nvidia-smi figure moved "
            f"by {_pct(move)} on its own, {'above' if move > 0.10 else 'below'} the 10 % goal"
            + (", which for the BLOOM rows sits below the data's own floor." if move > 0.10 else "."), ""]


def micro_batch_lines(mbs: pd.DataFrame) -> list[str]:
    """The README's section on BLOOM's micro-batch pairs (:func:`experiments._llm_tables.micro_batch_table`)."""
    ok = mbs.dropna(subset=["published_speedup", "simulated_speedup"]) if len(mbs) else mbs
    if not len(ok):
        return []
    n = len(ok)
    pub_faster, sim_faster = int((ok["published_speedup"] > 1).sum()), int((ok["simulated_speedup"] > 1).sum())
    gap = ok["published_speedup"] / ok["simulated_speedup"] - 1
    under = int((gap > 0).sum())
    lines = [
        "## BLOOM's micro-batch pairs",
        "",
        "The sweep measured most topologies at two micro-batches (the same GPUs, batch and model).  A larger micro-batch",
        "means fewer, larger micro-batches: more pipeline bubble ((p - 1) / m), larger GEMMs, and fewer of whatever a",
        "micro-batch costs whatever its size.  Speedup: the smaller micro-batch's time over the larger's (above 1: the larger",
        "is faster).",
        "",
        frame_markdown(ok, list(ok.columns), {"published_speedup": "{:.3f}", "simulated_speedup": "{:.3f}"}),
        "",
        f"The larger micro-batch is faster in {pub_faster} of {n} published pairs and {sim_faster} of {n} simulated; the published "
        f"speedup is above the simulated in {under} of {n} (median {100 * float(gap.median()):+.1f} %)"
        + (": the runs gained more from fewer, larger micro-batches than the simulation does.  Either they paid, per "
           "micro-batch, a cost the simulation does not have (time between a stage's kernels, sends and receives that grows "
           "with the number of micro-batches, not their size), or their GEMMs gained more from the larger micro-batch than "
           "the kernel fit says." if under >= 0.75 * n else "."),
        "",
    ]
    return lines


def batch_pair_lines(bps: pd.DataFrame, sigma: float) -> list[str]:
    """The README's section on BLOOM's global-batch pairs (:func:`experiments._llm_tables.batch_pair_table`):
    how well the published step time follows the number of micro-batches, against the sweep's own
    repeat noise ``sigma``."""
    ok = bps.dropna(subset=["published_ratio", "simulated_ratio"]) if len(bps) else bps
    if not len(ok):
        return []
    bound = 3 * sigma if math.isfinite(sigma) else math.nan
    off = ok[ok["disagreement"].abs() > bound] if math.isfinite(bound) else ok.iloc[:0]
    lines = [
        "## BLOOM's global-batch pairs",
        "",
        "The sweep measured some plans at two global batches (the same GPUs, plan and micro-batch): the smaller batch runs",
        "fewer micro-batches per step, so its step is shorter by about the micro-batches it drops (the bubble's share",
        "grows).  Ratio: the smaller batch's step time over the larger's; `disagreement`: published over simulated, less 1.",
        "",
        frame_markdown(ok, list(ok.columns), {"published_ratio": "{:.3f}", "simulated_ratio": "{:.3f}", "disagreement": "{:+.1%}"}),
        "",
    ]
    if math.isfinite(bound):
        lines.append(f"{len(ok) - len(off)} of {len(ok)} pairs agree within three times the sweep's repeat noise ({bound:.1%})"
                     + ("." if not len(off) else
                        f"; {', '.join(f'{r.smaller} / {r.larger} ({r.disagreement:+.0%})' for r in off.itertuples())} do not: "
                        "where the other pairs' steps shrink with their micro-batches as the simulated ones do, one row of such a "
                        "pair is off by about that much.  No row is dropped for it; it is part of the floor under the sweep's "
                        "rank correlation."))
        lines.append("")
    return lines


def single_node_lines(single: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    """The README's section on BigScience's one-node runs (``bloom_single_node.csv``): their ratios
    beside the sweep's, TP 8 against TP 8, to say whether the sweep's miss lies in the node or in the
    network between the nodes."""
    one = single[(single["status"] == "simulated") & (single["ratio"] > 0)]
    sweep = df[(df["group"] == SWEEP) & (df["ratio"] > 0) & df["plan"].str.startswith("TP8 ")]
    if not len(one) or not len(sweep):
        return []
    x, y = float(one["ratio"].median()), float(sweep["ratio"].median())
    where = ("as large as" if abs(x - y) <= 0.05 else "larger than" if x < y else "smaller than")
    lines = [
        "## BLOOM on one node",
        "",
        "BigScience measured the best one Jean Zay node does at BLOOM's width (`harness/data/llm/bloom_single_node.csv`, from the",
        "same chronicle; not in the shared data set, outside the verdict's figures): TP 8 on 8 A100s, no pipeline, no data",
        "parallelism, so no Omni-Path.",
        "",
        frame_markdown(one, ["row_id", "plan", "batch_seqs", "published_time_s", "simulated_time_s", "ratio", "published_mem_gib",
                             "simulated_mem_gib"],
                       {"published_time_s": "{:.1f}", "simulated_time_s": "{:.1f}", "ratio": "{:.2f}", "published_mem_gib": "{:.0f}",
                        "simulated_mem_gib": "{:.1f}"}),
        "",
        f"Median simulated / published time {x:.2f} on one node against {y:.2f} over the sweep's {len(sweep)} TP 8 rows on 48 "
        f"nodes: the miss without a network is {where} with it"
        + (", so it lies in the node's own step (its kernels, TP's all-reduces over NVLink, the framework's time between them),"
           " not in the network between the nodes." if where != "smaller than" else
           ", so part of the sweep's miss lies in the network between the nodes."),
        "",
        *tp_degree_lines(df),
    ]
    return lines


def tp_degree_lines(df: pd.DataFrame) -> list[str]:
    """The sweep's ratios by tensor-parallel degree: whether the miss grows with it (a cost that
    shrinks less than the per-GPU GEMMs as TP splits them)."""
    sweep = df[(df["group"] == SWEEP) & (df["ratio"] > 0)]
    tp = sweep["plan"].str.extract(r"^TP(\d+) ", expand=False).astype(float)
    by = sweep["ratio"].groupby(tp).agg(["median", "min", "max", "size"]).sort_index()
    if len(by) < 2:
        return []
    parts = [f"TP {int(t)} {r['median']:.2f} ({int(r['size'])} row{'s' if r['size'] > 1 else ''}, {r['min']:.2f}-{r['max']:.2f})"
             for t, r in by.iterrows()]
    falls = bool((by["median"].diff().dropna() < 0).all())
    return [
        "By tensor-parallel degree, the sweep's median simulated / published time: " + ", ".join(parts) + "."
        + (" The miss grows with the degree: what a step spends that shrinks less than its GEMMs when TP splits them"
           " (the replicated norms and residuals of TP without sequence parallelism, TP's all-reduces, the host's time"
           " between kernels) weighs more in the real runs than in the simulation." if falls else ""),
        "",
    ]


def write_readme(out: Path, df: pd.DataFrame, summary: pd.DataFrame, pairs: pd.DataFrame, spread: pd.DataFrame, eta: float, *,
                 quick: bool, minutes: float, extra: Sequence[str] = (), compiles: pd.DataFrame | None = None,
                 single: pd.DataFrame | None = None, mbs: pd.DataFrame | None = None, bps: pd.DataFrame | None = None,
                 probe: Sequence[str] = ()) -> None:
    """``out/README.md``: the verdict, where the simulation is right and where not and why, the BLOOM
    sweep, memory, the schedule pairs, the formula baseline, the floor and every row."""
    sim = df[(df["status"] == "simulated") & (df["ratio"] > 0)]
    good = sim[(sim["ratio"] - 1).abs() <= 0.10]
    bad = sim[(sim["ratio"] - 1).abs() > GOAL_ROW]
    unexpressed = df[df["status"] != "simulated"]
    fits, fabric = used_fits(df["kernel_fit"]), used_fits(df["fabric_fit"])
    sigma, floor, repeats = sweep_noise(df)
    lines = [
        "# LLM accuracy: simulated against published training runs",
        "",
        f"Written by `python -m experiments llm_accuracy{' --quick' if quick else ''}"
        f"{(' --override ' + ' '.join(extra)) if extra else ''}` ({minutes:.1f} minutes on the machine that ran it).  Every published figure is others' (`harness/data/llm/published_llm_training.csv`, each row with its source);",
        "every simulated figure is this harness's, under "
        + (f"the overrides `{' '.join(extra)}`" if extra else "the default cost model (`costs=calibrated`)") + ".  Nothing in the harness is",
        "fitted to these rows.  The formula baseline's one efficiency is fitted to them: it is the comparison column the issue",
        "defines, not the model.",
        "",
        "A row is compared as an iteration time: its published iteration time, or the time its published tokens/s per GPU, TFLOP/s,",
        "MFU or HFU means under the row's own FLOP convention (`convention` in `rows.csv`); `ratio` is simulated / published time",
        "(above 1: the simulation is slower).  What each row leaves blank and how the harness runs it otherwise than the",
        "published framework did is written per row (`assumptions`); a row the harness cannot express is listed with the reason.",
        "",
        "## Verdict",
        "",
        *verdict_intro("in_situ_ratio" in df),
        "",
        *verdict_lines(summary),
        "",
        "Kernel costs (`costs_report` of the jobs, per device): " + (fits or "n/a") + ".",
        "",
        "Collective costs (`fabric_report` of the jobs, inside and across nodes): " + (fabric or "n/a") + ".",
        "",
        "![predicted vs published](predicted_vs_published.png)",
        "",
        "## Where the simulation is right, where it is not, and why",
        "",
        f"Right (within 10 %): {', '.join(f'{r.row_id} ({r.ratio:.2f})' for r in good.itertuples()) or 'none'}.",
        "",
        f"Beyond 20 %: {', '.join(f'{r.row_id} ({r.ratio:.2f})' for r in bad.itertuples()) or 'none'}.",
        "",
        *direction_lines(sim),
        "By group (the assumptions are what the simulation leaves out or takes where the row is silent: the likely causes of a",
        "miss on those rows):",
        "",
        *group_lines(df),
        "",
        "Not expressed (listed, not dropped): "
        + ("; ".join(f"{r.row_id}: {r.reason}" for r in unexpressed.itertuples()) or "none") + ".",
        "",
        "## BLOOM's 3D topology sweep",
        "",
        "One snapshot per configuration (the second iteration; BigScience's chronicles), noisy by a few per cent: used for ranking",
        "and out-of-memory verdicts.  Throughput is ranked as the sweep's own TFLOP/s (96-coefficient hardware FLOPs per GPU per",
        "second, which each row's time and shape give exactly), so rows of different shapes and batches compare.",
        "",
        (f"Repeated measurements of one configuration ({', '.join(f'{a} / {b}' for a, b in repeats)}) put the noise of one "
         f"snapshot at {_pct(sigma)}; a simulator exact up to that noise would reach a tau-b of {floor:.3f} (median of 2,000 seeded "
         f"draws): {'above' if floor >= GOAL_TAU else 'below'} the goal of {GOAL_TAU}, so "
         + ("the noise alone does not excuse a tau below the goal." if floor >= GOAL_TAU else
            "the goal sits above the floor the measurements' own noise sets.")
         if repeats else "The sweep repeats no configuration: its noise is not measured here."),
        "",
        frame_markdown(df[(df["group"] == SWEEP)], ["row_id", "plan", "published_time_s", "simulated_time_s", "ratio", "published_mem_gib",
                                         "simulated_mem_gib", "published_oom", "simulated_oom"],
            {"published_time_s": "{:.1f}", "simulated_time_s": "{:.1f}", "ratio": "{:.2f}", "published_mem_gib": "{:.0f}",
             "simulated_mem_gib": "{:.1f}"}),
        "",
        *(micro_batch_lines(mbs) if mbs is not None else []),
        *(batch_pair_lines(bps, sigma) if bps is not None else []),
        *(single_node_lines(single, df) if single is not None and len(single) else []),
        *probe,
        "## Memory per GPU",
        "",
        "torchtitan's figures are the allocator's peak reserved bytes (`torch.cuda.memory_stats`, reserved_bytes.all.peak: the",
        "caching allocator's pool, above the tensors it holds); BLOOM's were read off nvidia-smi (MiB, taken as GiB), which adds",
        "what the CUDA context and NCCL hold.  The simulation counts the tensors (weights, gradients, optimizer states,",
        "activations, buffers: `simulated_tensor_gib`), times the cluster's `allocator_reserve` (the caching allocator's",
        "reserved bytes per allocated byte at the peak; Jean Zay's 1.2: the median over ten of BigScience's Megatron runs' logs,",
        "harness/data/llm/allocator_reserve.csv; 1 elsewhere: not measured), and beside an nvidia-smi figure it adds the",
        "cluster's `runtime_GiB` (`runtime_gib`; Jean Zay's: the CUDA kernels BigScience measured on its A100s and NCCL's set-up,",
        "conf/cluster/jean_zay_a100.yaml); every job's out-of-memory verdict counts both.",
        "",
        frame_markdown(df[df["mem_ratio"] > 0], ["row_id", "plan", "published_mem_gib", "simulated_tensor_gib", "allocator_reserve",
                                                 "runtime_gib", "simulated_mem_gib", "mem_ratio"],
            {"published_mem_gib": "{:.1f}", "simulated_tensor_gib": "{:.1f}", "allocator_reserve": "{:.2f}", "runtime_gib": "{:.2f}",
             "simulated_mem_gib": "{:.1f}", "mem_ratio": "{:.2f}"}),
        "",
        *memory_floor_lines(df, repeats),
        "## torchtitan's 1F1B against interleaved 1F1B",
        "",
        (frame_markdown(pairs, list(pairs.columns), {c: "{:.2f}" for c in pairs.columns if c.endswith("speedup")}) if len(pairs)
         else "No pair in the rows run."),
        "",
        "## torchtitan's eager against torch.compile",
        "",
        "The same run with and without `torch.compile`: the seconds compile saves come from the memory-bound kernels it",
        "fuses, which the simulation costs as PyTorch eager runs torchtitan's code (`model.kernels=eager`: FP32 RMSNorm and",
        "complex RoPE as separate ATen kernels) against one kernel per step (`compiled`); the formula cannot tell them apart.",
        "",
        (frame_markdown(compiles, list(compiles.columns), {c: "{:.2f}" for c in compiles.columns if c != "eager" and c != "compiled"})
         if compiles is not None and len(compiles) else "No pair in the rows run."),
        "",
        "## The formula baseline",
        "",
        "`hardware FLOPs / (GPUs x peak x eta) x (1 + (p - 1)/(v m))`, hardware FLOPs Korthikanti's counts (the recompute's",
        "included, generalised to GQA and gated MLPs: `harness/core/llm/flops.py`), the peak the GPU's 16-bit tensor-core rate,",
        f"p, v, m the row's pipeline stages, chunks per stage and micro-batches; one eta = {eta:.3f} fitted by least squares in log",
        f"space over the {int((df['formula_time_s'] > 0).sum())} 16-bit rows both it and the simulation predict (the FP8 rows run",
        "on two peaks at once, which one efficiency cannot describe).  It knows nothing of communication, memory or the",
        "kernels' shapes; with its efficiency fitted to the very rows it is judged on, it is the bar the simulation must clear.",
        "",
        "FLOP conventions of the published figures:",
        "",
        *[f"* `{k}`: {v}." for k, v in CONVENTIONS.items()],
        "",
        *in_situ_lines(df),
        *spread_lines(spread),
        "## Every row",
        "",
        frame_markdown(df, ["row_id", "group", "precision", "plan", "published_kind", "published", "simulated", "ratio", "formula_ratio", "status"],
            {"published": "{:.4g}", "simulated": "{:.4g}", "ratio": "{:.2f}", "formula_ratio": "{:.2f}"}),
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def spread_lines(spread: pd.DataFrame) -> list[str]:
    """The README section on the kernel fit's split: the median error under each seed's table and
    the rows it moves most (empty without refits)."""
    if spread is None or spread.empty:
        return []
    cols = [c for c in spread.columns if c.startswith("ratio_seed") or c == "ratio_committed"]
    meds = {c: float(np.nanmedian(np.abs(spread[c].to_numpy(dtype=float) - 1))) for c in cols}
    width = spread["ratio_max"] / spread["ratio_min"] - 1
    moved = spread.assign(width=width).sort_values("width", ascending=False).head(5)
    return [
        "## How far the kernel fit's split moves the figures (the floor)",
        "",
        "The kernel table is fitted on a seeded split of the kernel measurements; refitted on other seeds' splits (the same data",
        "and model, other rows held out), every simulated row was run again (`fit_spread.csv`).  Median |ratio - 1| per table: "
        + ", ".join(f"{c.replace('ratio_', '')} {100 * v:.1f} %" for c, v in meds.items()) + ".",
        f"Across the {len(meds)} tables the median runs from {100 * min(meds.values()):.1f} % to {100 * max(meds.values()):.1f} %: "
        + band_reading(100 * min(meds.values()), 100 * max(meds.values()), 100 * GOAL_MEDIAN),
        "Rows the split moves most (ratio lowest to highest across the tables): "
        + ", ".join(f"{r.row_id} {r.ratio_min:.2f}-{r.ratio_max:.2f}" for r in moved.itertuples()) + ".",
        "",
    ]
