"""FD-DPS Table 7: MP-DPS vs D-DPS(-F) vs FD-DPS on 4 devices (what splitting adds).

"Speed" is the paper's: FD-DPS over D-DPS(-F), ``(D-DPS(-F) - FD-DPS) / D-DPS(-F)``.  The
split operators are those FD-DPS's Table-6 rule picked (our aten names mapped to the
paper's: convolution -> Conv2D, convolution_backward -> Conv2Dbp, mm / addmm / bmm -> Matmul).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from experiments._fddps import (
    CLUSTER, LABELS, PAPER_TABLE7, TABLE7_ALGOS, cli, fmt_time, markdown_table, models_to_run, paper_batch,
    run_grid, write_section,
)
from experiments.common import output_dir, print_table, style


def main(argv: list[str] | None = None) -> int:
    ap = cli("fddps_table7", __doc__)
    ap.add_argument("--devices", type=int, default=4)
    a = ap.parse_args(argv)
    out = output_dir(a)
    models = models_to_run(a)
    k = a.devices
    runs = run_grid(models, TABLE7_ALGOS, CLUSTER, k, a.quick, "table 7")
    pd.DataFrame(runs).to_csv(out / "table7.csv", index=False)

    rows = []
    better = total = 0
    for model, batch in models:
        d, f = runs.get(model, "dddps_f"), runs.get(model, "fddps")
        speed = None if (d["oom"] or f["oom"]) else 100.0 * (d["step_time_s"] - f["step_time_s"]) / d["step_time_s"]
        if speed is not None:
            total += 1
            better += speed > 0
        p = PAPER_TABLE7.get(model) if paper_batch(model, batch) else None
        rows.append({
            "model": f"{model} ({batch})", **{LABELS[n]: fmt_time(runs.get(model, n)) for n in TABLE7_ALGOS},
            "speed %": f"{speed:.1f}" if speed is not None else "n/a",
            "split": f"{f['split_kinds'] or 'none'} ({f['split_ops']} ops)",
            "paper MP-DPS": p[0] if p else "-", "paper D-DPS(-F)": p[1] if p else "-", "paper FD-DPS": p[2] if p else "-",
            "paper speed %": p[3] if p else "-", "paper split": p[4] if p else "-",
        })
    cols = list(rows[0].keys()) if rows else []
    print_table(rows, cols, title=f"FD-DPS Table 7: iteration time (s) on {k} devices ({CLUSTER}.subset({k})); 'paper' = the paper's")

    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(models) + 2, 3.4))
    x = np.arange(len(models))
    width = 0.8 / len(TABLE7_ALGOS)
    for i, name in enumerate(TABLE7_ALGOS):
        vals = [runs.get(m, name)["step_time_s"] for m, _ in models]
        ax.bar(x + (i - 1) * width, vals, width, label=LABELS[name], edgecolor="black", hatch=["", "//", ".."][i])
    ax.set_xticks(x, [f"{m}\n({b})" for m, b in models], fontsize=8)
    ax.set_ylabel("simulated iteration time (s)")
    ax.set_title(f"FD-DPS Table 7 (ours, {k} devices)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "table7.png")
    cmd = "python -m experiments fddps_table7" + (" --quick" if a.quick else "")
    claim = (f"The paper's claim that splitting helps (FD-DPS faster than D-DPS(-F) on every model): in our simulator on "
             f"{better} of {total} models.")
    md = ["## Table 7: what splitting adds, 4 devices\n", f"Command: `{cmd}` -> `table7.csv`, `table7.png`.\n",
          markdown_table(rows, cols), "", claim]
    write_section(out, "table7", "\n".join(md))
    print(claim)
    print(f"wrote {out / 'table7.csv'} and {out / 'table7.png'}")
    return 0
