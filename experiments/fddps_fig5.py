"""FD-DPS Figure 5: strategy search time on 8 devices (FastT, MP-DPS, D-DPS(-F), FD-DPS).

Search time is the wall-clock time of ``Algorithm.plan`` (splitting included), with the
process CPU time beside it (the machine is shared: CPU time is the steadier figure).  The
paper's seconds are for its 4k-83k-op TensorFlow graphs and its (unpublished) code; ours
are for our smaller PyTorch graphs (see Table 3) and Python implementations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from experiments._fddps import (
    CLUSTER, FIG5_ALGOS, LABELS, PAPER_FIG5, PAPER_FIG5_UNASSIGNED, cli, markdown_table, models_to_run,
    paper_batch, run_grid, write_section,
)
from experiments.common import output_dir, print_table, style


def main(argv: list[str] | None = None) -> int:
    ap = cli("fddps_fig5", __doc__)
    ap.add_argument("--devices", type=int, default=8)
    a = ap.parse_args(argv)
    out = output_dir(a)
    models = models_to_run(a)
    runs = run_grid(models, FIG5_ALGOS, CLUSTER, a.devices, a.quick, "figure 5")
    pd.DataFrame(runs).to_csv(out / "fig5.csv", index=False)

    rows = []
    for model, batch in models:
        row: dict[str, Any] = {"model": f"{model} ({batch})", "ops": runs.get(model, "fddps")["plan_nodes"]}
        for n in FIG5_ALGOS:
            r = runs.get(model, n)
            row[LABELS[n]] = f"{r['search_s']:.2f} ({r['search_cpu_s']:.2f})"
        paper = PAPER_FIG5.get(model, {}) if paper_batch(model, batch) else {}
        for n in FIG5_ALGOS:
            row[f"paper {LABELS[n]}"] = paper.get(n, "-")
        rows.append(row)
    cols = list(rows[0].keys()) if rows else []
    print_table(rows, cols, title=f"FD-DPS Fig. 5: search time on {a.devices} devices, wall s (CPU s); 'paper' = the paper's")

    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(models) + 2, 3.4))
    x = np.arange(len(models))
    width = 0.8 / len(FIG5_ALGOS)
    for i, n in enumerate(FIG5_ALGOS):
        vals = [runs.get(m, n)["search_cpu_s"] for m, _ in models]
        ax.bar(x + (i - (len(FIG5_ALGOS) - 1) / 2) * width, vals, width, label=LABELS[n], edgecolor="black", hatch=["", "//", "..", "xx"][i])
    ax.set_xticks(x, [f"{m}\n({b})" for m, b in models], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("search time, CPU s")
    ax.set_title(f"FD-DPS Fig. 5 (ours): search time on {a.devices} devices")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fig5.png")
    cmd = "python -m experiments fddps_fig5" + (" --quick" if a.quick else "")
    cpu = {n: np.array([runs.get(m, n)["search_cpu_s"] for m, _ in models]) for n in FIG5_ALGOS}
    claim = (f"The paper's ordering (MP-DPS cheapest; D-DPS(-F) a little cheaper than FD-DPS): MP-DPS is the cheapest of the "
             f"four on {int(sum(cpu['mp_dps'] <= np.min([cpu[n] for n in FIG5_ALGOS], axis=0)))} of {len(models)} models; "
             f"D-DPS(-F) is cheaper than FD-DPS on {int((cpu['dddps_f'] < cpu['fddps']).sum())} of {len(models)}; "
             f"FD-DPS is cheaper than FastT on {int((cpu['fddps'] < cpu['fastt']).sum())} of {len(models)}.")
    md = ["## Figure 5: search time, 8 devices\n", f"Command: `{cmd}` -> `fig5.csv`, `fig5.png`. Cells: wall seconds "
          "(CPU seconds); the machine was shared, so CPU time is the steadier figure.\n", markdown_table(rows, cols), "", claim,
          "Paper values are derived from the text's differences and the legible bar labels (PnasNet: FastT - FD-DPS = "
          "185.8 s; NasNet: FD-DPS - MP-DPS = 117.3 s, FD-DPS - D-DPS(-F) = 21.8 s); other legible labels, not assignable: "
          f"{', '.join(str(v) for v in PAPER_FIG5_UNASSIGNED)}."]
    write_section(out, "fig5", "\n".join(md))
    print(claim)
    print(f"wrote {out / 'fig5.csv'} and {out / 'fig5.png'}")
    return 0
