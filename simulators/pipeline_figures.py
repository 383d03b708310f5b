"""What a simulated pipeline step is read as: where each stage's time went, memory by kind, and
the throughput figures of Korthikanti et al. (MLSys'23).

Per stage (engine device) the step splits exactly into

    step = compute + tp + cp + ep (collectives run on the device) + pp + dp (waits) + bubble

* *compute*: the stage's forward, backward, weight-gradient, recompute and optimizer tasks;
* *tp / cp / ep*: the collectives of the units, which occupy the device (their whole duration
  is exposed);
* *pp / dp waits*: time the device sits idle while a transfer or collective it waits for is in
  flight or queued on its link - the part of an idle gap after the upstream task that released
  the transfer ended (a P2P activation or gradient; a ZeRO-3 gather; the optimizer step waiting
  for the last gradient reduction; and after the stage's last compute, its own collectives still
  running, such as ZeRO-1's gather without overlap);
* *bubble*: the rest of the idle time - waiting for other stages' compute (the pipeline's fill
  and drain), and the tail after the stage's work until the step ends.

``bubble_fraction`` is the bubble averaged over the stages, over the step; ``comm_exposed_s[k]``
the exposed time of kind ``k`` averaged over the stages (so the mean compute, the exposed
kinds and ``bubble_fraction * step`` add up to the step).  With uniform compute and free
communication 1F1B's ``bubble_fraction`` is ``(pp - 1) / (m + pp - 1)``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from simulators.engine import EngineResult
from simulators.taskgraph import COMPUTE, TaskGraph

#: what a task of the pipeline is (``TaskGraph.meta["cat"]``): forward, backward, weight gradient,
#: recompute, the communication kinds, the optimizer step
CATS: tuple[str, ...] = ("F", "B", "W", "R", "tp", "cp", "ep", "pp", "dp", "opt")
CAT: dict[str, int] = {c: i for i, c in enumerate(CATS)}
#: the communication kinds result.json's ``comm_exposed_s`` reports
COMM_KINDS: tuple[str, ...] = ("tp", "cp", "ep", "pp", "dp")
#: result.json's ``memory_breakdown`` keys
MEMORY_KINDS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "transient", "buffers")
#: the categories that are the stage's own computation
COMPUTE_CATS: tuple[str, ...] = ("F", "B", "W", "R", "opt")


def time_split(tg: TaskGraph, tl: EngineResult, stages: int) -> dict[str, np.ndarray]:
    """Seconds per stage of ``compute``, each of :data:`COMM_KINDS` and ``bubble`` (module docstring)."""
    cat = tg.meta["cat"]
    step = float(tl.makespan)
    comp = np.flatnonzero(tg.kind == COMPUTE)
    dev = tg.dev[comp]
    dur = tg.dur[comp]
    out = {k: np.zeros(stages) for k in ("compute", *COMM_KINDS, "bubble")}
    for k in ("tp", "cp", "ep"):
        sel = cat[comp] == CAT[k]
        out[k] = np.bincount(dev[sel], weights=dur[sel], minlength=stages)
    own = np.isin(cat[comp], [CAT[c] for c in COMPUTE_CATS])
    out["compute"] = np.bincount(dev[own], weights=dur[own], minlength=stages)

    T = tg.num_tasks
    src = np.repeat(np.arange(T), np.diff(tg.succ_ptr))
    dst = tg.succ_idx
    # when each task became ready (its last predecessor's end): a transfer queued from then on
    ready = np.zeros(T)
    if len(src):
        np.maximum.at(ready, dst, tl.end[src])
    # each compute task's idle gap before it and the predecessor that ended last (the one it waited for)
    order = comp[np.lexsort((tl.start[comp], tg.dev[comp]))]
    prev_end = np.zeros(T)
    same = tg.dev[order[1:]] == tg.dev[order[:-1]]
    prev_end[order[1:]] = np.where(same, tl.end[order[:-1]], 0.0)
    is_comp_dst = tg.kind[dst] == COMPUTE
    s2, d2 = src[is_comp_dst], dst[is_comp_dst]
    if len(d2):
        o = np.lexsort((tl.end[s2], d2))
        s2, d2 = s2[o], d2[o]
        last = np.concatenate([d2[1:] != d2[:-1], [True]])
        bind, task = s2[last], d2[last]
        waits = (tg.kind[bind] != COMPUTE) & (tl.end[bind] >= tl.start[task]) & (tl.start[task] > prev_end[task])
        bind, task = bind[waits], task[waits]
        exposed = np.maximum(0.0, tl.start[task] - np.maximum(prev_end[task], ready[bind]))
        for k in ("pp", "dp"):
            sel = cat[bind] == CAT[k]
            out[k] += np.bincount(tg.dev[task[sel]], weights=exposed[sel], minlength=stages)
    # a stage's own collectives still running after its last compute task
    last_end = np.zeros(stages)
    np.maximum.at(last_end, dev, tl.end[comp])
    dp_tasks = np.flatnonzero(cat == CAT["dp"])
    if len(dp_tasks):
        links = tg.res_idx[tg.res_ptr[dp_tasks]]
        stage_of = links - 2 * stages
        tail_end = np.zeros(stages)
        np.maximum.at(tail_end, stage_of, tl.end[dp_tasks])
        out["dp"] += np.maximum(0.0, np.minimum(tail_end, step) - last_end)
    used = out["compute"] + sum(out[k] for k in COMM_KINDS)
    rest = step - used
    out["bubble"] = np.where(rest > 1e-12 * step, rest, 0.0)  # what rounding leaves of a stage busy all step is no bubble
    return out


def memory_breakdown(static: Mapping[str, np.ndarray], peak: np.ndarray) -> tuple[int, dict[str, int]]:
    """(the stage with the highest peak, its bytes by :data:`MEMORY_KINDS`): the activations are
    the peak above the static kinds (the engine's buffers are the activations alone)."""
    s = int(np.argmax(peak))
    fixed = {k: int(v[s]) for k, v in static.items()}
    acts = int(peak[s]) - sum(fixed.values())
    return s, {k: (acts if k == "activations" else fixed[k]) for k in MEMORY_KINDS}


def pipeline_figures(tg: TaskGraph, tl: EngineResult, static: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> dict[str, Any]:
    """result.json's LLM figures (the ``extras`` of the :class:`~simulators.result.SimResult`).

    ``info``: ``gpus``, ``tokens`` (per step), ``model_flops`` and ``hardware_flops`` (per step,
    all GPUs), ``peak_flops`` (one GPU's dense peak at the plan's precision) and ``pipeline``
    (what result.json reports of the layout).  MFU and HFU are Korthikanti et al.'s: model
    FLOPs (without recomputation) and hardware FLOPs (with it) per second per GPU, over the peak."""
    stages = len(next(iter(static.values())))
    step = float(tl.makespan)
    split = time_split(tg, tl, stages)
    s, breakdown = memory_breakdown(static, tl.peak_mem)
    gpus = int(info["gpus"])
    per_gpu = step * gpus
    return {
        "tokens_per_s_per_gpu": float(info["tokens"]) / per_gpu,
        "model_tflops_per_gpu": float(info["model_flops"]) / per_gpu / 1e12,
        "mfu": float(info["model_flops"]) / (per_gpu * float(info["peak_flops"])),
        "hfu": float(info["hardware_flops"]) / (per_gpu * float(info["peak_flops"])),
        "peak_memory_max_bytes": int(tl.peak_mem.max()),
        "memory_breakdown": breakdown,
        "memory_breakdown_stage": s,
        "bubble_fraction": float(split["bubble"].mean()) / step if step > 0 else 0.0,
        "comm_exposed_s": {k: float(split[k].mean()) for k in COMM_KINDS},
        "pipeline": dict(info["pipeline"]),
    }
