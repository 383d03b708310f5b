"""The picture of one simulated pipeline: stages by time (a job's ``gantt.png`` for a stack plan).

One row per pipeline stage (its representative GPU), the first stage on top.  Forward passes are
blue, backward passes orange, ZB-H1's weight-gradient passes green, recomputation purple, the
optimizer step dark green, the units' TP / CP / EP collectives grey; the shade of a pass
alternates with its micro-batch and, with interleaving, each model chunk of a stage has its own
tone, and a pass wide enough carries its micro-batch number - so 1F1B's staircase and the
interleaved schedule's groups of ``pp`` read at a glance.  Under each stage a thin lane shows its
point-to-point sends (black) and its DP / ZeRO collectives (hatched), which run beside the
compute.  White is idle time: the bubble, and waits for communication.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.core.graph import BACKWARD
from simulators.pipeline_figures import CAT
from simulators.result import SimResult
from simulators.taskgraph import COMPUTE

#: (dark, light) tones per local model chunk of each pass kind
TONES: dict[str, list[tuple[str, str]]] = {
    "F": [("#2f5f9e", "#6f9fd8"), ("#1f7f8f", "#5fbfcf"), ("#4a4a9e", "#8a8ad8"), ("#2f7f5f", "#6fbf9f")],
    "B": [("#c8641e", "#f0a060"), ("#b8322a", "#e8726a"), ("#a0701e", "#d8b060"), ("#a03e6e", "#d87eae")],
    "W": [("#3c8c3c", "#7cc87c")],
}
SOLID: dict[str, str] = {"R": "#8e5fb0", "opt": "#1e5a32", "tp": "#8c8c8c", "cp": "#6c6c6c", "ep": "#acacac"}


def _bars(ax: Any, start: np.ndarray, end: np.ndarray, y: float, h: float, color: str, scale: float, **kw: Any) -> None:
    if len(start):
        ax.broken_barh(list(zip(start * scale, (end - start) * scale)), (y, h), facecolors=color, **kw)


#: from this many compute tasks the picture draws each pass as one bar (its recompute and
#: collectives in its colour): finer detail is below a pixel there, and matplotlib slow
MERGE_FROM = 20_000


def merged_passes(tg: Any, tl: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compute tasks merged into one bar per pass: runs of consecutive tasks of a stage with the
    same micro-batch, chunk and kind (forward: F and its collectives; backward: recompute, B and
    theirs; W; the optimizer).  Returns per bar its first task, start, end and the category it is
    drawn as (F, B, W or opt)."""
    cat = tg.meta["cat"]
    comp = np.flatnonzero(tg.kind == COMPUTE)
    comp = comp[np.lexsort((tl.start[comp], tg.dev[comp]))]
    c = cat[comp]
    own = np.isin(c, [CAT["W"], CAT["opt"]])
    backward = np.isin(c, [CAT["B"], CAT["R"]]) | ((tg.phase[comp] == BACKWARD) & ~own)
    cls = np.where(own, c, np.where(backward, CAT["B"], CAT["F"]))
    key = np.stack([tg.dev[comp], tg.meta["micro"][comp], tg.meta["chunk"][comp], cls])
    cut = np.flatnonzero(np.concatenate([[True], (key[:, 1:] != key[:, :-1]).any(axis=0)]))
    return comp[cut], np.minimum.reduceat(tl.start[comp], cut), np.maximum.reduceat(tl.end[comp], cut), cls[cut]


def plot_pipeline(sim: SimResult, path: str | Path, title: str | None = None) -> None:
    """Draw the pipeline of a stack plan's simulated step (module docstring) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tg, tl = sim.taskgraph, sim.timeline
    pipe = sim.extras.get("pipeline", {})
    pp = int(pipe.get("pp", int(tg.dev[tg.kind == COMPUTE].max()) + 1))
    cat, micro, chunk = tg.meta["cat"], tg.meta["micro"], tg.meta["chunk"]
    step = sim.step_time_s
    scale, unit = (1e3, "ms") if step < 10 else (1.0, "s")
    row = min(0.55, 12.0 / pp)
    fig, ax = plt.subplots(figsize=(14, 1.6 + row * pp))
    comp = tg.kind == COMPUTE
    merged = int(comp.sum()) >= MERGE_FROM
    if merged:
        t_all, t_start, t_end, t_cat = merged_passes(tg, tl)
    else:
        t_all = np.flatnonzero(comp)
        t_start, t_end, t_cat = tl.start[t_all], tl.end[t_all], cat[t_all]
    t_dev, t_micro = tg.dev[t_all], micro[t_all]
    t_local = np.where(chunk[t_all] >= 0, chunk[t_all] // max(pp, 1), 0)
    for kind, tones in TONES.items():
        for c, (dark, light) in enumerate(tones):
            for parity, color in ((0, dark), (1, light)):
                sel = (t_cat == CAT[kind]) & (t_micro % 2 == parity) & (t_local % len(tones) == c)
                for s in range(pp):
                    k = sel & (t_dev == s)
                    _bars(ax, t_start[k], t_end[k], s - 0.4, 0.6, color, scale, edgecolor="none")
    for kind, color in SOLID.items():
        sel = t_cat == CAT[kind]
        for s in range(pp):
            k = sel & (t_dev == s)
            _bars(ax, t_start[k], t_end[k], s - 0.4, 0.6, color, scale, edgecolor="none")
    # the communication lanes: P2P sends by their sending stage, DP / ZeRO collectives by their stage's link
    owner = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    links = tg.res_idx
    for s in range(pp):
        p2p = owner[(cat[owner] == CAT["pp"]) & ((links == s) | (links == pp + s))]
        _bars(ax, tl.start[p2p], tl.end[p2p], s + 0.22, 0.08, "#222222", scale, edgecolor="none")
        dp = owner[(cat[owner] == CAT["dp"]) & (links == 2 * pp + s)]
        _bars(ax, tl.start[dp], tl.end[dp], s + 0.3, 0.1, "#d0d0d0", scale, edgecolor="#555555", linewidth=0.2, hatch="////")
    # micro-batch numbers on the passes wide enough to hold one
    passes = np.flatnonzero(np.isin(t_cat, [CAT["F"], CAT["B"], CAT["W"]]))
    if len(passes):
        key = np.stack([t_dev[passes], t_micro[passes], chunk[t_all][passes], t_cat[passes]])
        order = np.lexsort((t_start[passes], *key[::-1]))
        passes, key = passes[order], key[:, order]
        cut = np.flatnonzero(np.concatenate([[True], (key[:, 1:] != key[:, :-1]).any(axis=0)]))
        lo = np.minimum.reduceat(t_start[passes], cut)
        hi = np.maximum.reduceat(t_end[passes], cut)
        for a, b, i in zip(lo, hi, passes[cut]):
            if (b - a) * 120 >= step and len(str(t_micro[i])) * step < 250 * (b - a):
                ax.text((a + b) / 2 * scale, t_dev[i] - 0.1, str(t_micro[i]), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)], fontsize=7 if pp <= 32 else 5)
    ax.set_ylim(pp - 0.5, -0.5)
    ax.set_xlim(0, max(step * scale, 1e-9))
    ax.set_xlabel(f"time ({unit})")
    handles = [Patch(facecolor=TONES["F"][0][0], label="forward"), Patch(facecolor=TONES["B"][0][0], label="backward")]
    if (cat == CAT["W"]).any():
        handles.append(Patch(facecolor=TONES["W"][0][0], label="weight gradient (W)"))
    if not merged:
        handles += [Patch(facecolor=SOLID[k], label=n) for k, n in (("R", "recompute"), ("tp", "TP/CP/EP collective"))]
    handles += [Patch(facecolor=SOLID["opt"], label="optimizer"), Patch(facecolor="#222222", label="P2P send"),
                Patch(facecolor="#d0d0d0", hatch="////", edgecolor="#555555", label="DP/ZeRO")]
    # below the axes, outside them: savefig's tight box takes it in, whatever the number of stages
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), fontsize=7, frameon=False)
    bubble = sim.extras.get("bubble_fraction")
    head = (f"{pipe.get('schedule', '?')}: pp={pp} vpp={pipe.get('vpp', 1)} m={pipe.get('m', '?')}, step {step * scale:.4g} {unit}"
            + (f", bubble {bubble * 100:.1f} %" if bubble is not None else "")
            + (" (each pass one bar, its recompute and collectives included)" if merged else ""))
    ax.set_title(f"{title}\n{head}" if title else head, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
