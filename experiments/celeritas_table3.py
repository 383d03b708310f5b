"""Celeritas Table 3: simulated single-step time on 4 devices (V100 32 GB, PCIe) for
Metis, Baechi's m-TOPO / m-ETF / m-SCT, HRL, Order-Place and Celeritas.

Every placement is replayed in the discrete-event simulator with the calibrated cost
model (V100 kernel times fitted to DeepBench's measurements).  A cell is ``OOM`` when the simulated step overflows a device or when the
algorithm itself ran out of memory while placing (m-ETF / m-SCT's ``placement_oom``);
the CSV keeps the step time and both flags.  Speed-up is the paper's: Celeritas against
the best non-OOM baseline (Metis, m-TOPO, m-ETF, m-SCT, HRL).  One device and DFS-TOPO
are extra reference columns.  The paper's numbers are printed beside ours (``paper``).

HRL trains against the simulator with a sample budget (``--hrl-samples``) and a wall-clock
cap (``--hrl-time``) per model; the paper quotes 5 hours of training from Mars.

``--colocate-gradients`` reruns the table with every module's backward ops co-located
with its forward ops (TensorFlow's ``colocate_gradients_with_ops``, which the TF setups
of the papers can use; :func:`harness.core.graph_rewrites.colocate_gradients`): the captured
graph only ties a parameter's view, gradient and update together.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from algorithms.baselines import SingleDevice
from algorithms.celeritas import Celeritas
from algorithms.dfs_topo import DfsTopo
from algorithms.hrl import HRL
from algorithms.m_etf import METF
from algorithms.m_sct import MSCT
from algorithms.m_topo import MTopo
from harness.core.graph_rewrites import colocate_gradients
from algorithms.metis_place import Metis
from experiments._celeritas import PAPER_SPEEDUP, PAPER_TABLE3, TABLE3_ALGOS, cli, fmt_paper, load, models_to_run
from experiments.common import output_dir, print_table, style
from simulators.simulate import simulate

REFERENCE = ["single_device", "dfs_topo"]


def make_algos(hrl_samples: int, hrl_time: float | None, seed: int) -> dict[str, Any]:
    return {
        "metis": Metis(seed=seed),
        "m_topo": MTopo(seed=seed),
        "m_etf": METF(seed=seed),
        "m_sct": MSCT(seed=seed),
        "hrl": HRL(samples=hrl_samples, samples_per_step=8, time_budget_s=hrl_time, seed=seed, progress=True, environment=simulate),
        "order_place": Celeritas(name="order_place", adjust=False, seed=seed),
        "celeritas": Celeritas(seed=seed),
        "single_device": SingleDevice(seed=seed),
        "dfs_topo": DfsTopo(seed=seed),
    }


def run_one(name: str, algo: Any, g: Any, cl: Any, costs: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    plan = algo.plan(g, cl, costs)
    search = time.perf_counter() - t0
    res = simulate(plan.graph, plan.strategy, cl, costs)
    info = plan.info
    placement_oom = bool(info.get("placement_oom", False))
    return {
        "algo": name,
        "step_time_s": res.step_time_s,
        "sim_oom": bool(res.oom),
        "placement_oom": placement_oom,
        "oom": bool(res.oom) or placement_oom,
        "peak_mem_gib": max(res.peak_memory_bytes) / 2**30,
        "search_s": search,
        "fallback_nodes": info.get("fallback_nodes"),
        "adjusted_nodes": info.get("adjusted_nodes"),
        "comm_gib": res.comm_bytes / 2**30,
        "plan_lower_bound_s": res.plan_lower_bound_s,
        "hrl_samples": info.get("samples") if name == "hrl" else None,
        "hrl_wall_s": info.get("wall_time_s") if name == "hrl" else None,
        "hrl_oom_samples": info.get("oom_samples") if name == "hrl" else None,
        "devices_used": len(plan.strategy.devices_used()),
    }


def cell(r: dict[str, Any]) -> str:
    return "OOM" if r["oom"] else f"{r['step_time_s']:.3f}"


def speedup(by: dict[str, dict[str, Any]]) -> str:
    cel = by.get("celeritas")
    alts = [by[a]["step_time_s"] for a in ("metis", "m_topo", "m_etf", "m_sct", "hrl") if a in by and not by[a]["oom"]]
    if cel is None or cel["oom"]:
        return "n/a (Celeritas OOM)"
    if not alts:
        return "n/a (every baseline OOM)"
    best = min(alts)
    return f"{100 * (best - cel['step_time_s']) / best:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = cli("celeritas_table3", __doc__)
    ap.add_argument("--hrl-samples", type=int, default=None, help="HRL sample budget per model (default 2000; --quick 16)")
    ap.add_argument("--hrl-time", type=float, default=None, help="HRL wall-clock cap per model in seconds (default 600)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algos", nargs="*", default=None, help="subset of the algorithms")
    ap.add_argument("--colocate-gradients", action="store_true",
                    help="co-locate every module's backward ops with its forward ops (TF's colocate_gradients_with_ops); outputs get a _gradcoloc suffix")
    a = ap.parse_args(argv)
    sfx = "_gradcoloc" if a.colocate_gradients else ""
    out = output_dir(a)
    hrl_samples = a.hrl_samples or (16 if a.quick else 2000)
    hrl_time = a.hrl_time if a.hrl_time is not None else (None if a.quick else 600.0)
    algos = make_algos(hrl_samples, hrl_time, a.seed)
    names = [n for n in TABLE3_ALGOS + REFERENCE if not a.algos or n in a.algos]
    runs = []
    wide = []
    for model, batch in models_to_run(a):
        _, g, cl, costs, _ = load(model, batch, a.cluster)
        if a.colocate_gradients:
            g = colocate_gradients(g)
        by: dict[str, dict[str, Any]] = {}
        for name in tqdm(names, desc=f"table 3 {model}", unit="algo"):
            r = run_one(name, algos[name], g, cl, costs)
            r.update(model=model, batch=int(g.meta.get("batch_size", batch)), nodes=g.num_nodes)
            runs.append(r)
            by[name] = r
        row: dict[str, Any] = {"model": model, "batch": by[names[0]]["batch"]}
        for n in TABLE3_ALGOS:
            if n in by:
                row[n] = cell(by[n])
        row["speedup"] = speedup(by)
        for n in REFERENCE:
            if n in by:
                row[f"ref_{n}"] = cell(by[n])
        paper = PAPER_TABLE3.get(model)
        for n, v in zip(TABLE3_ALGOS, paper or [math.nan] * len(TABLE3_ALGOS)):
            row[f"paper_{n}"] = fmt_paper(v) if paper else "n/a"
        row["paper_speedup"] = f">{PAPER_SPEEDUP[model]}%" if model in PAPER_SPEEDUP else "n/a"
        wide.append(row)
    pd.DataFrame(runs).to_csv(out / f"table3_runs{sfx}.csv", index=False)
    pd.DataFrame(wide).to_csv(out / f"table3{sfx}.csv", index=False)
    ours = ["model", "batch"] + [n for n in TABLE3_ALGOS if n in names] + ["speedup"] + [f"ref_{n}" for n in REFERENCE if n in names]
    print_table(wide, ours, title=f"Table 3 (ours, simulated on {a.cluster}{', gradients co-located with their forward module' if sfx else ''}): single-step time in seconds; OOM = out of memory")
    print()
    print_table(wide, ["model"] + [f"paper_{n}" for n in TABLE3_ALGOS] + ["paper_speedup"], title="Table 3 (paper, TensorFlow on 4 x V100)")

    style()
    plot_bars(pd.DataFrame(runs), names, out / f"table3{sfx}.png", sfx)
    print(f"wrote {out / f'table3{sfx}.csv'}, {out / f'table3_runs{sfx}.csv'} and {out / f'table3{sfx}.png'}")
    return 0


def plot_bars(df: pd.DataFrame, names: list[str], path: Any, sfx: str) -> None:
    """Ours beside the paper's, a bar per algorithm and model on a log axis (step times span
    LeNet-5's microseconds to seconds), each bar labelled with its value; OOM and a model the
    paper does not have are written where the bar would be."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=False)
    models = list(dict.fromkeys(df["model"]))
    x = np.arange(len(models))
    shown = [n for n in TABLE3_ALGOS if n in names]
    bw = 0.8 / max(len(shown), 1)
    colors = ["#1b1b1b", "#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3"]
    for ax, src in zip(axes, ["ours", "paper"]):
        series = []
        for n in shown:
            vals, ooms = [], []
            for m in models:
                if src == "ours":
                    r = df[(df["model"] == m) & (df["algo"] == n)].iloc[0]
                    vals.append(r["step_time_s"])
                    ooms.append(bool(r["oom"]))
                else:
                    p = PAPER_TABLE3.get(m)
                    v = p[TABLE3_ALGOS.index(n)] if p else None
                    vals.append(v if v is not None else np.nan)
                    ooms.append(p is not None and v is None)
            series.append((n, np.where(ooms, np.nan, np.array(vals, dtype=float)), ooms))
        finite = np.concatenate([v[np.isfinite(v) & (v > 0)] for _, v, _ in series] or [np.array([])])
        lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (1e-3, 1.0)
        floor = 10 ** np.floor(np.log10(lo / 2))
        ax.set_yscale("log")
        for i, (n, v, ooms) in enumerate(series):
            xs = x + (i - len(shown) / 2 + 0.5) * bw
            ax.bar(xs, v - floor, bw, bottom=floor, label=n, color=colors[i % len(colors)], edgecolor="black")
            for xi, vi, oom in zip(xs, v, ooms):
                if oom:
                    ax.text(xi, floor * 1.15, "OOM", rotation=90, ha="center", va="bottom", fontsize=6)
                elif np.isfinite(vi):
                    ax.text(xi, vi * 1.1, f"{vi:.3g}", rotation=90, ha="center", va="bottom", fontsize=5.5)
        if src == "paper":
            for xi, m in zip(x, models):
                if m not in PAPER_TABLE3:
                    ax.text(xi, floor * 1.5, "not in the paper", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_ylim(floor, hi * 8)
        ax.set_xlim(-0.5, len(models) - 0.5)
        ax.set_xticks(x, models, rotation=15)
        ax.set_ylabel("step time (s, log scale)")
        ax.set_title("ours (simulated, calibrated costs)" if src == "ours" else "paper (Table 3)")
        ax.legend(fontsize=7, ncol=4, loc="upper right")
    fig.suptitle("Celeritas Table 3: single-step time on 4 devices (OOM = out of memory)"
                 + (" - gradients co-located with their forward module" if sfx else ""))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
