"""Nodes, edges and CCR (Celeritas Eq. 1, :func:`algorithms.sched.levels.graph_ccr`: the static costs a
placer plans with, as in celeritas_table2) of every zoo model's training-step graph."""

from __future__ import annotations

import time

import pandas as pd
from tqdm import tqdm

from algorithms.sched.levels import graph_ccr
from experiments.common import experiment_args, model_overrides, models_of, output_dir, print_table, style, zoo_models
from harness.app.compose import compose
from harness.app.run import build
from harness.core.stats import graph_stats

QUICK_MODELS = ["lenet5", "alexnet", "resnet50"]


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("graph_stats", __doc__, "graph_stats", quick="three small models at batch 8", models="every zoo model",
                         batch="--batch, else the model's own batch size")
    ap.add_argument("--cluster", default="v100x4_pcie", help="cluster whose mean device time and link figures define w_i and c_ij")
    ap.add_argument("--batch", type=int, default=None, help="batch size for every model (default: each model's own; --quick 8)")
    ap.add_argument("--granularity", default="aten", choices=["aten", "core_aten", "layer"])
    a = ap.parse_args(argv)
    if a.quick and a.batch is None:
        a.batch = 8
    models = models_of(a, zoo_models(), QUICK_MODELS, fallback=a.batch)
    out = output_dir(a)
    rows = []
    for m, batch in tqdm(models, desc="capturing", unit="model"):
        cfg = compose([*model_overrides(m, batch), f"cluster={a.cluster}", f"graph.granularity={a.granularity}"])
        source, cluster, costs, _, _ = build(cfg)
        t0 = time.perf_counter()
        g = source.op_graph(**cfg.graph)
        st = graph_stats(g, costs)
        coloc = st.pop("coloc_groups")
        rows.append({"model": m, "batch": source.batch_size, "capture_s": time.perf_counter() - t0, **st,
                     "ccr": graph_ccr(g, cluster, costs), "coloc_groups": coloc})
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
