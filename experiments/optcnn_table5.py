"""OptCNN Table 5: the optimal strategy (under Eq. 1) for VGG-16 on 4 GPUs of one node."""

from __future__ import annotations

import json

import pandas as pd

from experiments._layerwise import problem, run, write_readme
from experiments.common import experiment_args, output_dir, print_table, style

#: OptCNN Table 5. Our reading of its OCR'd rows: the first four blocks {n=4}, the last block
#: {n=1, h=2, w=2} (the text: "parallelism in both the height and width dimensions to
#: accelerate the last three convolutional layers"), then FC {c=4}, FC {c=4}, FC {c=2}, softmax {1}.
PAPER = [
    ("2 x Conv + Pooling", "{n=4, h=1, w=1, c=1}"),
    ("2 x Conv + Pooling", "{n=4, h=1, w=1, c=1}"),
    ("3 x Conv + Pooling", "{n=4, h=1, w=1, c=1}"),
    ("3 x Conv + Pooling", "{n=4, h=1, w=1, c=1}"),
    ("3 x Conv + Pooling", "{n=1, h=2, w=2, c=1}"),
    ("Fully-connected", "{n=1, c=4}"),
    ("Fully-connected", "{n=1, c=4}"),
    ("Fully-connected", "{n=1, c=2}"),
    ("Softmax", "{n=1, c=1}"),
]
SHORT = {"sample": "n", "height": "h", "width": "w", "channel": "c", "length": "l"}


def fmt(cfg: dict[str, int], conv: bool) -> str:
    keys = ("sample", "height", "width", "channel") if conv else ("sample", "channel")
    return "{" + ", ".join(f"{SHORT[k]}={cfg.get(k, 1)}" for k in keys) + "}"


def vgg_blocks(names: list[str], kinds: list[str], configs: list[dict[str, int]]) -> list[dict[str, str]]:
    """Group VGG-16's layers as Table 5 does: conv blocks ending at a pool, then each FC layer."""
    rows, convs, cfgs = [], 0, []
    for name, kind, cfg in zip(names, kinds, configs):
        if kind == "conv2d":
            convs += 1
            cfgs.append(fmt(cfg, True))
        elif kind == "pool2d":
            cfgs.append(fmt(cfg, True))
            uniq = list(dict.fromkeys(cfgs))
            rows.append({"layers": f"{convs} x Conv + Pooling", "configuration": " / ".join(uniq)})
            convs, cfgs = 0, []
        elif kind == "linear":
            rows.append({"layers": "Fully-connected", "configuration": fmt(cfg, False)})
    rows.append({"layers": "Softmax", "configuration": "n/a: our layer graph ends at the logits (the loss is not a layer)"})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("optcnn_table5", __doc__, "optcnn", quick="batch 2 per GPU")
    ap.add_argument("--model", default="vgg16")
    ap.add_argument("--cluster", default="p100x4", help="4 GPUs of one node")
    ap.add_argument("--per-gpu-batch", type=int, default=None, help="default 32 (--quick 2)")
    ap.add_argument("--sync", default="ps", choices=["ps", "ring"], help="t_S: parameter server (OptCNN) or ring all-reduce")
    a = ap.parse_args(argv)
    if a.per_gpu_batch is None:
        a.per_gpu_batch = 2 if a.quick else 32
    out = output_dir(a)
    from algorithms.optcnn import OptCNN

    pb = problem(a.model, a.cluster, batch=a.per_gpu_batch * 4, extra=[f"costs.sync={a.sync}"])
    row = run(OptCNN(), pb)
    plan = row.pop("_plan")
    g = pb.graph
    configs = []
    for v in range(g.num_nodes):
        c = plan.strategy.config_of(v)
        configs.append(dict(c.dims) if c is not None else {})
    per_layer = pd.DataFrame({"layer": g.names, "kind": g.kinds, "config": [json.dumps(c) for c in configs]})
    per_layer.to_csv(out / "table5_layers.csv", index=False)
    rows = vgg_blocks(g.names, g.kinds, configs)
    for i, r in enumerate(rows):
        r["paper layers"], r["paper configuration"] = PAPER[i] if i < len(PAPER) else ("n/a", "n/a")
    pd.DataFrame(rows).to_csv(out / "table5.csv", index=False)
    text = print_table(rows, ["layers", "configuration", "paper layers", "paper configuration"],
                       title=f"OptCNN Table 5: optimal strategy for {a.model} on 4 GPUs ({a.cluster}, batch {pb.batch}, t_S {a.sync}); "
                             f"Eq. 1 {row['objective_s'] * 1e3:.2f} ms, simulated {row['step_time_s'] * 1e3:.2f} ms")
    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.4 + 0.32 * len(rows)))
    ax.axis("off")
    cells = [[r["layers"], r["configuration"].split(":")[0], r["paper configuration"]] for r in rows]
    tbl = ax.table(cellText=cells, colLabels=["layers", "ours", "paper"], loc="center", cellLoc="left",
                   colWidths=[0.16, 0.6, 0.24])
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(7)
    tbl.scale(1, 1.2)
    ax.set_title(f"OptCNN Table 5: {a.model} on 4 GPUs (ours vs paper)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "table5.png")
    plt.close(fig)
    cmd = "python -m experiments optcnn_table5" + (" --quick" if a.quick else "")
    write_readme(out, "OptCNN (Jia et al., ICML 2018): our results beside the paper's", [(
        "Table 5: the VGG-16 strategy on 4 GPUs (table5.csv, table5_layers.csv, table5.png)",
        f"`{cmd}`. The paper's column is our reading of its OCR'd table (see the module docstring); "
        f"a block lists each distinct configuration of its conv and pool layers.\n\n```\n{text}\n```",
    )])
    print(f"wrote {out / 'table5.csv'} and {out / 'table5.png'}")
    return 0
