"""What ``python -m harness`` prints for a job: its figures, the plan beside the reference plans,
and, when the plan is slower than one device, what that means.

Everything comes from the result row (``result.json``'s keys) and the algorithm's
:meth:`~algorithms.base.Algorithm.about` (its paper, the paper's claim, the results README
with this repository's findings); nothing here knows a particular algorithm.
"""

from __future__ import annotations

import textwrap
from typing import Any

#: where the findings of every topic are indexed
RESULTS_INDEX = "results/README.md"


def format_bytes(b: float) -> str:
    """``b`` bytes in B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1024
    return f"{b:.1f} TiB"


def format_seconds(s: float) -> str:
    """``s`` seconds in s, ms or us."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def bound_line(row: dict[str, Any]) -> str:
    """The lower bound: the problem's (the same for every plan of it) and this plan's own."""
    text = f"{format_seconds(row['lower_bound_s'])}, no plan of this problem is faster (gap {100 * row.get('gap_to_bound', 0.0):.1f}%)"
    plan = row.get("plan_lower_bound_s")
    if plan is not None:
        text += f"; this plan's own bound {format_seconds(plan)}"
    return text


def format_summary(row: dict[str, Any], about: dict[str, str] | None = None) -> str:
    """The summary ``python -m harness`` prints: the job's figures, then :func:`reference_table`
    and :func:`finding` (which ``about``, the algorithm's :meth:`~algorithms.base.Algorithm.about`,
    completes)."""
    stack = row.get("graph_kind") == "stack"
    where = "pipeline stages" if stack else "devices"
    oom = f"YES on {where} " + ",".join(map(str, row.get("oom_devices", []))) if row["oom"] else "no"
    lines = [
        ("model", f"{row['model']}, global batch {row['batch_size']} (a data-parallel plan splits it over its devices)"),
        ("units", f"{row['graph_nodes']} pipeline units (a stage holds a run of them)") if stack else
        ("nodes", f"{row['graph_nodes']} nodes, {row['graph_edges']} edges" + (
            f" (plan: {row['plan_nodes']} nodes)" if row.get("plan_nodes") not in (None, row["graph_nodes"]) else "")),
        ("devices", f"{row['num_devices']} on {row['cluster']} ({row.get('devices_used', '?')} used)"),
        ("algorithm", row["algo"]),
        ("search time", format_seconds(row["search_seconds"])),
        ("step time", format_seconds(row["step_time_s"])),
        *([("measured step", f"{format_seconds(row['measured_step_time_s'])} (real run, mean of {row.get('measured_steps')} steps)")]
          if row.get("measured_step_time_s") is not None else []),
        ("lower bound", bound_line(row)),
        *worth_lines(row),
        ("OOM", oom),
        ("bytes sent per GPU" if stack else "bytes moved", format_bytes(row["comm_bytes"]) + (
            " (" + ", ".join(f"{k} {format_bytes(v)}" for k, v in row.get("bytes_by_class", {}).items() if v) + ")"
            if any(row.get("bytes_by_class", {}).values()) else "") + (" (one GPU of each stage, summed)" if stack else "")),
        *(stack_lines(row) if stack else [("peak memory", format_bytes(max(row["peak_memory_bytes"])) + " (max over devices)")]),
    ]
    w = max(len(k) for k, _ in lines)
    out = [f"{k:<{w}}  {v}" for k, v in lines]
    for warning in row.get("warnings", []):  # harness.app.result_checks: flagged inputs, a search beaten by a baseline
        out += textwrap.wrap(warning, width=100, initial_indent=f"{'WARNING':<{w}}  ", subsequent_indent=" " * (w + 2))
    searched = search_table(row)
    if searched:
        out += ["", *searched]
    table = reference_table(row)
    if table:
        out += ["", *table]
    said = finding(row, about or {})
    if said:
        out += ["", *textwrap.wrap(said, width=100, initial_indent=f"{'finding':<{w}}  ", subsequent_indent=" " * (w + 2))]
    return "\n".join(out)


def plan_line(plan: dict[str, Any], m: int | None) -> str:
    """A parallel plan on one line: degrees, schedule, micro-batches, recomputation, SP, ZeRO."""
    sched = plan.get("schedule", "1f1b") + (f", vpp {plan['vpp']}" if plan.get("vpp", 1) > 1 else "")
    degrees = " x ".join(f"{k} {plan[k]}" for k in ("tp", "pp", "dp", "cp", "ep") if k in ("tp", "pp", "dp") or plan.get(k, 1) > 1)
    return (f"{degrees} ({sched}); micro-batch {plan.get('micro_batch')}" + (f", {m} per step" if m else "")
            + f"; recompute {plan.get('recompute')}; SP {'on' if plan.get('sequence_parallel') else 'off'}; ZeRO {plan.get('zero')}")


def stack_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures of a pipeline plan (a stack graph): the plan, throughput, MFU and HFU
    (Korthikanti's), the bubble, the exposed communication by kind and the memory of one GPU by
    kind (the stage with the highest peak; every GPU of a stage holds the same)."""
    plan = (row.get("algo_info") or {}).get("parallel_plan") or {}
    m = (row.get("pipeline") or {}).get("m")
    out = [("plan", plan_line(plan, m))] if plan else []
    if row.get("tokens_per_s_per_gpu") is not None:
        unit = "tokens" if (row.get("pipeline") or {}).get("seq_len", 2) > 1 else "samples"  # a CNN's "tokens" are its samples
        out.append(("throughput", f"{row['tokens_per_s_per_gpu']:,.0f} {unit}/s per GPU, {row['model_tflops_per_gpu']:.1f} model TFLOP/s "
                                  f"per GPU, MFU {100 * row['mfu']:.1f}%, HFU {100 * row['hfu']:.1f}%"))
    if row.get("bubble_fraction") is not None:
        out.append(("bubble", f"{100 * row['bubble_fraction']:.1f}% of the step (stages idle, waiting for none of the communication below)"))
    exposed = {k: v for k, v in (row.get("comm_exposed_s") or {}).items() if v > 0}
    if exposed:
        out.append(("exposed comm", ", ".join(f"{k} {format_seconds(v)}" for k, v in exposed.items()) + " (mean over stages)"))
    cap = max(row.get("mem_capacity_bytes") or [0])
    peak = row.get("peak_memory_max_bytes", max(row["peak_memory_bytes"]))
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in (row.get("memory_breakdown") or {}).items() if v)
    runtime = int(row.get("mem_runtime_bytes") or 0)
    reserve = float(row.get("mem_allocator_reserve") or 1.0)
    notes = ([f"the CUDA context and NCCL hold {format_bytes(runtime)} more"] if runtime else []) + \
        ([f"the allocator's pool {reserve:g}x the tensors"] if reserve > 1.0 else [])
    held = f" ({'; '.join(notes)})" if notes else ""
    out.append(("memory per GPU", f"{format_bytes(peak)} of {format_bytes(cap)}{held}" + (f": {parts}" if parts else "")))
    return out


def search_table(row: dict[str, Any]) -> list[str]:
    """A plan search's answer (``algo_info`` with ``top_k`` and ``baseline``, algo=hybrid_search)
    beside its runner-up and the hand-tuned plan it was seeded with: step, where the time goes,
    and what the search did (candidates, pruned by memory and by bound, simulated, complete)."""
    info = row.get("algo_info") or {}
    top, base = info.get("top_k") or [], info.get("baseline")
    if not top or not base:
        return []
    rows = [("chosen", top[0]), *([("runner-up", info["runner_up"])] if info.get("runner_up") else []), ("baseline", base)]
    out = [f"{'search':<10}  {info.get('candidates_total', 0):,} candidates: {info.get('pruned_by_memory', 0):,} pruned by memory, "
           f"{info.get('pruned_by_bound', 0):,} by bound, {info.get('simulated', 0)} simulated; "
           + ("complete (exact over the space)" if info.get("search_complete") else "CUT SHORT by algo.budget_s (the best found)")]
    for name, e in rows:
        split = ", ".join(f"{k} {format_seconds(v)}" for k, v in (e.get("time_split_s") or {}).items() if v > 0)
        step = format_seconds(e["step_time_s"]) + (" OOM" if e.get("oom") else "")
        out.append(f"{name:<10}  {step:>12}  {plan_line(e['plan'], e.get('micro_batches'))}")
        if split:
            out.append(f"{'':<10}  {'':>12}  time: {split}")
    if base.get("source"):
        out.append(f"{'':<10}  {'':>12}  baseline: {base['source']}")
    if (info.get("intra_stage") or {}).get("reason"):
        out += textwrap.wrap(f"intra-stage: {info['intra_stage']['reason']}", width=100, initial_indent=" " * 26, subsequent_indent=" " * 26)
    return out


def worth_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary line of the algorithm's own estimate (none when it has none): what its cost
    model predicted for its plan, against the simulated step."""
    if row.get("estimate_gap") is None:
        return []
    return [("own estimate", f"{format_seconds(row['objective_s'])}: the step {row['algo']}'s own cost model predicts for its plan, "
                             f"{100 * row['estimate_gap']:+.1f}% vs the simulated step")]


def reference_table(row: dict[str, Any]) -> list[str]:
    """The plan beside the reference plans of :mod:`harness.app.worth` (one device, data
    parallelism over every device), simulated on the same cluster with the same costs: step
    time and speed-ups.  None when the job did not simulate them (``output.worth=false``); no
    data-parallel row when the batch cannot be split over the devices, and on a stack graph no
    row for a reference that does not fit in memory (:mod:`harness.app.worth`)."""
    single, dp = row.get("single_device_step_s"), row.get("data_parallel_step_s")
    if single is None and dp is None:
        return []
    plans = [(f"{row['algo']} (this job)", row["step_time_s"]), *([("one device", single)] if single else []),
             *([("data parallel", dp)] if dp else [])]

    def x(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 and a == a and b == b else "-"

    head = ("plan", "step", *(["vs one device"] if single else []), *(["vs data parallel"] if dp else []))
    cells = [(name, format_seconds(t), *([x(single, t)] if single else []), *([x(dp, t)] if dp else [])) for name, t in plans]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]

    def fmt(c: tuple[str, ...]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths)))

    lines = [fmt(head), *(fmt(c) for c in cells)]
    if row.get("slower_than_single_device"):
        lines[1] += "  <- SLOWER THAN ONE DEVICE"
    return lines


def finding(row: dict[str, Any], about: dict[str, str]) -> str:
    """For a plan slower than one device: what the algorithm's paper claims, what the simulator
    shows, and where to read why (a finding, not a failure); "" otherwise."""
    if not row.get("slower_than_single_device"):
        return ""
    paper, claim, where = about.get("paper", ""), about.get("paper_claim", ""), about.get("findings", "")
    text = f"{paper} claims {claim}. " if paper and claim else ""
    single, dp = row.get("speedup_vs_single_device"), row.get("data_parallel_step_s")
    text += f"The simulator shows this plan at {single:.2f}x one device"
    if dp:
        text += f" and data parallelism at {row['single_device_step_s'] / dp:.2f}x"
    sources = [s for s in (where, RESULTS_INDEX) if s]
    return text + f". That is this harness's finding, not a failure; why: {', '.join(sources)}."
