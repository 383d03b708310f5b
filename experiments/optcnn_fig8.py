"""OptCNN Figure 8: bytes moved per training step under DP, MP, OWT and layer-wise parallelism."""

from __future__ import annotations


import numpy as np
import pandas as pd

from experiments._layerwise import OPTCNN_STRATEGIES, STRATEGY_LABEL, write_readme
from experiments.common import HATCHES, print_table, style
from experiments.optcnn_fig7 import sweep_from_argv

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
    df, out, a = sweep_from_argv("optcnn_fig8", __doc__, argv)
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
