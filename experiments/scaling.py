"""Search time against graph size for every algorithm, and simulator throughput (log-log).

Two families of graphs on ``p100x8``: seeded ``synthetic`` DAGs of growing size (operator
placement algorithms; a synthetic graph has no layer graph) and the zoo models at their
batch sizes (every algorithm, layer-graph ones on the model's layer graph).  Each point is
one ``harness.app.run`` job in a worker process with a time limit; on the synthetic ladder an
algorithm stops climbing once a size took more than a third of the limit (the next size is
about three times larger), and the skipped sizes say so.  Every job also times the event
simulator, which gives the throughput plot (tasks simulated per second against tasks).

``--before REV`` also runs every point on git revision REV, exported to a temporary
directory and run there as ``python -m harness`` (its result.json), each right after the
same point on this tree: before-and-after columns measured in the same run on the same
machine, the ladder of each version climbing on its own.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from experiments._grid import Job, run_jobs
from experiments.common import (
    REPO, algo_overrides, algorithms, experiment_args, model_overrides, models_of, output_dir, series_style, style, zoo_models,
)
from harness.app.compose import compose

SIZES = [300, 1000, 3000, 10000, 30000, 100000]
QUICK_SIZES = [100, 300, 1000]
QUICK_ZOO = ["lenet5", "alexnet"]
CLUSTER = "p100x8"


def run_point(overrides: Sequence[str]) -> dict[str, Any]:
    from harness.app.run import run

    return point_of(run(compose([*overrides, "output.worth=false"])).row)


def point_of(r: dict[str, Any]) -> dict[str, Any]:
    """A point's figures from a job's result row (``result.json``)."""
    tasks = int(sum(r["num_tasks"].values()))
    return {"nodes": r["graph_nodes"], "plan_nodes": r["plan_nodes"], "search_s": r["search_seconds"],
            "simulate_s": r["simulate_seconds"], "tasks": tasks, "tasks_per_s": tasks / max(r["simulate_seconds"], 1e-12),
            "step_time_s": r["step_time_s"], "search_complete": r.get("search_complete", True)}


def run_point_at(tree: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """:func:`run_point` on the source tree ``tree`` (another revision), as a ``python -m harness``
    job there: its figures from its result.json."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "harness", *overrides, "output.worth=false", f"hydra.run.dir={d}"]
        p = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
        if p.returncode:
            lines = (p.stderr or p.stdout).strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit code {p.returncode}")
        return point_of(json.loads((Path(d) / "result.json").read_text()))


def export_revision(rev: str, into: Path) -> Path:
    """The files of git revision ``rev`` of this repository, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True)
    if archive.returncode:
        raise SystemExit(f"scaling --before: git cannot export {rev!r}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def paired(jobs: list[Job], tree: Path | None) -> list[Job]:
    """Each job for this tree, followed (with ``--before``) by the same job on the other revision."""
    out = []
    for j in jobs:
        out.append(Job(j.key + (("version", "after"),), j.overrides))
        if tree is not None:
            out.append(Job(j.key + (("version", "before"),), j.overrides, partial(run_point_at, tree)))
    return out


def _is_layer(algo: str) -> bool:
    from harness.app.run import build

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
    ap.add_argument("--before", metavar="REV", default=None,
                    help="also run every point on git revision REV, right after this tree's (before-and-after columns)")
    args = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(args)
    sizes = a.sizes or (QUICK_SIZES if a.quick else SIZES)
    zoo = models_of(a, zoo_models(), QUICK_ZOO)
    algos = a.algos or algorithms()
    timeout = a.timeout or (30.0 if a.quick else 300.0)
    out = output_dir(a)
    base = [f"cluster={CLUSTER}", "output.trace=false", "output.gantt=false"]
    rows: list[dict[str, Any]] = []
    scratch = tempfile.TemporaryDirectory(prefix="scaling_before_") if a.before else None
    tree = export_revision(a.before, Path(scratch.name)) if scratch is not None else None
    versions = ["after"] + (["before"] if tree is not None else [])

    op_algos = [x for x in algos if not _is_layer(x)]
    alive = {v: list(op_algos) for v in versions}
    for n in sizes:
        jobs = [j for j in paired([Job((("family", "synthetic"), ("algo", x), ("size", str(n))),
                                       tuple(["model=synthetic", f"model.nodes={n}", *base, *algo_overrides(x)]))
                                   for x in op_algos], tree)
                if dict(j.key)["algo"] in alive[dict(j.key)["version"]]]
        got = run_jobs(jobs, run_point, timeout, workers=a.workers, desc=f"synthetic {n}")
        rows += got
        for v in versions:
            slow = {r["algo"] for r in got if r["version"] == v and (r["status"] != "ok" or r["search_s"] > timeout / 3)}
            for x in sorted(slow):
                rows += [{"family": "synthetic", "algo": x, "size": str(m), "version": v, "status": "skipped",
                          "error": f"not run: size {n} took more than a third of the {timeout:g} s limit"} for m in sizes if m > n]
            alive[v] = [x for x in alive[v] if x not in slow]
    for m, b in zoo:  # capture once in the parent; forked workers reuse it
        from harness.app.run import build

        cfg = compose([*model_overrides(m, b), *base])
        src = build(cfg)[0]
        src.op_graph(**cfg.graph)
        try:
            src.layer_graph()
        except Exception:  # noqa: BLE001 - the layer cells will report the error
            pass
    jobs = paired([Job((("family", "zoo"), ("algo", x), ("size", m if b is None else f"{m}:{b}")),
                       tuple([*model_overrides(m, b), *base, *algo_overrides(x)]))
                   for m, b in zoo for x in algos], tree)
    rows += run_jobs(jobs, run_point, timeout, workers=a.workers, desc="zoo")
    df = pd.DataFrame(rows)
    df.to_csv(out / "scaling.csv", index=False)
    (out / "scaling.json").write_text(json.dumps({"cluster": CLUSTER, "timeout_s": timeout, "before": a.before, "rows": rows},
                                                 indent=1, default=str))
    after = df[df["version"] == "after"]
    plot(after, out)
    lines = readme(df, timeout, shlex.join(["python", "-m", "experiments", "scaling", *args]), a.before)
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if scratch is not None:
        scratch.cleanup()
    return 0


def readme(df: pd.DataFrame, timeout: float, cmd: str, before: str | None) -> list[str]:
    """The README's lines: the largest synthetic graph each algorithm searched, the zoo's
    search times and the simulator's throughput, before and after where ``--before`` ran."""
    ok = df[df["status"] == "ok"]
    versions = ["after"] + (["before"] if before else [])
    lines = [
        "# Scaling: search time against graph size, and simulator throughput",
        "",
        f"Command: `{cmd}` -> `scaling.csv` / `scaling.json` (every point),",
        "`search_time.png` (log-log, synthetic ladder and zoo), `simulator_throughput.png`. Benchmark JSON of the",
        "speed goals (pytest-benchmark) sits beside them as `benchmarks_*.json`.",
        "",
        f"Cluster {CLUSTER}; limit {timeout:g} s per point; an algorithm leaves the synthetic ladder after a size that",
        "took more than a third of the limit.",
    ]
    if before:
        lines += ["", f"**after** is this tree, **before** git revision `{before}`, each point of before run right after the same",
                  "point of after, in the same run on the same machine (2 workers)."]
    head = " | ".join(f"largest synthetic graph ({v}) | its search time ({v}, s)" for v in versions)
    lines += ["", f"| algorithm | {head} |", "|---" * (1 + 2 * len(versions)) + "|"]
    syn = ok[ok["family"] == "synthetic"]
    for algo in sorted(syn["algo"].unique()):
        cells = []
        for v in versions:
            g = syn[(syn["algo"] == algo) & (syn["version"] == v)].sort_values("nodes")
            cells += [f"{int(g.iloc[-1]['nodes'])}", f"{g.iloc[-1]['search_s']:.3g}"] if len(g) else ["-", "-"]
        lines.append(f"| {algo} | {' | '.join(cells)} |")
    zoo = ok[ok["family"] == "zoo"]
    if before and len(zoo):
        both = zoo.pivot_table(index=["size", "algo"], columns="version", values=["search_s", "simulate_s"]).dropna()
        lines += ["", "Zoo models, median over the models each algorithm ran on in both versions (search and simulation seconds):", "",
                  "| algorithm | models | search before (s) | search after (s) | before / after | simulate before (s) | simulate after (s) |",
                  "|---|---|---|---|---|---|---|"]
        for algo, g in both.groupby(level="algo"):
            sb, sa = g[("search_s", "before")], g[("search_s", "after")]
            lines.append(f"| {algo} | {len(g)} | {sb.median():.3g} | {sa.median():.3g} | {(sb / sa.clip(lower=1e-9)).median():.3g}x | "
                         f"{g[('simulate_s', 'before')].median():.3g} | {g[('simulate_s', 'after')].median():.3g} |")
    big = ok[ok["tasks"] >= 100_000]
    for v in versions:
        b = big[big["version"] == v]
        if len(b):
            lines += ["", f"Simulator throughput ({v}) on steps of at least 100k tasks (expansion included): median "
                          f"{np.median(b['tasks_per_s']):,.0f} tasks/s (min {b['tasks_per_s'].min():,.0f}) over {len(b)} jobs."]
    return lines
