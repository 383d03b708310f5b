"""The block-splits part of ``python -m experiments llm_plans``: PaSE's DP and OptCNN's elimination
split one transformer block of each model preset over a tensor-parallel group of its cluster's
node (:mod:`algorithms.block_splits`), and the tables and README lines that say whether they
rediscover Megatron's column/row split and what they choose where they differ."""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd
from tqdm import tqdm

from algorithms.block_splits import SOLVERS, BlockSolution, solve_block
from harness.app.compose import compose
from harness.core.cluster import Cluster
from harness.core.llm.plan import tp_fits

#: the tensor-parallel degrees tried (those of a node that divide the model's heads, KV heads and FFN)
TP_DEGREES = (2, 4, 8)


def preset_source(model: str, cluster: str) -> tuple[Any, Cluster]:
    """A model preset's source (its spec and precision) and one node of ``cluster``."""
    from hydra.utils import instantiate

    cfg = compose([f"model={model}", f"cluster={cluster}", "cluster.nodes=1"])
    return instantiate(cfg.model, _recursive_=False), instantiate(cfg.cluster, _convert_="all")


def solution_row(model: str, cluster: str, sol: BlockSolution) -> dict[str, Any]:
    """One CSV row of a solver's answer on a model's block."""
    differs = [c for c in sol.differing() if c.role not in ("norm", "residual")]
    norms = sorted({c.label for c in sol.layers if c.role in ("norm", "residual")})
    return {
        "model": model, "cluster": cluster, "tp": sol.tp, "solver": sol.solver, "algorithm": SOLVERS[sol.solver][0],
        "cost_model": SOLVERS[sol.solver][1], "space": SOLVERS[sol.solver][2],
        "rediscovers_megatron": sol.rediscovers_megatron, "pairs_communication_free": sol.pairs_communication_free,
        "objective_ms": 1e3 * sol.objective_s, "megatron_ms": None if sol.megatron_s is None else 1e3 * sol.megatron_s,
        "megatron_variant": None if sol.megatron_s is None else ("SP" if sol.megatron_sp else "no SP"),
        "gain_pct": None if sol.gain is None else 100 * sol.gain,
        "comm_ms": 1e3 * sol.comm_s, "megatron_comm_ms": None if sol.megatron_comm_s is None else 1e3 * sol.megatron_comm_s,
        "compute_ms": 1e3 * sol.compute_s,
        "megatron_compute_ms": None if sol.megatron_compute_s is None else 1e3 * sol.megatron_compute_s,
        "qkv_proj": _label(sol, "qkv_proj"), "out_proj": _label(sol, "out_proj"), "mlp_up": _label(sol, "mlp_up"),
        "mlp_down": _label(sol, "mlp_down"), "attention_core": _label(sol, "attn_scores"), "norms": "; ".join(norms),
        "differing_layers": "; ".join(f"{c.layer}: {c.label}" for c in differs),
        "search_s": sol.search_s, "complete": sol.complete,
    }


def _label(sol: BlockSolution, layer: str) -> str:
    return next((c.label for c in sol.layers if c.layer == layer), "")


def block_split_table(models: Sequence[tuple[str, str]], tps: Sequence[int] = TP_DEGREES,
                      solvers: Sequence[str] = tuple(SOLVERS)) -> tuple[pd.DataFrame, dict[tuple[str, int, str], BlockSolution]]:
    """Every (model, its cluster) at every TP degree that fits it, under every solver, micro-batch 1."""
    rows, sols = [], {}
    jobs = []
    for model, cluster in models:
        src, node = preset_source(model, cluster)
        for tp in tps:
            if tp <= node.num_devices and tp_fits(src.spec, tp):
                jobs.extend((model, cluster, src, node, tp, s) for s in solvers)
    for model, cluster, src, node, tp, solver in tqdm(jobs, desc="block splits", unit="solve"):
        sol = solve_block(src.spec, tp, 1, node, solver, src.precision)
        sols[(model, tp, solver)] = sol
        rows.append(solution_row(model, cluster, sol))
    return pd.DataFrame(rows), sols


def layer_table(sol: BlockSolution) -> pd.DataFrame:
    """The last block of one solution, layer by layer, beside Megatron's split."""
    return pd.DataFrame([{
        "layer": c.layer, "role": c.role, "chosen": c.label, "megatron": c.megatron_label, "as_megatron": c.matches,
        "cost_ms": 1e3 * c.cost_s, "megatron_cost_ms": None if c.megatron_cost_s is None else 1e3 * c.megatron_cost_s,
    } for c in sol.layers])


def readme_lines(df: pd.DataFrame, sols: dict[tuple[str, int, str], BlockSolution], detail: Sequence[tuple[str, int]]) -> list[str]:
    """The README section: the verdict per solver, the table, and the layer-by-layer answer of a few blocks."""
    lines = ["## Intra-operator splits of one block: do PaSE and OptCNN rediscover Megatron?", ""]
    if df.empty:
        return lines + ["No block was solved in this run.", ""]
    for solver in SOLVERS:
        part = df[df["solver"] == solver]
        if part.empty:
            continue
        yes = int(part["rediscovers_megatron"].sum())
        line = f"* **{SOLVERS[solver][0]}** under {SOLVERS[solver][1]}, in {SOLVERS[solver][2]}: Megatron's split in {yes} of {len(part)} (model, TP) blocks"
        differ = part[~part["rediscovers_megatron"].astype(bool)]
        gains = differ["gain_pct"].dropna()
        if len(gains):
            less_comm = int((differ["comm_ms"] < differ["megatron_comm_ms"]).sum())
            more_comp = int((differ["compute_ms"] > differ["megatron_compute_ms"] * (1 + 1e-9)).sum())
            line += (f"; where it differs its optimum is {gains.median():.1f} % (median; {gains.min():.1f} to {gains.max():.1f} %) "
                     f"below Megatron's split in its own cost model, with less communication in {less_comm} of {len(gains)} "
                     f"blocks and more compute in {more_comp}")
        line += "."
        for layer, name in (("qkv_proj", "QKV"), ("out_proj", "Output projection"), ("mlp_up", "MLP up"), ("mlp_down", "MLP down")):
            common = differ[layer].value_counts()
            if len(common):
                line += f" {name} where it differs: {common.index[0]} ({int(common.iloc[0])} of {len(differ)})."
        lines.append(line)
    lines += ["", _TABLE_NOTE, "", _WHY, "",
              "| model | TP | solver | Megatron? | gain in its model | QKV | out proj | MLP up | MLP down | norms, residuals |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.to_dict("records"):
        gain = "" if r["gain_pct"] is None or pd.isna(r["gain_pct"]) else f"{r['gain_pct']:.1f} %"
        lines.append(f"| {r['model']} | {r['tp']} | {r['solver']} | {'yes' if r['rediscovers_megatron'] else 'no'} | {gain} | "
                     f"{r['qkv_proj']} | {r['out_proj']} | {r['mlp_up']} | {r['mlp_down']} | {r['norms']} |")
    for model, tp in detail:
        for solver in SOLVERS:
            sol = sols.get((model, tp, solver))
            if sol is None:
                continue
            lines += ["", f"**{model}, TP {tp}, {solver}**: {sol.why()}.", ""]
    return lines + [""]


_TABLE_NOTE = (
    "Each solver is exact in its own cost model on the block's layer graph (three chained blocks, the middle one reported: "
    "it reads a block's output and feeds a block, as every block of a deep stack does; micro-batch 1; the first TP GPUs of "
    "one node of the model's cluster). Megatron's split: QKV and MLP-up column-parallel (split on their output channels: heads, FFN), the "
    "attention core by heads, output projection and MLP-down row-parallel (split on their input channels), no data moved "
    "inside either pair; its norms and residuals are replicated, which a layer graph cannot express, so they are not judged "
    "(unsplit, or Megatron's SP: split along the sequence). The gain is the optimum's objective below Megatron's (its "
    "cheaper variant, with or without SP) in the solver's own model, not in the simulator: the stack simulator costs "
    "Megatron's split only (`harness/core/llm/block_work.py`), so a differing optimum is reported, not used.")

_WHY = (
    "What in their cost models can make another split cheaper than Megatron's (the per-layer costs are in "
    "`block_layers.csv`): PaSE prices communication by its words alone (an all-reduce of w words over P GPUs is "
    "2 (P-1)/P w words, r FLOPs each; no per-message latency, no loss of GEMM efficiency on smaller shards), so a "
    "two-dimensional split (heads x hidden, heads x sequence) that all-reduces smaller tensors over fewer GPUs can move "
    "fewer words than Megatron's one-dimensional split over all t GPUs, even at the price of idle GPUs on a layer.  OptCNN "
    "costs an edge's redistribution as concurrent point-to-point transfers at the links' full bandwidth (t_X, the most "
    "loaded link) and a reduction split as a ring all-reduce (t_R), so gathering a tensor can cost it less than "
    "all-reducing the row-parallel partial sums; its t_C and t_X do not price the statistics all-reduce of a norm split "
    "along the normalised dimension.  In OptCNN's own space (Table 1: only output dims) a row-parallel split does not "
    "exist, so Megatron's split cannot be its answer.  A sequence split of the attention (each GPU its queries, the "
    "key/value heads gathered: context parallelism inside the node) moves less than Megatron's all-reduces where the "
    "key/value heads are few (grouped-query attention) and the weights small against the activations (long sequences).")
