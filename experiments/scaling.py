"""Search time against graph size for every algorithm, and simulator throughput (log-log).

Two families of graphs on ``p100x8``: seeded ``synthetic`` DAGs of growing size (operator
placement algorithms; a synthetic graph has no layer graph) and the zoo models at their
batch sizes (every algorithm, layer-graph ones on the model's layer graph).  Each point is
one ``harness.run`` job in a worker process with a time limit; on the synthetic ladder an
algorithm stops climbing once a size took more than a third of the limit (the next size is
about three times larger), and the skipped sizes say so.  Every job also times the event
simulator, which gives the throughput plot (tasks simulated per second against tasks).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._grid import Job, run_jobs
from experiments.common import (
    algo_overrides, algorithms, experiment_args, model_overrides, models_of, output_dir, series_style, style, zoo_models,
)
from harness.compose import compose

SIZES = [300, 1000, 3000, 10000, 30000, 100000]
QUICK_SIZES = [100, 300, 1000]
QUICK_ZOO = ["lenet5", "alexnet"]
CLUSTER = "p100x8"


def run_point(overrides: Sequence[str]) -> dict[str, Any]:
    from harness.run import run

    r = run(compose([*overrides, "output.worth=false"])).row
    tasks = int(sum(r["num_tasks"].values()))
    return {"nodes": r["graph_nodes"], "plan_nodes": r["plan_nodes"], "search_s": r["search_seconds"],
            "simulate_s": r["simulate_seconds"], "tasks": tasks, "tasks_per_s": tasks / max(r["simulate_seconds"], 1e-12),
            "step_time_s": r["step_time_s"], "search_complete": r.get("search_complete", True)}


def _is_layer(algo: str) -> bool:
    from harness.run import build

    cfg = compose(["model=lenet5", *algo_overrides(algo)])
    return getattr(build(cfg)[3], "graph_kind", "op") == "layer"


def plot(df: pd.DataFrame, out: Path) -> None:
    style()
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    index = {a: i for i, a in enumerate(sorted(ok["algo"].unique()))}  # one look per algorithm in both panels
    for ax, family in zip(axes, ("synthetic", "zoo")):
        sub = ok[ok["family"] == family]
        for algo, g in sorted(sub.groupby("algo"), key=lambda x: x[0]):
            g = g.sort_values("nodes")
            look = series_style(index[algo])
            if family == "zoo":
                look["linestyle"] = "none"
            ax.plot(g["nodes"], g["search_s"].clip(lower=1e-5), label=algo, linewidth=1, markersize=4, **look)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("graph nodes")
        ax.set_title(f"{family} graphs on {CLUSTER}")
    axes[0].set_ylabel("search time (s)")
    axes[1].legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "search_time.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(ok["tasks"], ok["tasks_per_s"], linestyle="none", marker="o", markersize=3, color="#1b1b1b")
    ax.axhline(300_000, color="black", linestyle=":", linewidth=1, label="goal: 300k tasks/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tasks in the simulated step")
    ax.set_ylabel("tasks simulated per second (expansion included)")
    ax.set_title("event simulator throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "simulator_throughput.png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("scaling", __doc__.splitlines()[0], "scaling", quick="small sizes, two zoo models, short limits",
                         models="every zoo model")
    ap.add_argument("--sizes", nargs="*", type=int, default=None)
    ap.add_argument("--algos", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per point (default 300, quick 30)")
    ap.add_argument("--workers", type=int, default=2)
    args = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(args)
    sizes = a.sizes or (QUICK_SIZES if a.quick else SIZES)
    zoo = models_of(a, zoo_models(), QUICK_ZOO)
    algos = a.algos or algorithms()
    timeout = a.timeout or (30.0 if a.quick else 300.0)
    out = output_dir(a)
    base = [f"cluster={CLUSTER}", "output.trace=false", "output.gantt=false"]
    rows: list[dict[str, Any]] = []

    op_algos = [x for x in algos if not _is_layer(x)]
    alive = list(op_algos)
    for n in sizes:
        jobs = [Job((("family", "synthetic"), ("algo", x), ("size", str(n))),
                    tuple([f"model=synthetic", f"model.nodes={n}", *base, *algo_overrides(x)])) for x in alive]
        got = run_jobs(jobs, run_point, timeout, workers=a.workers, desc=f"synthetic {n}")
        rows += got
        slow = {r["algo"] for r in got if r["status"] != "ok" or r["search_s"] > timeout / 3}
        for x in sorted(slow):
            later = [m for m in sizes if m > n]
            rows += [{"family": "synthetic", "algo": x, "size": str(m), "status": "skipped",
                      "error": f"not run: size {n} took more than a third of the {timeout:g} s limit"} for m in later]
        alive = [x for x in alive if x not in slow]
    for m, b in zoo:  # capture once in the parent; forked workers reuse it
        from harness.run import build

        cfg = compose([*model_overrides(m, b), *base])
        src = build(cfg)[0]
        src.op_graph(**cfg.graph)
        try:
            src.layer_graph()
        except Exception:  # noqa: BLE001 - the layer cells will report the error
            pass
    jobs = [Job((("family", "zoo"), ("algo", x), ("size", m if b is None else f"{m}:{b}")),
                tuple([*model_overrides(m, b), *base, *algo_overrides(x)]))
            for m, b in zoo for x in algos]
    rows += run_jobs(jobs, run_point, timeout, workers=a.workers, desc="zoo")
    df = pd.DataFrame(rows)
    df.to_csv(out / "scaling.csv", index=False)
    (out / "scaling.json").write_text(json.dumps({"cluster": CLUSTER, "timeout_s": timeout, "rows": rows}, indent=1, default=str))
    plot(df, out)
    ok = df[df["status"] == "ok"]
    big = ok[ok["tasks"] >= 100_000]
    lines = [
        "# Scaling: search time against graph size, and simulator throughput",
        "",
        f"Command: `{shlex.join(['python', '-m', 'experiments', 'scaling', *args])}` -> `scaling.csv` / `scaling.json` (every point),",
        "`search_time.png` (log-log, synthetic ladder and zoo), `simulator_throughput.png`. Benchmark JSON of the",
        "speed goals (pytest-benchmark) sits beside them as `benchmarks_*.json`.",
        "",
        f"Cluster {CLUSTER}; limit {timeout:g} s per point; an algorithm leaves the synthetic ladder after a size that",
        "took more than a third of the limit.",
        "",
        "| algorithm | largest synthetic graph searched | its search time (s) |",
        "|---|---|---|",
    ]
    syn = ok[ok["family"] == "synthetic"]
    for algo, g in sorted(syn.groupby("algo"), key=lambda x: x[0]):
        top = g.sort_values("nodes").iloc[-1]
        lines.append(f"| {algo} | {int(top['nodes'])} | {top['search_s']:.3g} |")
    if len(big):
        lines += ["", f"Simulator throughput on steps of at least 100k tasks: median {np.median(big['tasks_per_s']):,.0f} tasks/s "
                      f"(min {big['tasks_per_s'].min():,.0f}) over {len(big)} jobs."]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
