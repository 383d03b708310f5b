"""Celeritas Table 2: number of nodes and CCR (Eq. 1) before and after Optimal Operation Fusion.

CCR = sum of c_ij over edges / sum of w_i over nodes, with w_i and c_ij the static costs
Celeritas plans with (:func:`algorithms.sched.levels.static_costs` on the cluster: every
edge as if it crossed devices).  After merging, a coarse edge costs the distinct tensors
crossing between two clusters and a cluster's w is the sum of its members'
(:func:`algorithms.celeritas.coarsen` with R = 200, M = 0.25 x device memory).
The paper's numbers (TensorFlow graphs) are printed beside ours, labelled ``paper``.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from tqdm import tqdm

from algorithms.celeritas import Celeritas
from algorithms.sched.levels import ccr
from experiments._celeritas import PAPER_TABLE2, cli, load, models_to_run
from experiments.common import HATCHES, output_dir, print_table, style


def main(argv: list[str] | None = None) -> int:
    ap = cli("celeritas_table2", __doc__)
    ap.add_argument("--R", type=int, default=200, help="Optimal_BP's exploration range")
    ap.add_argument("--M", type=float, default=0.25, help="cluster memory cap, fraction of one device's memory")
    a = ap.parse_args(argv)
    out = output_dir(a)
    rows = []
    for model, batch in tqdm(models_to_run(a), desc="table 2", unit="model"):
        _, g, cl, costs, _ = load(model, batch, a.cluster)
        t0 = time.perf_counter()
        co, w, c = Celeritas(R=a.R, M=a.M).coarsen(g, cl, costs)
        fuse_s = time.perf_counter() - t0
        p = PAPER_TABLE2.get(model)
        rows.append({
            "model": model, "batch": int(g.meta.get("batch_size", batch)),
            "nodes": g.num_nodes, "edges": g.num_edges, "ccr": ccr(w, c),
            "nodes_after": co.num_clusters, "edges_after": co.graph.num_edges, "ccr_after": ccr(co.w, co.c),
            "node_reduction": g.num_nodes / max(co.num_clusters, 1), "ccr_reduction": ccr(w, c) / max(ccr(co.w, co.c), 1e-12),
            "fusion_s": fuse_s,
            "paper_nodes": p[0] if p else np.nan, "paper_ccr": p[1] if p else np.nan,
            "paper_nodes_after": p[2] if p else np.nan, "paper_ccr_after": p[3] if p else np.nan,
        })
    df = pd.DataFrame(rows)
    df.to_csv(out / "table2.csv", index=False)
    print_table(rows, ["model", "batch", "nodes", "ccr", "nodes_after", "ccr_after", "paper_nodes", "paper_ccr", "paper_nodes_after", "paper_ccr_after"],
                title=f"Table 2: nodes and CCR before / after merging (ours on {a.cluster}; paper_* = Celeritas's TensorFlow graphs)")

    style()
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(df))
    bw = 0.2
    for ax, (col, pcol, label) in zip(axes, [("nodes", "paper_nodes", "nodes"), ("ccr", "paper_ccr", "CCR")]):
        series = [
            (df[col], f"{label} (ours)"), (df[f"{col}_after"], f"{label} after merging (ours)"),
            (df[pcol], f"{label} (paper)"), (df[f"{pcol}_after"], f"{label} after merging (paper)"),
        ]
        for i, (vals, lab) in enumerate(series):
            ax.bar(x + (i - 1.5) * bw, vals, bw, label=lab, color=["#4c72b0", "#dd8452", "#cccccc", "#888888"][i],
                   edgecolor="black", hatch=HATCHES[i])
        ax.set_xticks(x, df["model"], rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("Celeritas Table 2: graph size and CCR before / after Optimal Operation Fusion")
    fig.tight_layout()
    fig.savefig(out / "table2.png")
    print(f"wrote {out / 'table2.csv'} and {out / 'table2.png'}")
    return 0
