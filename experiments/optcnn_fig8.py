"""OptCNN Figure 8: bytes moved per training step under DP, MP, OWT and layer-wise parallelism."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments._layerwise import OPTCNN_STRATEGIES, STRATEGY_LABEL, optcnn_sweep, write_readme
from experiments.common import HATCHES, print_table, results_dir, style
from experiments.optcnn_fig7 import DEVICES, MODELS

#: OptCNN Sec. 1 and 6.1: communication reductions (ranges over networks and GPU counts)
PAPER = {
    "layer-wise vs DP and MP": "1.3-23.0x",
    "OWT vs DP and MP": "1.1-23.0x",
    "layer-wise vs OWT": "1.2-2.5x",
}


def _range(x: pd.Series) -> str:
    x = x.replace([np.inf, -np.inf], np.nan).dropna()
    return f"{x.min():.2g}-{x.max():.3g}x" if len(x) else "n/a (no bytes moved)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments optcnn_fig8", description=__doc__)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--devices", nargs="*", type=int, default=list(DEVICES))
    ap.add_argument("--per-gpu-batch", type=int, default=32)
    ap.add_argument("--cluster", default="p100x16_4nodes")
    ap.add_argument("--sync", default="ps", choices=["ps", "ring"], help="t_S: parameter server (OptCNN) or ring all-reduce")
    ap.add_argument("--recompute", action="store_true", help="ignore the cached sweep (layerwise_runs.csv)")
    ap.add_argument("--quick", action="store_true", help="alexnet on 1, 2, 4 GPUs, batch 2 per GPU")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.models, a.devices, a.per_gpu_batch = ["alexnet"], [1, 2, 4], 2
    out = Path(a.out) if a.out else results_dir("optcnn")
    out.mkdir(parents=True, exist_ok=True)
    df = optcnn_sweep(a.models, a.devices, a.per_gpu_batch, out, a.recompute, a.cluster, a.sync)
    df = df[df["devices"] > 1]
    tab = df.pivot_table(index=["model", "devices"], columns="algo", values="comm_bytes").reset_index()
    tab.columns.name = None
    gib = tab.copy()
    for s in OPTCNN_STRATEGIES:
        gib[s] = tab[s] / 2**30
    gib.to_csv(out / "fig8.csv", index=False)
    t1 = print_table(gib.to_dict("records"), ["model", "devices", *OPTCNN_STRATEGIES],
                     title="OptCNN Fig. 8: GiB moved per step (simulated: transfers + all-reduce wire bytes)")
    lw, owt = tab["optcnn"], tab["owt"]
    dpmp = tab[["data_parallel", "model_parallel"]]
    ratios = [
        {"reduction": "layer-wise vs DP and MP", "ours": _range(pd.concat([dpmp["data_parallel"] / lw, dpmp["model_parallel"] / lw])),
         "paper": PAPER["layer-wise vs DP and MP"]},
        {"reduction": "OWT vs DP and MP", "ours": _range(pd.concat([dpmp["data_parallel"] / owt, dpmp["model_parallel"] / owt])),
         "paper": PAPER["OWT vs DP and MP"]},
        {"reduction": "layer-wise vs OWT", "ours": _range(owt / lw), "paper": PAPER["layer-wise vs OWT"]},
    ]
    t2 = print_table(ratios, ["reduction", "ours", "paper"], title="communication reductions, ours beside the paper's")
    style()
    import matplotlib.pyplot as plt

    models = list(gib["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        d = gib[gib["model"] == m]
        x = np.arange(len(d))
        w = 0.2
        for i, s in enumerate(OPTCNN_STRATEGIES):
            ax.bar(x + (i - 1.5) * w, d[s], w, label=STRATEGY_LABEL[s], hatch=HATCHES[i], edgecolor="black")
        ax.set_xticks(x, [str(int(n)) for n in d["devices"]])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("GiB per step")
        ax.set_title(m)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("OptCNN Fig. 8 (ours, simulated): data transferred per step")
    fig.tight_layout()
    fig.savefig(out / "fig8.png")
    plt.close(fig)
    cmd = "python -m experiments optcnn_fig8" + (" --quick" if a.quick else "")
    write_readme(out, "OptCNN (Jia et al., ICML 2018): our results beside the paper's", [(
        "Figure 8: bytes moved per step (fig8.csv, fig8.png)",
        f"`{cmd}` (same runs as Figure 7, cached in layerwise_runs.csv)\n\n```\n{t1}\n\n{t2}\n```",
    )])
    print(f"wrote {out / 'fig8.csv'} and {out / 'fig8.png'}")
    return 0
