"""PaSE: search time against the number of processors p, with FlexFlow's MCMC beside it (costs=pase)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm import tqdm

from experiments._layerwise import RNNLM_LSTM, parametric, problem, run, save_search_time_plot, write_readme
from experiments.common import experiment_args, models_of, output_dir, print_table, style

MODELS = ("alexnet", "inception_v3", "transformer", "rnnlm")
PS = (4, 8, 16, 32, 64)
QUICK_MODELS = ("alexnet", "rnnlm")
QUICK_PS = (4, 8)
#: search times the issue quotes from the PaSE paper (p = 64)
PAPER_PASE = {("inception_v3", 64): "196 s", ("transformer", 64): "31 min"}
PAPER_FLEXFLOW = {("inception_v3", 64): "37 min"}


def model_overrides(model: str) -> tuple[str, list[str]]:
    """(conf model, overrides): ``rnnlm`` is PaSE's RNNLM graph (one LSTM operator),
    ``rnnlm_unrolled`` our zoo's per-step cells."""
    if model == "rnnlm":
        return "rnnlm", list(RNNLM_LSTM)
    if model == "rnnlm_unrolled":
        return "rnnlm", []
    return model, []


def strategy_path(out: Path, model: str, p: int) -> Path:
    return out / "strategies" / f"{model}_p{p}.json"


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("pase_search_time", __doc__, "pase", quick="alexnet and rnnlm at p = 4, 8; 2000 MCMC moves",
                         models=" ".join(MODELS) + " (rnnlm is PaSE's graph, one LSTM op; rnnlm_unrolled our zoo's per-step cells)",
                         batch=None)
    ap.add_argument("--ps", nargs="*", type=int, default=None, help="processor counts (default 4 8 16 32 64; --quick 4 8)")
    ap.add_argument("--mcmc-iterations", type=int, default=None, help="MCMC moves (default 20000; --quick 2000)")
    ap.add_argument("--mcmc-budget", type=float, default=None, help="wall-clock cap of each MCMC run (s; default 60, --quick 5)")
    ap.add_argument("--max-entries", type=float, default=2**28, help="PaSE's largest table before it gives up")
    a = ap.parse_args(argv)
    a.models = [m for m, _ in models_of(a, MODELS, QUICK_MODELS)]
    a.ps = a.ps or list(QUICK_PS if a.quick else PS)
    if a.mcmc_iterations is None:
        a.mcmc_iterations = 2000 if a.quick else 20000
    if a.mcmc_budget is None:
        a.mcmc_budget = 5.0 if a.quick else 60.0
    out = output_dir(a)
    (out / "strategies").mkdir(exist_ok=True)
    from algorithms.flexflow_mcmc import FlexFlowMCMC
    from algorithms.pase import PaSE, TableTooLarge

    rows = []
    bar = tqdm([(m, p) for m in a.models for p in a.ps], desc="PaSE search time", unit="point")
    for m, p in bar:
        bar.set_postfix_str(f"{m} p={p}")
        conf, extra = model_overrides(m)
        pb = problem(conf, "parametric", costs="pase", extra=[*parametric(p)[1:], *extra])
        row = {"model": m, "p": p, "layers": pb.graph.num_nodes, "batch": pb.batch}
        try:
            r = run(PaSE(max_entries=int(a.max_entries), budget_s=None), pb, simulate_it=False)
            plan = r.pop("_plan")
            if not r["search_complete"]:  # past max_entries: PaSE's answer is a baseline, not a search
                raise TableTooLarge(plan.info.get("fallback", "incomplete"))
            plan.strategy.save(strategy_path(out, m, p))
            row.update({"pase_s": r["search_s"], "tables_s": r["tables_s"], "largest_table": r["largest_table"],
                        "configs_max": plan.info["configs_max"], "pase_objective_s": r["objective_s"], "pase": f"{r['search_s']:.3g} s"})
        except TableTooLarge as err:
            row.update({"pase_s": float("nan"), "pase": f"n/a ({str(err).split(';')[0][:90]})"})
        f = run(FlexFlowMCMC(iterations=a.mcmc_iterations, budget_s=a.mcmc_budget, seed=0), pb, simulate_it=False)
        f.pop("_plan")
        row.update({"mcmc_s": f["search_s"], "mcmc_complete": f["search_complete"], "mcmc_objective_s": f["objective_s"],
                    "mcmc / pase objective": f["objective_s"] / row["pase_objective_s"] if "pase_objective_s" in row else float("nan"),
                    "mcmc": f"{f['search_s']:.3g} s" + ("" if f["search_complete"] else " (budget)")})
        row["pase (paper)"] = PAPER_PASE.get((m, p), "n/a")
        row["FlexFlow MCMC (paper)"] = PAPER_FLEXFLOW.get((m, p), "n/a")
        rows.append(row)
    df = pd.DataFrame(rows)
    df.to_csv(out / "search_time.csv", index=False)
    text = print_table(rows, ["model", "p", "layers", "configs_max", "largest_table", "pase", "pase (paper)", "mcmc",
                              "mcmc / pase objective", "FlexFlow MCMC (paper)"],
                       title="PaSE search time (costs=pase: 10 TFLOP/s, 16 GB/s); MCMC: "
                             f"{a.mcmc_iterations} moves, FlexFlow's stopping rule, cap {a.mcmc_budget:g} s; "
                             "'(paper)': the PaSE paper's figures")
    style()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for i, m in enumerate(a.models):
        d = df[df["model"] == m]
        line, = ax.plot(d["p"], d["pase_s"], label=f"{m} PaSE")
        ax.plot(d["p"], d["mcmc_s"], linestyle="--", marker="x", color=line.get_color(), label=f"{m} MCMC")
    paper_pts = [(64, 196.0, "inception_v3 PaSE (paper)", 0), (64, 31 * 60.0, "transformer PaSE (paper)", -9),
                 (64, 37 * 60.0, "inception_v3 FlexFlow MCMC (paper)", 5)]
    for x, y, lab, dy in paper_pts:
        if any(lab.startswith(m + " ") for m in a.models) and x in a.ps:
            ax.scatter([x], [y], marker="*", s=60, color="grey", zorder=5)
            ax.annotate(lab, (x, y), fontsize=6, xytext=(-135, dy), textcoords="offset points", va="center")
    save_search_time_plot(fig, ax, "PaSE vertex elimination vs FlexFlow MCMC (ours; stars: paper)", out / "search_time.png")
    cmd = "python -m experiments pase_search_time" + (" --quick" if a.quick else "")
    write_readme(out, "PaSE (Elango 2021): our results beside the paper's", [(
        "Search time against p (search_time.csv, search_time.png, strategies/)",
        f"`{cmd}`. Times exclude building the cost tables (tables_s in the CSV). rnnlm is PaSE's own "
        f"graph of the RNNLM (the two LSTM layers as one operator, harness/core/zoo/rnnlm_lstm.py); our zoo's "
        f"per-step rnnlm is `rnnlm_unrolled`. The MCMC column is FlexFlow's search on the same cost "
        f"tables (a move costs O(degree)), not FlexFlow's simulator. Only the figures the issue quotes are "
        f"given as the paper's.\n\n```\n{text}\n```",
    )])
    print(f"wrote {out / 'search_time.csv'} and {out / 'search_time.png'}")
    return 0
