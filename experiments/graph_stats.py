"""Nodes, edges and CCR (Celeritas Eq. 1) of every zoo model's training-step graph."""

from __future__ import annotations

import argparse
import time

import pandas as pd
from tqdm import tqdm

from experiments.common import compose, output_dir, print_table, style, zoo_models
from harness.run import build
from harness.stats import graph_stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments graph_stats", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="three small models at batch 8")
    ap.add_argument("--models", nargs="*", default=None, help="zoo models (default: all)")
    ap.add_argument("--cluster", default="v100x4_pcie", help="cluster whose devices 0 and 1 define w_i and c_ij")
    ap.add_argument("--batch", type=int, default=None, help="batch size for every model (default: each model's own)")
    ap.add_argument("--granularity", default="aten", choices=["aten", "core_aten", "layer"])
    ap.add_argument("--out", default=None, help="output dir (default results/graph_stats; --quick: outputs/experiments_quick/graph_stats)")
    a = ap.parse_args(argv)
    models = a.models or (["lenet5", "alexnet", "resnet50"] if a.quick else zoo_models())
    if a.quick and a.batch is None:
        a.batch = 8
    out = output_dir(a, "graph_stats")
    rows = []
    for m in tqdm(models, desc="capturing", unit="model"):
        ov = [f"model={m}", f"cluster={a.cluster}", f"graph.granularity={a.granularity}"]
        if a.batch:
            ov.append(f"model.batch_size={a.batch}")
        cfg = compose(ov)
        source, cluster, costs, _, _ = build(cfg)
        t0 = time.perf_counter()
        g = source.op_graph(**cfg.graph)
        rows.append({"model": m, "batch": source.batch_size, "capture_s": time.perf_counter() - t0, **graph_stats(g, costs)})
    df = pd.DataFrame(rows)
    df.to_csv(out / "graph_stats.csv", index=False)
    print_table(rows, ["model", "batch", "nodes", "edges", "gflops", "param_mib", "ccr", "capture_s"],
                title=f"graph statistics ({a.granularity} graph, CCR on {a.cluster})")
    style()
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax1.bar(df["model"], df["nodes"], color="#4c72b0", edgecolor="black", hatch="//")
    ax1.set_ylabel("nodes")
    ax1.set_yscale("log")
    ax2.bar(df["model"], df["ccr"], color="#dd8452", edgecolor="black", hatch="..")
    ax2.set_ylabel(f"CCR on {a.cluster}")
    ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=60)
    fig.suptitle(f"training-step graphs ({a.granularity})")
    fig.tight_layout()
    fig.savefig(out / "graph_stats.png")
    print(f"wrote {out / 'graph_stats.csv'} and {out / 'graph_stats.png'}")
    return 0
