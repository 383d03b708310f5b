"""Gantt chart of a simulated step: one row per device, one per busy link."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.graph import PHASES
from simulators.simulate import SimResult
from simulators.taskgraph import COMPUTE

#: grey levels that stay apart in black and white, plus hatching for communication
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868"}
COMM_COLOR = "#8c8c8c"


def plot_gantt(sim: SimResult, path: str | Path, max_links: int = 16, title: str | None = None) -> None:
    """Draw devices (compute tasks coloured by phase) and the ``max_links`` busiest links."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tg, tl, cl = sim.taskgraph, sim.timeline, sim.cluster
    D = cl.num_devices
    busy = tl.link_busy
    links = [int(l) for l in np.argsort(-busy, kind="stable")[:max_links] if busy[l] > 0]
    links.sort()
    rows = D + len(links)
    scale, unit = (1e3, "ms") if sim.step_time_s < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.35 * rows))
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
    ax.set_yticks(range(rows), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(sim.step_time_s * scale, 1e-9))
    ax.axvline(sim.lower_bound_s * scale, color="black", linestyle=":", linewidth=1)
    handles = [Patch(facecolor=c, label=n) for n, c in PHASE_COLORS.items()]
    handles += [Patch(facecolor=COMM_COLOR, hatch="//", edgecolor="black", label="transfer / all-reduce")]
    handles += [plt.Line2D([0], [0], color="black", linestyle=":", label="lower bound")]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=5)
    ax.set_title(title or f"step {sim.step_time_s * scale:.3g} {unit}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
