"""Simulated LLM training steps beside 91 published runs on A100, H100 and H200 clusters.

Every row of ``harness/data/llm/published_llm_training.csv`` (Megatron-LM SC'21 Table 1,
Korthikanti et al. MLSys'23, torchtitan's benchmark pages, BLOOM's production run and its 3D
topology sweep, Mosaic's FSDP runs) is simulated with its own configuration - model shape,
cluster, TP / PP / DP / CP, schedule, micro-batch, recomputation, ZeRO, precision, global batch
and sequence (:mod:`experiments._llm_rows` maps each row, stating its assumptions; a row the
harness cannot express is listed with the reason) - in process, through :func:`harness.app.run.run`
under the default cost model.  Each row's published figure (its iteration time, else its tokens/s
per GPU, else its TFLOP/s, MFU or HFU in the row's own FLOP convention) is compared as an
iteration time: the ratio is simulated / published time.  Beside it stands the issue's formula
baseline, ``hardware FLOPs / (GPUs x peak x eta) x (1 + (p-1)/(v m))`` with one ``eta`` fitted
to all the 16-bit rows it is compared on (:mod:`experiments._llm_figures`).

Outputs under ``results/llm_accuracy/`` (``--quick``: a handful of rows into a scratch dir):
``rows.csv`` (every row: configuration, published, simulated, ratio, memory, OOM, the formula's
figure, assumptions or the reason), ``h100_probe.csv`` and ``h100_probe_classes.csv`` (the
simulator's units beside this project's own measurements of them on one H100:
:mod:`experiments._llm_probe`), ``summary.csv`` (every summary figure, simulation beside the
formula, against its goal), ``predicted_vs_published.png`` and a README written from them
(:mod:`experiments._llm_report`).  Every row with a published time is also re-run under one
in-situ factor (``costs.in_situ``) estimated from the other sources' rows, never its own
(:mod:`experiments._llm_in_situ`): a column beside the simulation's, not its verdict.  ``--fit-seeds`` also simulates every row under kernel tables
refitted on other seeds' splits: how far the kernel fit's split alone moves the figures.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments._llm_in_situ import held_out_factors, in_situ_columns, rerun_rows
from experiments._llm_probe import attention_table, between_table, class_table, cost_model, probe_lines, probe_table, sustained_summary
from experiments._llm_figures import convention_flops, convention_key, figure_flops, formula_ideal, time_of_figure
from experiments._llm_report import plot, write_readme
from experiments._llm_rows import SINGLE_NODE, RowJob, load_rows, row_job
from experiments._llm_tables import (add_formula, batch_pair_table, compile_table, micro_batch_table, pair_table, row_table,
                                     summary_table)
from experiments.common import experiment_args, output_dir, print_table
from experiments.gpu_accuracy import write_csv
from harness.app.compose import compose

#: rows of --quick: one or two of each group, a BLOOM OOM row, torchtitan's 1F1B / interleaved pair and an eager /
#: torch.compile pair
QUICK_ROWS = ("MEG21-T1-1", "KOR22-1a", "KOR22-1b", "TT-T1-1", "TT-T1-2", "TT-T5-1", "TT-T5-2", "BLOOM-PROD", "BLOOM-SWEEP-13",
              "BLOOM-SWEEP-15", "MOSAIC-5")


def simulate(job: RowJob, extra: Sequence[str] = ()) -> dict[str, Any]:
    """One row: its config composed, the model's shape and 16-bit peak, the published figure as an
    iteration time, and (when the harness can express the row) the simulation."""
    from hydra.utils import instantiate

    from harness.app.run import run

    rec: dict[str, Any] = {"row_id": job.row_id}
    try:
        cfg = compose([*job.overrides, *extra])
        spec = instantiate(cfg.model, _convert_="all").spec
    except Exception as e:  # noqa: BLE001 - a config the harness refuses: the row is kept with the reason
        return {**rec, "status": "not expressed", "reason": f"{type(e).__name__}: {e}".splitlines()[0][:240]}
    peaks = cfg.cluster.device.peak_tflops
    peak = 1e12 * float(peaks["float16" if job.precision == "amp_fp16" else "bfloat16"])
    rec.update(spec=spec, peak16=peak, params=spec.param_count())
    pub = job.published
    key = convention_key(pub.convention if pub else "", job.group)
    rec.update(convention=key, convention_flops=convention_flops(key, spec, job.batch, job.recompute, hardware=True))
    if pub is not None:
        flops = figure_flops(pub.kind, key, spec, job.batch, job.recompute)
        rec.update(figure_flops=flops,
                   published_time_s=time_of_figure(pub.kind, pub.value, gpus=job.gpus, batch=job.batch, seq_len=job.seq_len,
                                                   flops=flops, peak=peak))
    rec["formula_ideal_s"] = formula_ideal(spec, job.batch, job.recompute, job.gpus, peak, job.pp, job.vpp, job.micro_batches)
    if not job.expressed:
        return {**rec, "status": "not expressed", "reason": job.reason}
    t0 = time.perf_counter()
    try:
        res = run(cfg)
    except Exception as e:  # noqa: BLE001 - a configuration the harness refuses: kept with its reason
        return {**rec, "status": "not expressed", "reason": f"{type(e).__name__}: {e}".splitlines()[0][:240]}
    r = res.row
    kernels = (r.get("costs_report") or {}).get("devices") or {}
    fabric = r.get("fabric_report") or {}
    rec.update(status="simulated", simulated_time_s=float(r["step_time_s"]), simulated_oom=bool(r["oom"]),
               simulated_mem_gib=float(r["peak_memory_max_bytes"]) / 2**30,
               runtime_gib=float(r.get("mem_runtime_bytes") or 0) / 2**30, reserve=float(r.get("mem_allocator_reserve") or 1.0),
               bubble=float(r.get("bubble_fraction", math.nan)),
               comm_exposed_s=float(sum((r.get("comm_exposed_s") or {}).values())), seconds=time.perf_counter() - t0,
               kernel_fit=" || ".join(f"{k}: {v}" for k, v in sorted(kernels.items())),
               fabric_fit=" || ".join(f"{k}: {v.get('source')}" for k, v in fabric.items() if isinstance(v, dict) and "source" in v))
    return rec


# ---------------------------------------------------------------------------- the kernel fit's split as a floor
def fit_spread(jobs: Sequence[RowJob], df: pd.DataFrame, seeds: Sequence[int], extra: Sequence[str] = ()) -> pd.DataFrame:
    """Every simulated row under kernel tables refitted on each seed's split
    (:func:`experiments._gpu_fit_spread.refit_tables`): one ratio column per seed."""
    import tempfile

    from experiments._gpu_fit_spread import refit_tables

    out = df.loc[(df["status"] == "simulated") & (df["published_time_s"] > 0),
                 ["row_id", "group", "published_time_s", "ratio"]].rename(columns={"ratio": "ratio_committed"})
    with tempfile.TemporaryDirectory(prefix="kernel-tables-") as tmp:
        tables = refit_tables(seeds, Path(tmp))
        for seed, path in tables.items():
            times = {}
            for j in tqdm([j for j in jobs if j.row_id in set(out["row_id"])], desc=f"simulating the rows under seed {seed}'s table", unit="row"):
                times[j.row_id] = simulate(j, [*extra, f"costs.table={path}"]).get("simulated_time_s", math.nan)
            out[f"ratio_seed{seed}"] = out["row_id"].map(times) / out["published_time_s"]
    cols = [c for c in out.columns if c.startswith("ratio_")]
    r = out[cols].to_numpy(dtype=float)
    out["ratio_min"], out["ratio_max"] = np.nanmin(r, axis=1), np.nanmax(r, axis=1)
    return out


# ---------------------------------------------------------------------------- main
def run_rows(jobs: Sequence[RowJob], extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every row, in process, with a progress bar (``extra``: overrides added to every row's job)."""
    return [simulate(j, extra) for j in tqdm(list(jobs), desc="simulating the published LLM rows", unit="row")]


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("llm_accuracy", __doc__.splitlines()[0], "llm_accuracy", quick=f"{len(QUICK_ROWS)} rows")
    ap.add_argument("--rows", nargs="*", default=None, help="published row ids (default: all)")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="python -m harness overrides added to every row's job (costs=analytical: the roofline instead of the "
                         "calibrated costs); the README names them")
    ap.add_argument("--fit-seeds", nargs="*", type=int, default=None, metavar="SEED",
                    help="also simulate every row under kernel tables refitted on these seeds' splits, the floor the kernel "
                         "fit's split sets (default: 1 2 3 4; --quick: none)")
    a = ap.parse_args(argv)
    seeds = [s for s in (a.fit_seeds if a.fit_seeds is not None else ([] if a.quick else [1, 2, 3, 4])) if s != 0]
    if any(s < 0 for s in seeds):
        ap.error(f"--fit-seeds takes seeds >= 0 (numpy's generator refuses a negative one), got {min(seeds)}")
    rows, one_node = load_rows(), load_rows(SINGLE_NODE)
    wanted = a.rows or (list(QUICK_ROWS) if a.quick else None)
    if wanted:
        known = {r["row_id"] for r in (*rows, *one_node)}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            ap.error(f"unknown published row {unknown[0]!r}: the ids are the row_id column of harness/data/llm/published_llm_training.csv "
                     "and bloom_single_node.csv")
        rows = [r for r in rows if r["row_id"] in set(wanted)]
        one_node = [r for r in one_node if r["row_id"] in set(wanted)]
        if not rows:
            ap.error(f"--rows names only rows of bloom_single_node.csv ({', '.join(r['row_id'] for r in one_node)}), which run "
                     "beside the verdict's: add at least one row of harness/data/llm/published_llm_training.csv (e.g. BLOOM-SWEEP-7)")
    out = output_dir(a)
    t0 = time.perf_counter()
    jobs = [row_job(r) for r in rows]
    bad = [o for o in a.override if "=" not in o]
    if bad:
        ap.error(f"--override takes KEY=VALUE harness overrides, got {bad[0]!r}")
    df, eta = add_formula(row_table(jobs, run_rows(jobs, a.override)))
    # the held-out re-run: under the calibrated model (costs.in_situ is its knob), unless the overrides already set the factor
    if not any((o.startswith("costs=") and o != "costs=calibrated") or o.startswith("costs.in_situ=") for o in a.override):
        factors = held_out_factors(df)
        df = in_situ_columns(df, rerun_rows(df, jobs, factors, simulate, a.override), factors)
    pairs = pair_table(df, jobs)
    compiles = compile_table(df, jobs)
    mbs = micro_batch_table(df, jobs)
    bps = batch_pair_table(df, jobs)
    summary = summary_table(df, pairs, compiles)
    spread = fit_spread(jobs, df, seeds, a.override) if seeds else pd.DataFrame()
    node_jobs = [row_job(r) for r in one_node]
    single = row_table(node_jobs, run_rows(node_jobs, a.override)) if node_jobs else pd.DataFrame()
    write_csv(df, out / "rows.csv")
    write_csv(summary, out / "summary.csv")
    if len(pairs):
        write_csv(pairs, out / "pairs.csv")
    if len(compiles):
        write_csv(compiles, out / "compile_pairs.csv")
    if len(spread):
        write_csv(spread, out / "fit_spread.csv")
    if len(single):
        write_csv(single, out / "single_node.csv")
    if len(mbs):
        write_csv(mbs, out / "micro_batch_pairs.csv")
    if len(bps):
        write_csv(bps, out / "batch_pairs.csv")
    h100 = cost_model()
    probe_units, probe_classes, probe_attention = probe_table(h100), class_table(h100), attention_table(h100)
    write_csv(probe_units, out / "h100_probe.csv")
    write_csv(probe_classes, out / "h100_probe_classes.csv")
    plot(df, out / "predicted_vs_published.png")
    write_readme(out, df, summary, pairs, spread, eta, compiles=compiles, single=single, mbs=mbs, bps=bps, quick=a.quick, minutes=(time.perf_counter() - t0) / 60,
                 extra=a.override, probe=probe_lines(probe_units, probe_classes, probe_attention, sustained_summary(), between_table()))
    print_table(df.to_dict("records"), ["row_id", "published_kind", "published", "simulated", "ratio", "formula_ratio", "status"],
                title="simulated / published (ratio: of iteration times)")
    print_table(summary.to_dict("records"), ["figure", "scope", "simulation", "formula", "in_situ", "goal", "verdict"], title="summary")
    print(f"formula baseline efficiency {eta:.3f}; wrote {out}")
    return 0
