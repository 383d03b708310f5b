"""Celeritas Table 4: placement generation time (seconds) of m-SCT, HRL, Order-Place and
Celeritas (plus the other placers), excluding Standard Evaluation and the final
measurement, as in the paper (Sec. 6.3).

Each heuristic is timed ``--repeats`` times (the median is reported) on this machine's
CPU.  HRL's time is its training wall time under the sample budget of the Table 3 run
(read from ``table3_runs.csv`` in the output dir; "n/a" if Table 3 has not been run); the
paper quotes 5 hours from Mars.  A synthetic graph as large as the paper's Transformer
(36,352 nodes, one timing) shows how the placers scale beyond our zoo's graphs; m-SCT's
LP gets a time limit there (``--lp-limit``), since random layered DAGs are far harder
for the LP than the zoo's graphs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from algorithms.celeritas import Celeritas
from algorithms.dfs_topo import DfsTopo
from algorithms.m_etf import METF
from algorithms.m_sct import MSCT
from algorithms.m_topo import MTopo
from algorithms.metis_place import Metis
from experiments._celeritas import PAPER_TABLE4, TABLE4_ALGOS, cli, load, models_to_run
from experiments.common import output_dir, print_table, style
from harness.app.compose import compose
from harness.app.run import build

EXTRA = ["m_etf", "metis", "m_topo", "dfs_topo"]


def heuristics() -> dict[str, Any]:
    return {
        "m_sct": MSCT(), "order_place": Celeritas(name="order_place", adjust=False), "celeritas": Celeritas(),
        "m_etf": METF(), "metis": Metis(), "m_topo": MTopo(), "dfs_topo": DfsTopo(),
    }


def time_plan(algo: Any, g: Any, cl: Any, costs: Any, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        algo.plan(g, cl, costs)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = cli("celeritas_table4", __doc__)
    ap.add_argument("--repeats", type=int, default=None, help="timings per cell (median; default 3, --quick 1)")
    ap.add_argument("--synthetic", type=int, nargs="*", default=None, help="sizes of synthetic graphs to add (default 36352; --quick 500)")
    ap.add_argument("--lp-limit", type=float, default=120.0, help="m-SCT's LP time limit on the synthetic graphs (seconds)")
    a = ap.parse_args(argv)
    out = output_dir(a)
    repeats = a.repeats or (1 if a.quick else 3)
    synth = a.synthetic if a.synthetic is not None else ([500] if a.quick else [36352])
    algos = heuristics()
    hrl_runs = pd.read_csv(out / "table3_runs.csv") if (out / "table3_runs.csv").exists() else None
    rows = []
    cases: list[tuple[str, int, Any, Any, Any]] = []
    for model, batch in models_to_run(a):
        _, g, cl, costs, _ = load(model, batch, a.cluster)
        cases.append((model, int(g.meta.get("batch_size", batch)), g, cl, costs))
    for n in synth:
        cfg = compose(["model=synthetic", f"model.nodes={n}", "model.ccr=10", f"cluster={a.cluster}"])
        src, cl, costs, _, _ = build(cfg)
        cases.append((f"synthetic_{n}", 0, src.op_graph(), cl, costs))
    for model, batch, g, cl, costs in cases:
        row: dict[str, Any] = {"model": model, "batch": batch, "nodes": g.num_nodes}
        for name in tqdm(TABLE4_ALGOS + EXTRA, desc=f"table 4 {model}", unit="algo"):
            if name == "hrl":
                hit = hrl_runs[(hrl_runs["model"] == model) & (hrl_runs["algo"] == "hrl")] if hrl_runs is not None else []
                if len(hit):
                    r = hit.iloc[0]
                    row["hrl"] = f"{r['hrl_wall_s']:.1f} ({int(r['hrl_samples'])} samples)"
                elif hrl_runs is None:
                    row["hrl"] = "n/a (run celeritas_table3 first)"
                else:
                    row["hrl"] = "n/a (not in Table 3)"
                continue
            algo = algos[name]
            if name == "m_sct" and model.startswith("synthetic"):
                # random layered DAGs make the favourite-child LP much harder than the zoo's graphs
                algo = MSCT(lp_time_limit_s=a.lp_limit)
            try:
                row[name] = time_plan(algo, g, cl, costs, 1 if model.startswith("synthetic") else repeats)
            except RuntimeError as e:
                row[name] = f"> {a.lp_limit:g} (LP time limit)" if "Time limit" in str(e) else f"failed: {e}"
        paper = PAPER_TABLE4.get(model)
        for n, v in zip(TABLE4_ALGOS, paper or [None] * 4):
            row[f"paper_{n}"] = ("- (OOM)" if v is None else (v if isinstance(v, str) else f"{v:g}")) if paper else "n/a"
        rows.append(row)
    df = pd.DataFrame(rows)
    df.to_csv(out / "table4.csv", index=False)
    print_table(rows, ["model", "nodes"] + TABLE4_ALGOS + EXTRA, title=f"Table 4 (ours): placement generation time in seconds (median of {repeats})")
    print()
    print_table(rows, ["model"] + [f"paper_{n}" for n in TABLE4_ALGOS], title="Table 4 (paper)")

    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(len(df))
    shown = ["m_sct", "order_place", "celeritas", "m_etf", "metis"]
    bw = 0.8 / len(shown)
    for i, n in enumerate(shown):
        vals = pd.to_numeric(df[n], errors="coerce")
        ax.bar(x + (i - len(shown) / 2 + 0.5) * bw, vals, bw, label=n, edgecolor="black")
    for j, m in enumerate(df["model"]):
        p = PAPER_TABLE4.get(m)
        if p:
            for i, n in enumerate(["m_sct", "order_place", "celeritas"]):
                v = p[TABLE4_ALGOS.index(n)]
                if isinstance(v, (int, float)):
                    ax.plot(j + (i - len(shown) / 2 + 0.5) * bw, v, marker="_", markersize=14, color="red", linestyle="none",
                            label="paper" if (j == 0 and i == 0) else None)
    ax.set_xticks(x, df["model"], rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("placement time (s)")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title("Celeritas Table 4: placement generation time (bars: ours; red ticks: paper)")
    fig.tight_layout()
    fig.savefig(out / "table4.png")
    print(f"wrote {out / 'table4.csv'} and {out / 'table4.png'}")
    return 0
