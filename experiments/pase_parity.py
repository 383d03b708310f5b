"""PaSE parity: our PaSE search on PaSE's own four graphs under costs=pase, beside PaSE's public code.

PaSE's graphs (AlexNet, Inception-v3, RNNLM, Transformer; baidu-research/PaSE graph.py) are
rebuilt with the layer-graph builder (harness/core/zoo/pase_graphs.py). For each p we run our
vertex elimination (algo=pase) and report its optimum in PaSE's unit (FLOPs) and its search time.
PaSE's own figures come from running its ``scheduler.py``: with ``--pase-src DIR`` (a checkout of
its repository) and ``--pase-python`` (an interpreter with its requirements), this experiment runs
it for every point and records the results in ``pase_public_code.csv``; without, it reads that file
from the output directory (the committed one under results/pase_parity), and a point it lacks is
shown as not available.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from experiments._layerwise import problem, run, save_search_time_plot, write_readme
from experiments.common import experiment_args, output_dir, print_table, style

GRAPHS = ("alexnet", "inception3", "rnnlm", "transformer")
PS = (4, 8, 16, 32, 64)
QUICK_GRAPHS = ("alexnet", "rnnlm")
QUICK_PS = (4, 8)
PASE_CSV = "pase_public_code.csv"
#: relative difference of the optima that counts as the same optimum
REL = 1e-9


def _duration(text: str) -> float:
    """Seconds of a ``datetime.timedelta`` as PaSE prints it (``0:00:04.026119``)."""
    h, m, s = text.strip().split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def run_pase(src: Path, python: str, graph: str, p: int, timeout_s: float, log_dir: Path | None = None) -> dict[str, Any]:
    """One run of PaSE's ``scheduler.py -g graph -p p`` (its defaults otherwise): its printed
    optimum and processing time, and the wall time of the whole process; its output goes to
    ``log_dir/<graph>_p<p>.log``."""
    cmd = [python, "scheduler.py", "-g", graph, "-p", str(p)]
    row: dict[str, Any] = {"graph": graph, "p": p, "command": " ".join(["python", *cmd[1:]])}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**row, "total_cost": math.nan, "processing_s": math.nan, "wall_s": timeout_s,
                "status": f"timed out after {timeout_s:g} s"}
    row["wall_s"] = time.perf_counter() - t0
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{graph}_p{p}.log").write_text(f"$ {row['command']}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    cost = re.search(r"Total cost:\s*([0-9.eE+-]+)", proc.stdout)
    took = re.search(r"Processing time:\s*([0-9:.]+)", proc.stdout)
    if proc.returncode != 0 or cost is None or took is None:
        return {**row, "total_cost": math.nan, "processing_s": math.nan, "status": failure(proc.returncode, proc.stderr)}
    return {**row, "total_cost": float(cost.group(1)), "processing_s": _duration(took.group(1)), "status": "ok"}


def failure(returncode: int, stderr: str) -> str:
    """Why a PaSE run failed, in one line: the signal that ended it, or its exception's last line."""
    if returncode < 0:
        why = "the kernel's out-of-memory killer" if returncode == -9 else "a signal"
        return f"killed by signal {-returncode} ({why})"
    errors = [ln.strip() for ln in stderr.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b", ln.strip())]
    return f"failed (exit {returncode}): {(errors or ['no exception in its output'])[-1][:140]}"


def pase_environment(src: Path, python: str) -> dict[str, str]:
    """PaSE's commit and the versions its interpreter runs with, recorded beside its figures."""
    env: dict[str, str] = {"date": dt.date.today().isoformat()}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True)
    env["pase_commit"] = head.stdout.strip() if head.returncode == 0 else (src / "COMMIT").read_text().strip() \
        if (src / "COMMIT").exists() else "unknown"
    probe = ("import sys, numpy, pandas, networkx; "
             "print(sys.version.split()[0], numpy.__version__, pandas.__version__, networkx.__version__)")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if out.returncode == 0:
        env.update(zip(("python", "numpy", "pandas", "networkx"), out.stdout.split()))
    return env


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("pase_parity", __doc__, "pase_parity", quick="alexnet and rnnlm at p = 4, 8")
    ap.add_argument("--graphs", nargs="*", choices=GRAPHS, default=None, help="PaSE's graphs (default: all four)")
    ap.add_argument("--ps", nargs="*", type=int, default=None, help="processor counts (default 4 8 16 32 64; --quick 4 8)")
    ap.add_argument("--pase-src", type=Path, default=None, metavar="DIR",
                    help="a checkout of baidu-research/PaSE: run its scheduler.py for every point")
    ap.add_argument("--pase-python", default=sys.executable, help="the interpreter that runs PaSE (its requirements installed)")
    ap.add_argument("--pase-timeout", type=float, default=3600.0, help="time limit of one PaSE run (s)")
    a = ap.parse_args(argv)
    graphs = a.graphs or list(QUICK_GRAPHS if a.quick else GRAPHS)
    ps = a.ps or list(QUICK_PS if a.quick else PS)
    out = output_dir(a)
    if a.pase_src is not None and not (a.pase_src / "scheduler.py").exists():
        print(f"--pase-src {a.pase_src}: no scheduler.py there; give a checkout of baidu-research/PaSE", file=sys.stderr)
        return 2
    from algorithms.pase import PaSE

    points = [(g, p) for g in graphs for p in ps]
    ours: list[dict[str, Any]] = []
    for g, p in tqdm(points, desc="our PaSE search", unit="point"):
        pb = problem(f"pase_{g}", "parametric", costs="pase", extra=[f"cluster.gpus={p}"])
        r = run(PaSE(budget_s=None), pb, simulate_it=False)
        r.pop("_plan")
        ours.append({"graph": g, "p": p, "layers": pb.graph.num_nodes, "ours_flops": r["objective_s"] * pb.costs.peak_flops,
                     "ours_search_s": r["search_s"], "ours_tables_s": r["tables_s"], "largest_table": r["largest_table"]})

    pase_path = out / PASE_CSV
    if a.pase_src is not None:
        env = pase_environment(a.pase_src, a.pase_python)
        rows = []
        for g, p in tqdm(points, desc="PaSE's public code", unit="point"):
            rows.append({**run_pase(a.pase_src, a.pase_python, g, p, a.pase_timeout, out / "pase_logs"), **env})
        old = pd.read_csv(pase_path) if pase_path.exists() else pd.DataFrame()
        new = pd.DataFrame(rows)
        if len(old):
            keep = ~old.set_index(["graph", "p"]).index.isin(new.set_index(["graph", "p"]).index)
            new = pd.concat([old[keep], new], ignore_index=True)
        new.sort_values(["graph", "p"]).to_csv(pase_path, index=False)
    pase = pd.read_csv(pase_path).set_index(["graph", "p"]) if pase_path.exists() else pd.DataFrame()

    rows = []
    for r in ours:
        key = (r["graph"], r["p"])
        ref = pase.loc[key] if len(pase) and key in pase.index else None
        flops = float(ref["total_cost"]) if ref is not None else math.nan
        rel = abs(r["ours_flops"] / flops - 1.0) if flops == flops else math.nan
        status = "n/a (PaSE not run at this point)" if ref is None else str(ref["status"])
        rows.append({**r, "pase_flops": flops, "pase_processing_s": float(ref["processing_s"]) if ref is not None else math.nan,
                     "pase_wall_s": float(ref["wall_s"]) if ref is not None else math.nan, "rel_diff": rel,
                     "same optimum": ("yes" if rel <= REL else "NO") if rel == rel else status,
                     "speed-up": (float(ref["processing_s"]) / r["ours_search_s"]) if ref is not None and r["ours_search_s"] > 0 else math.nan})
    df = pd.DataFrame(rows)
    df.to_csv(out / "parity.csv", index=False)
    shown = [{**r, "ours_flops": f"{r['ours_flops']:.6e}", "pase_flops": f"{r['pase_flops']:.6e}",
              "rel_diff": f"{r['rel_diff']:.1e}", "ours_search_s": f"{r['ours_search_s']:.3g}",
              "ours_tables_s": f"{r['ours_tables_s']:.3g}", "pase_processing_s": f"{r['pase_processing_s']:.3g}",
              "speed-up": f"{r['speed-up']:.0f}x"} for r in rows]
    text = print_table(shown, ["graph", "p", "layers", "ours_flops", "pase_flops", "rel_diff", "same optimum", "ours_search_s",
                               "ours_tables_s", "pase_processing_s", "speed-up"],
                       title="PaSE's graphs under costs=pase: our optimum and search beside PaSE's public code")
    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for g in graphs:
        d = df[df["graph"] == g]
        line, = ax.plot(d["p"], d["ours_search_s"] + d["ours_tables_s"], marker="o", label=f"{g} ours (tables + search)")
        ax.plot(d["p"], d["pase_processing_s"], marker="x", linestyle="--", color=line.get_color(), label=f"{g} PaSE's code")
    save_search_time_plot(fig, ax, "Same optimum, search time: ours vs PaSE's public code", out / "search_time.png")
    same = int((df["same optimum"] == "yes").sum())
    env_line = ""
    if len(pase):
        first = pase.iloc[0]
        env_line = (f" PaSE's code: commit {first.get('pase_commit', '?')}, run {first.get('date', '?')} with Python "
                    f"{first.get('python', '?')}, numpy {first.get('numpy', '?')}, pandas {first.get('pandas', '?')}, "
                    f"networkx {first.get('networkx', '?')} ({PASE_CSV}: command, processing and wall times per point).")
    cmd = "python -m experiments pase_parity" + (" --quick" if a.quick else "")
    write_readme(out, "PaSE parity: PaSE's own graphs, our search beside its public code", [(
        "Optimum and search time (parity.csv, search_time.png)",
        f"`{cmd} [--pase-src DIR --pase-python PY]`. Same optimum at {same} of {len(df)} points "
        f"(relative difference at most {REL:g}). Our graphs are PaSE's, written with the layer-graph builder "
        "(harness/core/zoo/pase_graphs.py, `model=pase_<graph>`); costs=pase with PaSE's defaults (10 TFLOP/s, "
        "16 GB/s, cutoff 4 for the CNNs, 1 else, batch 128). Our layer counts include the input layers, which "
        "PaSE's graphs do not have (they cost nothing). PaSE's processing time excludes building its graph "
        "and cost tables, as its scheduler prints it; ours_search_s is our elimination alone and "
        "ours_tables_s our cost tables. Both sides ran on this 2-core machine, one run at a time."
        f"{env_line}\n\n```\n{text}\n```",
    )])
    print(f"wrote {out / 'parity.csv'} and {out / 'search_time.png'}")
    return 0
