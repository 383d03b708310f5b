"""The tables of ``python -m experiments llm_accuracy``, built from each row's simulation: the row
table (configuration, published and simulated figures as iteration times, memory, OOM, the formula
baseline's figure), the summary figures against the issue's goals, the BLOOM sweep's ranking and
noise, torchtitan's 1F1B / interleaved pairs."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._llm_figures import error_summary, figure_of_time, fit_efficiency, kendall_tau_b, noise_tau, repeat_sigma
from experiments._llm_rows import RowJob, batch_pairs, compile_pairs, micro_batch_pairs, override_value, schedule_pairs

#: the 16-bit precisions the formula baseline's one peak describes
SIXTEEN_BIT = ("amp_fp16", "amp_bf16")
#: the sweep whose ranking and out-of-memory verdicts are checked
SWEEP = "bloom_176b_topology_sweep"
#: the issue's goals: median and per-row |simulated / published - 1|, Kendall's tau-b, memory
GOAL_MEDIAN, GOAL_ROW, GOAL_TAU, GOAL_MEMORY = 0.08, 0.20, 0.8, 0.10


def plan_label(job: RowJob, overrides: Sequence[str]) -> str:
    """``TP8 PP8 DP8 CP1 v2 interleaved mb4 full ZeRO-3``: the plan of a row, read off its overrides."""
    kv = dict(o.split("=", 1) for o in overrides if o.startswith("algo."))
    algo = override_value(overrides, "algo") or "?"
    zero = "ZeRO-3 (FSDP)" if algo == "fsdp" else f"ZeRO-{kv.get('algo.zero', '1')}"
    return (f"TP{kv.get('algo.tp', 1)} PP{job.pp} DP{job.dp} CP{kv.get('algo.cp', 1)} "
            + (f"v{job.vpp} " if job.vpp > 1 else "") + f"{job.schedule} mb{job.micro_batch} {job.recompute} {zero}")


def row_table(jobs: Sequence[RowJob], sims: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per published row: configuration, published and simulated figures, ratio, memory,
    OOM, assumptions or reason (the formula's columns are added by :func:`add_formula`)."""
    out = []
    for job, s in zip(jobs, sims):
        pub = job.published
        t_pub, t_sim = s.get("published_time_s", math.nan), s.get("simulated_time_s", math.nan)
        sim_fig = math.nan
        if pub is not None and math.isfinite(t_sim):
            sim_fig = figure_of_time(pub.kind, t_sim, gpus=job.gpus, batch=job.batch, seq_len=job.seq_len,
                                     flops=s.get("figure_flops", math.nan), peak=s.get("peak16", math.nan))
        tensors, runtime, reserve = s.get("simulated_mem_gib", math.nan), s.get("runtime_gib", 0.0), s.get("reserve", 1.0)
        # as the published figure counts it: the allocator's pool (reserved bytes), and nvidia-smi the runtime besides
        mem_sim = tensors * reserve + (runtime if job.mem_smi else 0.0)
        out.append({
            "row_id": job.row_id, "group": job.group, "model": job.model, "gpus": job.gpus, "precision": job.precision,
            "plan": plan_label(job, job.overrides), "batch_seqs": job.batch, "seq_len": job.seq_len,
            "published_kind": pub.kind if pub else "", "published": pub.value if pub else math.nan,
            "convention": s.get("convention", ""), "convention_flops": s.get("convention_flops", math.nan), "published_time_s": t_pub,
            "simulated": sim_fig, "simulated_time_s": t_sim, "ratio": t_sim / t_pub if t_pub > 0 else math.nan,
            "published_mem_gib": job.mem_gib if job.mem_gib is not None else math.nan, "simulated_mem_gib": mem_sim,
            "simulated_tensor_gib": tensors, "allocator_reserve": reserve, "runtime_gib": runtime,
            "mem_ratio": mem_sim / job.mem_gib if job.mem_gib else math.nan,
            "published_oom": job.published_oom, "simulated_oom": s.get("simulated_oom", math.nan),
            "bubble": s.get("bubble", math.nan), "comm_exposed_s": s.get("comm_exposed_s", math.nan),
            "formula_ideal_s": s.get("formula_ideal_s", math.nan), "status": s.get("status", ""),
            "reason": s.get("reason", ""), "assumptions": " | ".join(job.assumptions), "published_notes": job.notes, "kernel_fit": s.get("kernel_fit", ""),
            "fabric_fit": s.get("fabric_fit", ""), "overrides": " ".join(o for o in job.overrides if not o.startswith("output.")),
        })
    return pd.DataFrame(out)


def formula_rows(df: pd.DataFrame) -> pd.Series:
    """The rows the formula baseline is fitted and compared on: 16-bit, simulated, with a published time."""
    return (df["status"] == "simulated") & df["precision"].isin(SIXTEEN_BIT) & (df["published_time_s"] > 0) & (df["formula_ideal_s"] > 0)


def add_formula(df: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """``df`` with the formula's time and ratio on the rows of :func:`formula_rows`, and its fitted efficiency."""
    out = df.copy()
    sel = formula_rows(out)
    eta = fit_efficiency(out.loc[sel, "formula_ideal_s"], out.loc[sel, "published_time_s"]) if sel.any() else math.nan
    out["formula_time_s"] = np.where(sel, out["formula_ideal_s"] / eta, math.nan)
    out["formula_ratio"] = out["formula_time_s"] / out["published_time_s"]
    for name, col in (("published", "published_time_s"), ("simulated", "simulated_time_s"), ("formula", "formula_time_s")):
        out[f"{name}_tflops"] = tflops(out, col)
    return out, eta


# ---------------------------------------------------------------------------- summary figures
def tflops(df: pd.DataFrame, time_col: str) -> pd.Series:
    """TFLOP/s per GPU in each row's own convention (hardware FLOPs: the recompute counted) for the
    iteration times of ``time_col``."""
    return df["convention_flops"] / (df["gpus"] * df[time_col]) / 1e12


def sweep_tau(df: pd.DataFrame, time_col: str) -> tuple[float, int]:
    """Kendall's tau-b of the throughput an iteration time of ``time_col`` gives against the
    published throughput, on the BLOOM sweep's rows that publish one.  The sweep's shapes and
    batches differ, so throughput is its own TFLOP/s (96-coefficient hardware FLOPs per GPU per
    second), which its time and shape give exactly.  (tau, rows)."""
    s = df[(df["group"] == SWEEP) & (df["published_time_s"] > 0) & (df[time_col] > 0)]
    if len(s) < 2:
        return math.nan, len(s)
    return kendall_tau_b(tflops(s, "published_time_s"), tflops(s, time_col)), len(s)


def sweep_noise(df: pd.DataFrame) -> tuple[float, float, list[tuple[str, str]]]:
    """The sweep's measurement noise from configurations it measured twice on the same day and
    branch (the same ``published_notes``: a day's numbers moved by 1-5 % with the next day's
    PCIe / NUMA fix): (relative sigma, the tau-b an exact simulator would reach against it
    (:func:`noise_tau`), the repeated pairs)."""
    s = df[(df["group"] == SWEEP) & (df["published_time_s"] > 0)].copy()
    s["config"] = (s["overrides"].str.replace(r"model\.name=\S+", "", regex=True) + " " + s["precision"] + " "
                   + s["published_notes"].fillna("").astype(str))
    pairs = [(g.iloc[0], g.iloc[1]) for _, g in s.groupby("config", sort=True) if len(g) >= 2]
    sigma = repeat_sigma([(float(a["published_time_s"]), float(b["published_time_s"])) for a, b in pairs])
    floor = noise_tau(tflops(s, "published_time_s").to_numpy(), sigma) if math.isfinite(sigma) else math.nan
    return sigma, floor, [(str(a["row_id"]), str(b["row_id"])) for a, b in pairs]


def pair_table(df: pd.DataFrame, jobs: Sequence[RowJob]) -> pd.DataFrame:
    """torchtitan's 1F1B against interleaved pairs: which is faster, published, simulated and by the formula."""
    by = df.set_index("row_id")
    rows = []
    for a, b in schedule_pairs(list(jobs)):
        ra, rb = by.loc[a.row_id], by.loc[b.row_id]
        rec = {"one_f_one_b": a.row_id, "interleaved": b.row_id}
        # the formula's verdict needs no efficiency (one eta scales both rows): its ideal times, FP8 rows included
        for name, col in (("published", "published_time_s"), ("simulated", "simulated_time_s"), ("formula", "formula_ideal_s")):
            ta, tb = float(ra[col]), float(rb[col])
            rec[f"{name}_faster"] = ("interleaved" if tb < ta else "1f1b") if math.isfinite(ta) and math.isfinite(tb) else ""
            rec[f"{name}_speedup"] = ta / tb if math.isfinite(ta) and math.isfinite(tb) and tb > 0 else math.nan
        rows.append(rec)
    return pd.DataFrame(rows)


def compile_table(df: pd.DataFrame, jobs: Sequence[RowJob]) -> pd.DataFrame:
    """torchtitan's eager against torch.compile pairs: the eager row's time over the compiled row's,
    published and simulated (the formula has no term for it: its FLOPs are the same)."""
    by = df.set_index("row_id")
    rows = []
    for a, b in compile_pairs(list(jobs)):
        ra, rb = by.loc[a.row_id], by.loc[b.row_id]
        rec: dict[str, Any] = {"eager": a.row_id, "compiled": b.row_id}
        for name, col in (("published", "published_time_s"), ("simulated", "simulated_time_s")):
            ta, tb = float(ra[col]), float(rb[col])
            ok = math.isfinite(ta) and math.isfinite(tb) and tb > 0
            rec[f"{name}_saved_s"] = ta - tb if ok else math.nan
            rec[f"{name}_speedup"] = ta / tb if ok else math.nan
        rows.append(rec)
    return pd.DataFrame(rows)


def micro_batch_table(df: pd.DataFrame, jobs: Sequence[RowJob]) -> pd.DataFrame:
    """BLOOM's micro-batch pairs (:func:`experiments._llm_rows.micro_batch_pairs`): the smaller
    micro-batch's time over the larger's, published and simulated (above 1: the larger is faster)."""
    rows = []
    for a, b, ra, rb in rows_of_pairs(df, micro_batch_pairs(list(jobs))):
        rows.append({"smaller": a.row_id, "larger": b.row_id, "plan": str(ra["plan"]).replace(f" mb{a.micro_batch} ", " "),
                     "micro_batches": f"{a.micro_batch} -> {b.micro_batch}", **time_ratios(ra, rb, "speedup")})
    return pd.DataFrame(rows)


def rows_of_pairs(df: pd.DataFrame, pairs: Sequence[tuple[RowJob, RowJob]]) -> list[tuple[RowJob, RowJob, Any, Any]]:
    """Each pair both of whose rows ``df`` holds, with those two rows."""
    by = df.set_index("row_id")
    return [(a, b, by.loc[a.row_id], by.loc[b.row_id]) for a, b in pairs if a.row_id in by.index and b.row_id in by.index]


def time_ratios(ra: Any, rb: Any, what: str) -> dict[str, float]:
    """Row ``ra``'s published and simulated time over row ``rb``'s (``published_<what>``,
    ``simulated_<what>``; NaN where a time is missing)."""
    out = {}
    for name in ("published", "simulated"):
        ta, tb = float(ra[f"{name}_time_s"]), float(rb[f"{name}_time_s"])
        out[f"{name}_{what}"] = ta / tb if math.isfinite(ta) and math.isfinite(tb) and tb > 0 else math.nan
    return out


def batch_pair_table(df: pd.DataFrame, jobs: Sequence[RowJob]) -> pd.DataFrame:
    """BLOOM's global-batch pairs (:func:`experiments._llm_rows.batch_pairs`): the smaller batch's
    step time over the larger's, published and simulated, and how far the published ratio is from
    the simulated one (``disagreement``: published / simulated - 1)."""
    rows = []
    for a, b, ra, rb in rows_of_pairs(df, batch_pairs(list(jobs))):
        rec: dict[str, Any] = {"smaller": a.row_id, "larger": b.row_id, "plan": str(ra["plan"]),
                               "sequences": f"{a.batch} -> {b.batch}", **time_ratios(ra, rb, "ratio")}
        rec["disagreement"] = rec["published_ratio"] / rec["simulated_ratio"] - 1
        rows.append(rec)
    return pd.DataFrame(rows)


def summary_table(df: pd.DataFrame, pairs: pd.DataFrame, compiles: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every summary figure, the simulation beside the formula (and, where the rows were re-run
    under held-out in-situ factors, :mod:`experiments._llm_in_situ`, that re-run: ``in_situ``),
    with its goal and the simulation's verdict."""
    sim = df[(df["status"] == "simulated") & (df["ratio"] > 0)]
    shared = df[formula_rows(df) & (df["formula_ratio"] > 0)]
    rows: list[dict[str, Any]] = []
    has_in_situ = "in_situ_ratio" in df

    def add(figure: str, scope: str, s: Any, f: Any, goal: str, met: bool | None, i: Any = math.nan) -> None:
        rows.append({"figure": figure, "scope": scope, "simulation": s, "formula": f, "in_situ": i, "goal": goal,
                     "verdict": "" if met is None else ("met" if met else "not met")})

    def in_situ_errors(part: pd.DataFrame) -> dict[str, Any]:
        return error_summary(part["in_situ_ratio"]) if has_in_situ else {}

    for scope, part, with_formula in ((f"every simulated row ({len(sim)})", sim, False), (f"16-bit rows both predict ({len(shared)})", shared, True)):
        es = error_summary(part["ratio"])
        ef = error_summary(part["formula_ratio"]) if with_formula else {}
        ei = in_situ_errors(part)
        add("median |ratio - 1|", scope, es["median_abs_error"], ef.get("median_abs_error", math.nan), f"<= {GOAL_MEDIAN:.0%}",
            es["median_abs_error"] <= GOAL_MEDIAN if es["rows"] else None, ei.get("median_abs_error", math.nan))
        add("90th percentile |ratio - 1|", scope, es["p90_abs_error"], ef.get("p90_abs_error", math.nan), "", None,
            ei.get("p90_abs_error", math.nan))
        add("worst |ratio - 1|", scope, es["worst"], ef.get("worst", math.nan), f"<= {GOAL_ROW:.0%}",
            es["worst"] <= GOAL_ROW if es["rows"] else None, ei.get("worst", math.nan))
        add("rows within 20 %", scope, es["within_20"], ef.get("within_20", math.nan), "every row",
            es["within_20"] == es["rows"] if es["rows"] else None, ei.get("within_20", math.nan))
        add("rows within 10 %", scope, es["within_10"], ef.get("within_10", math.nan), "", None, ei.get("within_10", math.nan))
    for group, part in sim.groupby("group"):
        g_shared = shared[shared["group"] == group]
        add("median |ratio - 1|", f"{group} ({len(part)}; formula on {len(g_shared)})", error_summary(part["ratio"])["median_abs_error"],
            error_summary(g_shared["formula_ratio"])["median_abs_error"] if len(g_shared) else math.nan, "", None,
            in_situ_errors(part).get("median_abs_error", math.nan))
    tau_s, n = sweep_tau(df, "simulated_time_s")
    tau_f, _ = sweep_tau(df, "formula_ideal_s")  # a ranking needs no efficiency
    tau_i = sweep_tau(df, "in_situ_time_s")[0] if has_in_situ else math.nan
    add("Kendall's tau-b, BLOOM sweep throughput", f"{SWEEP} rows with a time ({n})", tau_s, tau_f, f">= {GOAL_TAU}",
        tau_s >= GOAL_TAU if math.isfinite(tau_s) else None, tau_i)
    sigma, tau_floor, _ = sweep_noise(df)
    add("tau-b an exact simulator reaches against the sweep's noise", f"repeat noise {sigma:.1%}" if math.isfinite(sigma) else "no repeats",
        tau_floor, math.nan, "", None)
    oom_rows = df[df["published_oom"]]
    caught = int((oom_rows["simulated_oom"] == True).sum())  # noqa: E712 - NaN (not simulated) is neither
    false_oom = df[(~df["published_oom"]) & (df["simulated_oom"] == True) & (df["published_time_s"] > 0)]  # noqa: E712
    add("published OOM rows simulated OOM", f"{len(oom_rows)} OOM rows", caught, math.nan, "all", caught == len(oom_rows) if len(oom_rows) else None)
    add("false OOM (a published run simulated OOM)", f"{int((df['status'] == 'simulated').sum())} simulated rows", len(false_oom),
        math.nan, "none", len(false_oom) == 0)
    add("false OOM in the BLOOM sweep", SWEEP, int((false_oom["group"] == SWEEP).sum()), math.nan, "none", int((false_oom["group"] == SWEEP).sum()) == 0)
    mem = df[(df["mem_ratio"] > 0)]
    mem_err = (mem["mem_ratio"] - 1).abs()
    add("memory per GPU within 10 %", f"rows publishing memory ({len(mem)})", int((mem_err <= GOAL_MEMORY).sum()), math.nan,
        "every row", bool((mem_err <= GOAL_MEMORY).all()) if len(mem) else None)
    add("median |memory ratio - 1|", f"rows publishing memory ({len(mem)})", float(mem_err.median()) if len(mem) else math.nan,
        math.nan, "", None)
    if len(pairs):
        ok_s = int((pairs["simulated_faster"] == pairs["published_faster"]).sum())
        ok_f = int((pairs["formula_faster"] == pairs["published_faster"]).sum())
        add("1F1B vs interleaved: the faster one simulated faster", f"torchtitan pairs ({len(pairs)})", ok_s, ok_f if pairs["formula_faster"].ne("").all() else math.nan,
            "every pair", ok_s == len(pairs))
    if compiles is not None and len(compiles):
        ok = int((compiles["simulated_speedup"] > 1).eq(compiles["published_speedup"] > 1).sum())
        add("eager vs torch.compile: the faster one simulated faster", f"torchtitan pairs ({len(compiles)})", ok, math.nan, "",
            None)
        err = (compiles["simulated_saved_s"] / compiles["published_saved_s"] - 1).abs()
        add("median |simulated / published seconds torch.compile saves - 1|", f"torchtitan pairs ({len(compiles)})",
            float(err.median()), math.nan, "", None)
    return pd.DataFrame(rows)
