"""PaSE: speedup of the PaSE strategy over data parallelism, by PaSE's cost model and by the simulator."""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments._layerwise import parametric, problem, run, write_readme
from experiments.common import experiment_args, models_of, output_dir, print_table, style
from experiments.pase_search_time import MODELS, PS, QUICK_MODELS, QUICK_PS, model_overrides, strategy_path
from harness.core.strategy import Strategy


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("pase_speedup", __doc__, "pase", quick="alexnet and rnnlm at p = 4, 8", models=" ".join(MODELS), batch=None)
    ap.add_argument("--ps", nargs="*", type=int, default=None, help="processor counts (default 4 8 16 32 64; --quick 4 8)")
    a = ap.parse_args(argv)
    a.models = [m for m, _ in models_of(a, MODELS, QUICK_MODELS)]
    a.ps = a.ps or list(QUICK_PS if a.quick else PS)
    out = output_dir(a)
    from algorithms.baselines import DataParallel
    from algorithms.layer_costs import evaluate
    from algorithms.pase import PaSE, TableTooLarge
    from simulators.simulate import simulate

    rows = []
    bar = tqdm([(m, p) for m in a.models for p in a.ps], desc="PaSE speedup", unit="point")
    for m, p in bar:
        bar.set_postfix_str(f"{m} p={p}")
        conf, extra = model_overrides(m)
        pb = problem(conf, "parametric", costs="pase", extra=[*parametric(p)[1:], *extra])
        row = {"model": m, "p": p, "batch": pb.batch, "cluster": pb.cluster.name}
        dp = run(DataParallel(graph="layer"), pb)
        dp.pop("_plan")
        path = strategy_path(out, m, p)
        strat = None
        if path.exists():
            s = Strategy.load(path)
            if s.num_nodes == pb.graph.num_nodes:
                strat, source = s, f"{path.parent.name}/{path.name}"
        try:
            if strat is None:
                plan = PaSE(budget_s=None).plan(pb.graph, pb.cluster, pb.costs)
                if not plan.info["search_complete"]:  # past max_entries: a baseline, not PaSE's answer
                    raise TableTooLarge(plan.info.get("fallback", "incomplete"))
                strat, source = plan.strategy, "searched"
            obj = evaluate(pb.graph, strat, pb.cluster, pb.costs)["objective_s"]
            sim = simulate(pb.graph, strat, pb.cluster, pb.costs)
            row.update({"strategy": source, "pase_objective_s": obj, "dp_objective_s": dp["objective_s"],
                        "speedup (cost model)": dp["objective_s"] / obj, "pase_step_s": sim.step_time_s,
                        "dp_step_s": dp["step_time_s"], "speedup (simulated)": dp["step_time_s"] / sim.step_time_s,
                        "pase_oom": sim.oom, "dp_oom": dp["oom"]})
        except TableTooLarge as err:
            row.update({"strategy": f"n/a ({str(err).split(';')[0][:80]})", "speedup (cost model)": np.nan,
                        "speedup (simulated)": np.nan})
        row["speedup (paper)"] = "n/a (not in our copy of the paper)"
        rows.append(row)
    df = pd.DataFrame(rows)
    df.to_csv(out / "speedup.csv", index=False)
    text = print_table(rows, ["model", "p", "batch", "speedup (cost model)", "speedup (simulated)", "dp_oom", "pase_oom",
                              "strategy", "speedup (paper)"],
                       title="PaSE strategy vs data parallelism: PaSE's cost model (t_V + t_E) and the event simulator "
                             "(P100s, 8 per node, NVLink 20 GB/s, EDR IB between nodes)")
    style()
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    for m in a.models:
        d = df[df["model"] == m]
        axes[0].plot(d["p"], d["speedup (cost model)"], label=m)
        axes[1].plot(d["p"], d["speedup (simulated)"], label=m)
    for ax, t in zip(axes, ("by PaSE's cost model", "simulated step time")):
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("processors p")
        ax.set_ylabel("speedup over DP")
        ax.set_title(t)
    axes[0].legend(fontsize=7)
    fig.suptitle("PaSE: speedup over data parallelism (ours)")
    fig.tight_layout()
    fig.savefig(out / "speedup.png")
    plt.close(fig)
    cmd = "python -m experiments pase_speedup" + (" --quick" if a.quick else "")
    write_readme(out, "PaSE (Elango 2021): our results beside the paper's", [(
        "Speedup over data parallelism (speedup.csv, speedup.png)",
        f"`{cmd}` (reuses the strategies pase_search_time saved in strategies/ when they match the graph). "
        f"Our copy of the PaSE paper has no evaluation section, so no paper figures are given here.\n\n```\n{text}\n```",
    )])
    print(f"wrote {out / 'speedup.csv'} and {out / 'speedup.png'}")
    return 0
