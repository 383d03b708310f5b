"""Running the three plans of ``python -m experiments llm_plans`` for one case (the published
plan, FSDP, ``algo=hybrid_search``) and reading what each simulated step says: the figures, the
plan, where the time went, and what differs between two plans."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from harness.app.compose import compose
from harness.core.errors import UserError

#: the plan fields a diff compares, in the order a reader weighs them, with how to name each
PLAN_FIELDS: tuple[tuple[str, str], ...] = (
    ("tp", "TP"), ("pp", "PP"), ("dp", "DP"), ("cp", "CP"), ("ep", "EP"), ("vpp", "vpp"), ("schedule", "schedule"),
    ("micro_batch", "micro-batch"), ("recompute", "recompute"), ("sequence_parallel", "SP"), ("zero", "ZeRO"),
    ("stages", "stages"), ("overlap_grad_reduce", "overlapped grad reduce"), ("overlap_param_gather", "overlapped param gather"),
    ("keep_lp_grads", "BF16 gradients kept (DeepSpeed's BF16_Optimizer)"),
    ("grad_accumulation", "gradient accumulation"), ("blocking_sends", "blocking pipeline sends"),
)
#: the parts of a step (seconds, mean over the pipeline stages): they add up to the step
SPLIT_KINDS: tuple[str, ...] = ("compute", "recompute", "bubble", "tp", "cp", "ep", "pp", "dp")


def time_split(row: dict[str, Any], recompute_s: float) -> dict[str, float]:
    """Where a simulated step went (mean over stages): compute (without recomputation),
    recomputation, the bubble and each exposed communication kind (result.json's
    ``bubble_fraction`` and ``comm_exposed_s``; :mod:`simulators.pipeline_figures`)."""
    step = float(row["step_time_s"])
    comm = {k: float(v) for k, v in (row.get("comm_exposed_s") or {}).items()}
    bubble = float(row.get("bubble_fraction") or 0.0) * step
    compute = step - bubble - sum(comm.values())
    return {"compute": compute - recompute_s, "recompute": recompute_s, "bubble": bubble,
            **{k: comm.get(k, 0.0) for k in ("tp", "cp", "ep", "pp", "dp")}}


def recompute_seconds(res: Any) -> float:
    """Seconds of recomputation per stage, mean over the stages, from the simulated task graph
    (compute tasks of category ``R``, one engine device per stage); 0 without pipeline categories."""
    from simulators.pipeline_figures import CAT
    from simulators.taskgraph import COMPUTE

    tg = res.sim.taskgraph
    cats = (tg.meta or {}).get("cat")
    if cats is None:
        return 0.0
    stages = max(len(res.row.get("peak_memory_bytes") or [0]), 1)
    sel = (np.asarray(cats) == CAT["R"]) & (tg.kind == COMPUTE)
    return float(tg.dur[sel].sum()) / stages


def simulate(overrides: Sequence[str]) -> dict[str, Any]:
    """One job of ``overrides`` (``python -m harness`` keys): its figures, plan and time split,
    or ``{"error": ...}`` for a configuration the harness refuses (a user error: an invalid
    plan for this model or GPU count)."""
    from harness.app.run import run

    t0 = time.perf_counter()
    try:
        res = run(compose(list(overrides)))
    except UserError as e:
        return {"error": str(e).splitlines()[0], "wall_s": time.perf_counter() - t0}
    row = res.row
    info = row.get("algo_info") or {}
    plan = dict(info.get("parallel_plan") or {})
    stages = plan.get("stages")
    out = {
        "step_s": float(row["step_time_s"]), "tokens_per_s_per_gpu": float(row.get("tokens_per_s_per_gpu") or 0.0),
        "model_tflops_per_gpu": float(row.get("model_tflops_per_gpu") or 0.0), "mfu": float(row.get("mfu") or 0.0),
        "hfu": float(row.get("hfu") or 0.0), "oom": bool(row["oom"]),
        "peak_mem_gib": float(row.get("peak_memory_max_bytes") or 0) / 2**30, "search_s": float(row["search_seconds"]),
        "plan": plan, "even_stages": _even(stages), "split": time_split(row, recompute_seconds(res)),
        "info": {k: info[k] for k in ("search_complete", "candidates_total", "pruned_by_memory", "pruned_by_bound", "simulated",
                                      "seeded_with", "baseline") if k in info},
        "wall_s": time.perf_counter() - t0,
    }
    return out


def _even(stages: Any) -> bool | None:
    """Whether a stage partition gives every virtual stage the same units up to one (None: no stages)."""
    if not stages:
        return None
    return max(stages) - min(stages) <= 1


def describe_plan(plan: dict[str, Any]) -> str:
    """A plan in one line: ``tp 8 x pp 8 x dp 16, interleaved vpp 3, mb 1, recompute selective, SP, ZeRO 1``."""
    if not plan:
        return ""
    parts = [" x ".join(f"{k} {plan[k]}" for k in ("tp", "pp", "dp", "cp", "ep") if k in plan and (plan[k] > 1 or k in ("tp", "pp", "dp")))]
    sched = str(plan.get("schedule", ""))
    parts.append(sched + (f" vpp {plan['vpp']}" if int(plan.get("vpp", 1)) > 1 else ""))
    parts.append(f"mb {plan.get('micro_batch')}")
    parts.append(f"recompute {plan.get('recompute')}")
    if plan.get("sequence_parallel"):
        parts.append("SP")
    parts.append(f"ZeRO {plan.get('zero')}")
    if plan.get("stages") and not _even(plan["stages"]):
        parts.append("uneven stages")
    return ", ".join(p for p in parts if p)


def diff_plans(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What plan ``b`` does otherwise than plan ``a``, one ``"NAME: from -> to"`` per field
    (``"TP: 8 -> 4"``, ``"stages: even -> uneven"``, ``"stages: re-cut"``)."""
    out = []
    for key, name in PLAN_FIELDS:
        if key not in a or key not in b or a[key] == b[key]:
            continue
        if key == "stages":
            ea, eb = _even(a[key]), _even(b[key])
            out.append(f"stages: {'even' if ea else 'uneven'} -> {'even' if eb else 'uneven'}" if ea != eb else "stages: re-cut")
        else:
            out.append(f"{name}: {_fmt(a[key])} -> {_fmt(b[key])}")
    return out


def _fmt(v: Any) -> str:
    return "on" if v is True else "off" if v is False else str(v)


def split_delta(a: dict[str, float], b: dict[str, float], step_a: float) -> list[tuple[str, float]]:
    """The parts of the step that moved from ``a`` to ``b`` (seconds, ``b - a``), largest first,
    those above 0.5 % of ``a``'s step."""
    moves = [(k, b.get(k, 0.0) - a.get(k, 0.0)) for k in SPLIT_KINDS]
    return sorted([m for m in moves if abs(m[1]) > 0.005 * step_a], key=lambda m: -abs(m[1]))


def explain(pub: dict[str, Any], found: dict[str, Any]) -> str:
    """Why the searched plan is faster (or not) than the published one: the choices that differ and
    the parts of the step that moved."""
    if "error" in pub or "error" in found:
        return ""
    diffs = diff_plans(pub["plan"], found["plan"])
    if not diffs:
        return "the search keeps the published plan"
    moves = split_delta(pub["split"], found["split"], pub["step_s"])
    moved = ", ".join(f"{k} {v:+.3g} s" for k, v in moves)
    return "; ".join(diffs) + (f" ({moved})" if moved else "")
