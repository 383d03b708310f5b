"""OptCNN Figure 7: training throughput on 1-16 GPUs under DP, MP, OWT and layer-wise parallelism."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments._layerwise import OPTCNN_STRATEGIES, STRATEGY_LABEL, optcnn_sweep, write_readme
from experiments.common import experiment_args, models_of, output_dir, print_table, style

#: OptCNN Sec. 6.1: speedup from 1 GPU to 16 GPUs (4 nodes), layer-wise and the best other strategy
PAPER_SPEEDUP_16 = {"alexnet": (12.2, 6.1), "vgg16": (14.8, 10.2), "inception_v3": (15.5, 11.2)}
#: OptCNN Sec. 6.1: largest throughput gain of layer-wise over the other strategies
PAPER_GAIN = {"alexnet": 2.2, "vgg16": 1.5, "inception_v3": 1.4}
MODELS = ("alexnet", "vgg16", "inception_v3")
DEVICES = (1, 2, 4, 8, 16)
QUICK_MODELS = ("alexnet",)
QUICK_DEVICES = (1, 2, 4)


def speedup_rows(df: pd.DataFrame) -> list[dict]:
    rows = []
    for m in df["model"].unique():
        d = df[df["model"] == m]
        one = d[d["devices"] == d["devices"].min()]
        top = d[d["devices"] == d["devices"].max()]
        base = float(one["throughput"].max())
        lw = float(top[top["algo"] == "optcnn"]["throughput"].iloc[0])
        other = float(top[top["algo"] != "optcnn"]["throughput"].max())
        gains = []
        for n in d["devices"].unique():
            p = d[d["devices"] == n]
            gains.append(float(p[p["algo"] == "optcnn"]["throughput"].iloc[0]) / float(p[p["algo"] != "optcnn"]["throughput"].max()))
        paper = PAPER_SPEEDUP_16.get(m)
        rows.append({
            "model": m, "devices": f"{int(d['devices'].min())}->{int(d['devices'].max())}",
            "layer-wise speedup": lw / base, "layer-wise (paper, 1->16)": paper[0] if paper else "n/a",
            "best other speedup": other / base, "best other (paper, 1->16)": paper[1] if paper else "n/a",
            "max gain over others": max(gains), "max gain (paper)": PAPER_GAIN.get(m, "n/a"),
        })
    return rows


def sweep_from_argv(name: str, doc: str | None, argv: list[str] | None) -> tuple[pd.DataFrame, Path, argparse.Namespace]:
    """The command line shared by Figures 7, 8 and Table 4 (they read the same sweep), parsed,
    and the sweep itself (cached in layerwise_runs.csv): ``(runs, output dir, arguments)``."""
    ap = experiment_args(name, doc, "optcnn", quick="alexnet on 1, 2, 4 GPUs, batch 2 per GPU", models=" ".join(MODELS), batch=None)
    ap.add_argument("--devices", nargs="*", type=int, default=None, help="GPU counts (default 1 2 4 8 16; --quick 1 2 4)")
    ap.add_argument("--per-gpu-batch", type=int, default=None, help="OptCNN: 32 per GPU (--quick 2)")
    ap.add_argument("--cluster", default="p100x16_4nodes", help="its first k devices make the k-GPU point")
    ap.add_argument("--sync", default="ps", choices=["ps", "ring"], help="t_S: parameter server (OptCNN) or ring all-reduce")
    ap.add_argument("--recompute", action="store_true", help="ignore the cached sweep (layerwise_runs.csv)")
    a = ap.parse_args(argv)
    a.models = [m for m, _ in models_of(a, MODELS, QUICK_MODELS)]
    a.devices = a.devices or list(QUICK_DEVICES if a.quick else DEVICES)
    if a.per_gpu_batch is None:
        a.per_gpu_batch = 2 if a.quick else 32
    out = output_dir(a)
    return optcnn_sweep(a.models, a.devices, a.per_gpu_batch, out, a.recompute, a.cluster, a.sync), out, a


def main(argv: list[str] | None = None) -> int:
    df, out, a = sweep_from_argv("optcnn_fig7", __doc__, argv)
    tab = df.pivot_table(index=["model", "devices"], columns="algo", values="throughput").reset_index()
    tab.columns.name = None
    for m in tab["model"].unique():
        sel = tab["model"] == m
        one = tab[sel & (tab["devices"] == tab[sel]["devices"].min())]
        base = float(one[list(OPTCNN_STRATEGIES)].max(axis=1).iloc[0]) / float(one["devices"].iloc[0])
        tab.loc[sel, "linear scaling"] = base * tab.loc[sel, "devices"]
    tab.to_csv(out / "fig7.csv", index=False)
    rows = tab.to_dict("records")
    t1 = print_table(rows, ["model", "devices", *OPTCNN_STRATEGIES, "linear scaling"],
                     title=f"OptCNN Fig. 7: throughput (images/s, simulated) on the first k GPUs of {a.cluster}, "
                           f"batch {a.per_gpu_batch} per GPU")
    srows = speedup_rows(df)
    t2 = print_table(srows, list(srows[0]), title="scaling and gains, ours beside the paper's (Sec. 6.1)")
    style()
    import matplotlib.pyplot as plt

    models = list(tab["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        d = tab[tab["model"] == m]
        for s in OPTCNN_STRATEGIES:
            ax.plot(d["devices"], d[s], label=STRATEGY_LABEL[s])
        ax.plot(d["devices"], d["linear scaling"], color="#c44e52", linestyle=":", marker="", label="linear scaling")
        ax.set_xscale("log", base=2)
        ax.set_xticks(d["devices"], [str(int(x)) for x in d["devices"]])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("images / s")
        ax.set_title(m)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("OptCNN Fig. 7 (ours, simulated): training throughput")
    fig.tight_layout()
    fig.savefig(out / "fig7.png")
    plt.close(fig)
    cmd = "python -m experiments optcnn_fig7" + (" --quick" if a.quick else "")
    write_readme(out, "OptCNN (Jia et al., ICML 2018): our results beside the paper's", [(
        "Figure 7: throughput (fig7.csv, fig7.png)",
        f"`{cmd}`; every point is the event simulator's step time of the strategy on the first k GPUs of "
        f"{a.cluster} (1 node up to 4 GPUs, then 2 and 4 nodes), batch {a.per_gpu_batch} per GPU, gradients "
        f"synchronised through {'a parameter server (OptCNN)' if a.sync == 'ps' else 'ring all-reduce'}. The paper's "
        f"figure values are not in our copy of the paper; its text gives the speedups in the second table.\n\n"
        f"```\n{t1}\n\n{t2}\n```",
    )])
    print(f"wrote {out / 'fig7.csv'} and {out / 'fig7.png'}")
    return 0
