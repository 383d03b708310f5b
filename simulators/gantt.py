"""Gantt chart of a simulated step: one row per device, one per busy link (a stack plan's pipeline:
:mod:`simulators.pipeline_gantt`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.core.graph import PHASES
from simulators.pipeline_gantt import plot_pipeline
from simulators.result import SimResult
from simulators.taskgraph import COMPUTE

#: grey levels that stay apart in black and white, plus hatching for communication
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868"}
COMM_COLOR = "#8c8c8c"
SEND_COLOR = "#222222"
WAIT_COLOR = "#e0e0e0"


def _sim_rows(sim: SimResult, max_links: int) -> int:
    """Rows :func:`_draw_sim` draws: one per device and one per busy link, at most ``max_links``."""
    return sim.cluster.num_devices + int((sim.timeline.link_busy > 0).sum().clip(max=max_links))


def _draw_sim(ax: Any, sim: SimResult, max_links: int, scale: float) -> None:
    """The simulated step's device rows (compute by phase) and its ``max_links`` busiest links."""
    tg, tl, cl = sim.taskgraph, sim.timeline, sim.cluster
    D = cl.num_devices
    busy = tl.link_busy
    links = [int(l) for l in np.argsort(-busy, kind="stable")[:max_links] if busy[l] > 0]
    links.sort()
    comp = np.flatnonzero(tg.kind == COMPUTE)
    phase = tg.phase[comp] if tg.phase is not None else sim.graph.phase[tg.node[comp]]
    for p, pname in enumerate(PHASES):
        sel = comp[phase == p]
        for d in range(D):
            s = sel[tg.dev[sel] == d]
            if len(s):
                ax.broken_barh(list(zip(tl.start[s] * scale, (tl.end[s] - tl.start[s]) * scale)), (d - 0.4, 0.8),
                               facecolors=PHASE_COLORS[pname], edgecolor="none")
    owner = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    for r, l in enumerate(links):
        s = owner[tg.res_idx == l]
        ax.broken_barh(list(zip(tl.start[s] * scale, (tl.end[s] - tl.start[s]) * scale)), (D + r - 0.4, 0.8),
                       facecolors=COMM_COLOR, edgecolor="black", linewidth=0.2, hatch="//")
    labels = [dv.name for dv in cl.devices] + [f"{cl.links[l].name} [{cl.links[l].cls}]" for l in links]
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()


def _legend(ax: Any, measured: bool = False) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=n) for n, c in PHASE_COLORS.items()]
    handles += [Patch(facecolor=COMM_COLOR, hatch="//", edgecolor="black", label="transfer / all-reduce")]
    if measured:
        handles += [Patch(facecolor=SEND_COLOR, label="send call"), Patch(facecolor=WAIT_COLOR, hatch="..", label="waiting")]
    handles += [plt.Line2D([0], [0], color="black", linestyle=":", label="lower bound")]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))


def plot_gantt(sim: SimResult, path: str | Path, max_links: int = 16, title: str | None = None) -> None:
    """Draw devices (compute tasks coloured by phase) and the ``max_links`` busiest links; a stack
    plan's step is drawn as its pipeline (:func:`simulators.pipeline_gantt.plot_pipeline`)."""
    if sim.taskgraph.meta.get("graph") == "stack":
        plot_pipeline(sim, path, title)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _sim_rows(sim, max_links)
    scale, unit = (1e3, "ms") if sim.step_time_s < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.35 * rows))
    _draw_sim(ax, sim, max_links, scale)
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(sim.step_time_s * scale, 1e-9))
    ax.axvline(sim.plan_lower_bound_s * scale, color="black", linestyle=":", linewidth=1)
    _legend(ax)
    ax.set_title(title or f"step {sim.step_time_s * scale:.3g} {unit}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_measured_gantt(sim: SimResult, path: str | Path, max_links: int = 4, title: str | None = None) -> None:
    """The simulated step (top) above the real run's mean step (``sim=realrun`` with
    ``sim.trace``, bottom) on one time axis: per rank its op calls by phase, its send calls,
    and its waits for messages and all-reduces; the gaps are the interpreter's own work
    (freeing tensors, dispatch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = sim.measured_timeline
    if tl is None:
        raise ValueError("no measured timeline: run sim=realrun with sim.trace=true")
    from simulators.realrun import TRACE_OP, TRACE_SEND

    ranks = sorted(set(tl["rank"].tolist())) or [0]
    end = max(sim.step_time_s, float(tl["end_s"].max(initial=0.0)))
    scale, unit = (1e3, "ms") if end < 10 else (1.0, "s")
    n_sim = _sim_rows(sim, max_links)
    fig, (top, bot) = plt.subplots(2, 1, sharex=True, figsize=(12, 2.0 + 0.35 * (n_sim + len(ranks))),
                                   gridspec_kw={"height_ratios": [n_sim + 1, len(ranks) + 1]})
    _draw_sim(top, sim, max_links, scale)
    top.axvline(sim.plan_lower_bound_s * scale, color="black", linestyle=":", linewidth=1)
    top.set_title(title or f"simulated {sim.step_time_s * scale:.3g} {unit}", fontsize=9)
    _legend(top, measured=True)
    kind, phase = tl["kind"], np.asarray(tl["node_phase"])
    for row, r in enumerate(ranks):
        on = tl["rank"] == r
        ops = on & (kind == TRACE_OP)
        ph = np.full(len(kind), -1, dtype=np.int64)
        ph[ops] = phase[tl["id"][ops]]
        for p, pname in enumerate(PHASES):
            s = ops & ((ph == p) | ((ph < 0) & (p == 0)))
            _bars(bot, tl, s, row, PHASE_COLORS[pname], scale)
        _bars(bot, tl, on & (kind == TRACE_SEND), row, SEND_COLOR, scale)
        _bars(bot, tl, on & (kind != TRACE_OP) & (kind != TRACE_SEND), row, WAIT_COLOR, scale, hatch="..")
    bot.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=7)
    bot.invert_yaxis()
    meas = sim.extras.get("measured_step_time_s")
    bot.set_title(f"measured (mean of each event over the steps; mean step {meas * scale:.3g} {unit})" if meas else "measured",
                  fontsize=9)
    bot.set_xlabel(f"time ({unit})")
    bot.set_xlim(0, max(end * scale, 1e-9))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax: Any, tl: dict[str, Any], sel: np.ndarray, row: int, color: str, scale: float, hatch: str | None = None) -> None:
    if sel.any():
        ax.broken_barh(list(zip(tl["start_s"][sel] * scale, (tl["end_s"][sel] - tl["start_s"][sel]) * scale)), (row - 0.4, 0.8),
                       facecolors=color, edgecolor="none" if hatch is None else "grey", linewidth=0.2, hatch=hatch)
