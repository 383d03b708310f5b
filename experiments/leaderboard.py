"""Every algorithm on every paper model and testbed, on one grid, under one cost model.

No paper compares all these systems under one cost model; this grid does.  Each cell is one
``harness.app.run`` job (the config ``python -m harness model=M cluster=C algo=A`` composes) in
a worker process with a time limit.  The cell's figure is the simulated step time over the
ideal ``W / D``: the graph's total compute on one device spread perfectly over the D
devices (splitting an operator never removes work).  Operator-graph algorithms and
layer-graph algorithms (OptCNN, PaSE and their baselines) see the step at different
granularities, costed op by op or layer by layer, so each is measured against the W of
the graph it was given; the stack planners (Megatron, FSDP, the hybrid search: a CNN's
layers in order as pipeline units) are costed layer by layer, against the layer graph's W.  Search time and OOM are reported beside it; a timeout or an error
is a cell with its reason, not a number.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._grid import Job, run_jobs
from experiments.common import (
    algo_overrides, algorithms, budget_overrides, experiment_args, model_overrides, models_of, output_dir, print_table, style,
)
from harness.app.compose import compose

#: the papers' models at their batch sizes (the conf/model defaults)
MODELS = ["lenet5", "alexnet", "vgg16", "inception_v3", "resnet50", "resnet200", "pnasnet_mobile", "nasnet_large",
          "tensor_holography", "transformer", "nmt", "rnnlm"]
#: the papers' testbeds: FD-DPS, Celeritas, OptCNN, and a modern one
CLUSTERS = ["p100x8", "v100x4_pcie", "p100x16_4nodes", "h100x8"]
QUICK_MODELS = ["lenet5", "alexnet:16", "resnet50:8"]
QUICK_CLUSTERS = ["p100x4", "v100x4_pcie"]


def run_cell(overrides: Sequence[str]) -> dict[str, Any]:
    """One job: the result row's figures plus the setting's bound W / D."""
    from harness.app.run import build, run

    cfg = compose([*overrides, "output.worth=false"])  # the cell has its own reference, W / D
    res = run(cfg)
    source, cluster, costs, algo, _ = build(cfg)
    if getattr(algo, "graph_kind", "op") in ("layer", "stack"):  # a CNN's stack units are runs of its layer graph
        fwd, bwd = costs.layer_times(source.layer_graph(), 0)
        work = float(fwd.sum() + bwd.sum())
    else:
        work = float(costs.node_times(source.op_graph(**cfg.graph), 0).sum())
    bound = work / cluster.num_devices
    r = res.row
    return {
        "batch": r["batch_size"], "devices": r["num_devices"], "step_time_s": r["step_time_s"], "bound_s": bound,
        "vs_bound": r["step_time_s"] / bound if bound > 0 else float("nan"), "lower_bound_s": r["lower_bound_s"],
        "plan_lower_bound_s": r["plan_lower_bound_s"],
        "search_s": r["search_seconds"], "oom": r["oom"], "comm_bytes": r["comm_bytes"],
        "search_complete": r.get("search_complete", True), "graph_nodes": r["graph_nodes"],
    }


def _capture_all(models: Sequence[tuple[str, int | None]], clusters: Sequence[str]) -> None:
    """Capture every graph once in the parent so forked workers find them in memory."""
    from tqdm import tqdm

    from harness.app.run import build

    for m, b in tqdm(models, desc="capturing", unit="model"):
        cfg = compose(model_overrides(m, b) + [f"cluster={clusters[0]}"])
        source = build(cfg)[0]
        source.op_graph(**cfg.graph)
        if hasattr(source, "layer_graph"):
            try:
                source.layer_graph()
            except Exception:  # noqa: BLE001 - a model the layer tracer cannot take: its layer cells say why
                pass


#: how a cell without a ratio is painted (face colour, hatch), never a shade of the scale
NO_RATIO = {"OOM": ("#f2c14e", "////"), "T": ("#9ecae1", "...."), "E": ("#f4a6a6", "xxxx")}
LEGEND = {"OOM": "OOM: does not fit in memory", "T": "T: timeout", "E": "E: error"}


def heatmap(df: pd.DataFrame, path: Path) -> None:
    """Rows: model @ cluster; columns: algorithms; shade: log2(step / bound); text: the ratio or OOM/T/E."""
    style()
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    rows = sorted({(r.model, r.cluster) for r in df.itertuples()}, key=lambda x: (x[1], x[0]))
    cols = sorted(df["algo"].unique())
    val = np.full((len(rows), len(cols)), np.nan)
    txt = [["" for _ in cols] for _ in rows]
    for r in df.itertuples():
        i, j = rows.index((r.model, r.cluster)), cols.index(r.algo)
        if r.status != "ok":
            txt[i][j] = {"timeout": "T", "error": "E"}.get(r.status, "?")
        elif bool(r.oom):
            txt[i][j] = "OOM"
        else:
            val[i][j] = np.log2(r.vs_bound)
            txt[i][j] = f"{r.vs_bound:.1f}" if r.vs_bound < 100 else f"{r.vs_bound:.0f}"
    fig, ax = plt.subplots(figsize=(max(7.0, 2.5 + 0.55 * len(cols)), 1.6 + 0.3 * len(rows)))
    im = ax.imshow(val, cmap="Greys", aspect="auto", vmin=0, vmax=np.nanmax(val) if np.isfinite(val).any() else 1)
    # cells without a ratio are painted apart from the scale, whose best end is white
    for i in range(len(rows)):
        for j in range(len(cols)):
            if txt[i][j] in NO_RATIO:
                face, hatch = NO_RATIO[txt[i][j]]
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=face, hatch=hatch, edgecolor="#7a5a00", linewidth=0))
    for i in range(len(rows)):
        for j in range(len(cols)):
            shade = val[i][j]
            dark = np.isfinite(shade) and shade > 0.6 * (np.nanmax(val) if np.isfinite(val).any() else 1)
            ax.text(j, i, txt[i][j], ha="center", va="center", fontsize=6, color="white" if dark else "black")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{m} @ {c}" for m, c in rows], fontsize=7)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="log2(step time / (W / D))", shrink=0.6)
    shown = {t for line in txt for t in line} & set(NO_RATIO)
    if shown:
        ax.legend(handles=[Patch(facecolor=NO_RATIO[t][0], hatch=NO_RATIO[t][1], edgecolor="#7a5a00", label=LEGEND[t])
                           for t in NO_RATIO if t in shown],
                  loc="upper left", bbox_to_anchor=(1.0, -0.02), fontsize=7, frameon=False)
    ax.set_title("step time / ideal W/D (lower is better, white = best); OOM; T: timeout; E: error", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def best_per_setting(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[(df["status"] == "ok") & (~df["oom"].astype(bool))]
    if ok.empty:
        return pd.DataFrame(columns=["model", "cluster", "best", "step_time_s", "vs_bound", "runner_up"])
    out = []
    for (m, c), grp in ok.groupby(["model", "cluster"], sort=True):
        g = grp.sort_values(["step_time_s", "algo"])
        out.append({"model": m, "cluster": c, "best": g.iloc[0]["algo"], "step_time_s": g.iloc[0]["step_time_s"],
                    "vs_bound": g.iloc[0]["vs_bound"], "runner_up": g.iloc[1]["algo"] if len(g) > 1 else ""})
    return pd.DataFrame(out)


def write_readme(df: pd.DataFrame, best: pd.DataFrame, out: Path, cmd: str) -> None:
    counts = best["best"].value_counts()
    lines = [
        "# Leaderboard: every algorithm, every paper model and testbed, one cost model",
        "",
        f"Command: `{cmd}` -> `leaderboard.csv` (every cell), `best.csv`, `heatmap.png`.",
        "",
        "Each cell is a `python -m harness model=M cluster=C algo=A` job (calibrated costs, the default; the event simulator).",
        "The figure is the simulated step time over the ideal `W / D` (the graph's total compute on one device spread",
        "perfectly over its devices; layer-graph algorithms (OptCNN, PaSE, MP, OWT, MCMC) and the stack planners",
        "(megatron, fsdp, hybrid_search: the layers in order as pipeline units, costed layer by layer) are measured",
        "against the layer graph's W, operator placements against the op graph's); OOM is a plan that does not fit device memory",
        "in the simulator; T is a job that exceeded the time limit, E one that failed (`leaderboard.csv` has the",
        "message). Costing a step layer by layer leaves out the per-kernel launch overheads of the op graph, so",
        "compare layer-graph algorithms and stack planners with `data_parallel@layer` (data parallelism costed the same way) and",
        "operator placements with `data_parallel`.",
        "",
        "## Best algorithm per setting (fastest simulated step that fits in memory)",
        "",
        "| model | cluster | best | step (s) | x W/D | runner-up |",
        "|---|---|---|---|---|---|",
    ]
    for r in best.itertuples():
        lines.append(f"| {r.model} | {r.cluster} | {r.best} | {r.step_time_s:.4g} | {r.vs_bound:.2f} | {r.runner_up} |")
    lines += ["", "Wins per algorithm: " + ", ".join(f"{a} {n}" for a, n in counts.items()) + ".", ""]
    settings = {(r.model, r.cluster) for r in df.itertuples()}
    no_fit = sorted(settings - {(r.model, r.cluster) for r in best.itertuples()})
    if no_fit:
        lines += ["No algorithm found a plan that fits in memory (every cell OOM, timeout or error) for: "
                  + ", ".join(f"{m} @ {c}" for m, c in no_fit) + ".", ""]
    status = df["status"].value_counts().to_dict()
    lines += [f"Cells: {len(df)} ({', '.join(f'{k} {v}' for k, v in status.items())}); OOM in {int(df['oom'].fillna(False).astype(bool).sum())}.", ""]
    lines += ["## Per algorithm", "",
              "Search time is the median over the cells it finished (wall seconds on the machine that ran the grid);",
              "x W/D is the median over its cells that fit in memory.", "",
              "| algorithm | cells | fits | OOM | timeout | error | wins | median x W/D | median search (s) | max search (s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for alg, g in df.groupby("algo", sort=True):
        ok = g[g["status"] == "ok"]
        fit = ok[~ok["oom"].astype(bool)]
        search = ok["search_s"] if "search_s" in ok else pd.Series(dtype=float)
        med_b = f"{fit['vs_bound'].median():.2f}" if len(fit) else "n/a"
        med_s = f"{search.median():.3g}" if len(search.dropna()) else "n/a"
        max_s = f"{search.max():.3g}" if len(search.dropna()) else "n/a"
        lines.append(f"| {alg} | {len(g)} | {len(fit)} | {int(ok['oom'].astype(bool).sum())} | {int((g['status'] == 'timeout').sum())} | "
                     f"{int((g['status'] == 'error').sum())} | {int(counts.get(alg, 0))} | {med_b} | {med_s} | {max_s} |")
    lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def _complete(df: pd.DataFrame) -> pd.DataFrame:
    """The figure columns present even when no cell succeeded, OOM as a bool."""
    for col in ("oom", "vs_bound", "step_time_s"):
        if col not in df:
            df[col] = np.nan
    df["oom"] = df["oom"].fillna(False).astype(bool)
    return df


def render(df: pd.DataFrame, out: Path, cmd: str) -> pd.DataFrame:
    """best.csv, heatmap.png and README.md from the grid's table; returns the best per setting."""
    df = _complete(df)
    best = best_per_setting(df)
    best.to_csv(out / "best.csv", index=False)
    heatmap(df, out / "heatmap.png")
    write_readme(df, best, out, cmd)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("leaderboard", __doc__.splitlines()[0], "leaderboard", quick="three small models, two clusters, short limits",
                         models="the papers' models")
    ap.add_argument("--clusters", nargs="*", default=None)
    ap.add_argument("--algos", nargs="*", default=None, help="default: every conf/algo file")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per cell (default 600, quick 60)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--from-csv", default=None, metavar="CSV",
                    help="no runs: redraw best.csv, heatmap.png and README.md from a leaderboard.csv (--command: how it was made)")
    ap.add_argument("--command", default=None, help="with --from-csv: the command that produced the CSV, for the README")
    args = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(args)
    if a.from_csv:
        if not Path(a.from_csv).is_file():
            print(f"error: --from-csv {a.from_csv} is not a file: give a leaderboard.csv", file=sys.stderr)
            return 1
        out = Path(a.out) if a.out else Path(a.from_csv).parent
        out.mkdir(parents=True, exist_ok=True)
        best = render(pd.read_csv(a.from_csv), out, a.command or "python -m experiments leaderboard")
        print(f"wrote {out}/best.csv, heatmap.png, README.md ({len(best)} settings)")
        return 0
    models = models_of(a, MODELS, QUICK_MODELS)
    clusters = a.clusters or (QUICK_CLUSTERS if a.quick else CLUSTERS)
    algos = a.algos or algorithms()
    timeout = a.timeout or (60.0 if a.quick else 600.0)
    out = output_dir(a)
    _capture_all(models, clusters)
    # a search with a budget stops at half the cell's limit with its best answer (search_complete:
    # false), leaving the rest for capture, cost tables and the simulation: no cell is a timeout
    budget = timeout / 2
    jobs = [
        Job((("model", m), ("cluster", c), ("algo", alg)),
            tuple(model_overrides(m, b) + [f"cluster={c}", *algo_overrides(alg), *budget_overrides(alg, budget),
                                           "output.trace=false", "output.gantt=false"]))
        for m, b in models for c in clusters for alg in algos
    ]
    rows = run_jobs(jobs, run_cell, timeout, workers=a.workers, desc="leaderboard")
    df = _complete(pd.DataFrame(rows))
    df.to_csv(out / "leaderboard.csv", index=False)  # before drawing: nothing measured is lost
    best = render(df, out, shlex.join(["python", "-m", "experiments", "leaderboard", *args]))
    print_table(best.to_dict("records"), ["model", "cluster", "best", "step_time_s", "vs_bound", "runner_up"], title="best per setting")
    print(f"wrote {out}/leaderboard.csv, best.csv, heatmap.png, README.md")
    return 0
