"""``llm_accuracy``'s single-GPU check: the simulator's unit costs beside this project's own
measurements of the same units on a real H100 (``python -m harness.block_probe``, committed as
``harness/data/gpu/a100_h100/h100_probe_*.csv``).

A published row mixes the kernels with communication, overlap, the cluster's power limit and its
software; the probe times the kernels alone, on one H100 SXM5 80 GB at 700 W, in the simulator's
own decomposition: a block's forward and forward + backward, the head (final norm, logits, FP32
loss) and the embedding, each per micro-batch, and per block the GEMMs, the attention kernel and
the memory-bound kernels apart (``torch.profiler``'s self device time).  The simulation costs
each probed shape as the probe's code runs it: PyTorch eager (``model.kernels=eager``; the
compiled rows ``compiled_blocks``), no recomputation, on ``cluster=h100x8``'s H100 SXM5 under the
default cost model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.app.compose import compose
from harness.app.run import build_costs
from harness.app.kernel_samples import A100_H100_DATA
from harness.core.kernels import ATTN, GEMM, KernelTable
from harness.core.llm.shard import Shard
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import transformer_stack
from harness.core.llm.work import unit_times, unit_work

#: a probed unit -> (the stack unit it is, the model.kernels it runs as)
UNITS = {"block": ("block", "eager"), "block_flash": ("block", "eager"), "block_compiled": ("block", "compiled_blocks"),
         "head": ("head", "eager"), "embedding": ("embedding", "eager")}


def probe_shapes() -> dict[str, dict[str, Any]]:
    """The probed shapes by name, from :mod:`harness.app.probe_model` (the code that ran)."""
    from harness.app.probe_model import SHAPES

    return {n: s.row() for n, s in SHAPES.items()}


def spec_of(shape: dict[str, Any], kernels: str) -> TransformerSpec:
    """The transformer the probe ran for ``shape`` (its family's layout, ``kernels``)."""
    llama = shape["family"] == "llama"
    kw: dict[str, Any] = {} if llama else {"position": "learned", "norm": "layernorm", "linear_bias": True}
    return TransformerSpec(shape["name"], shape["layers"], shape["hidden"], shape["heads"], shape["kv_heads"], shape["ffn"], llama,
                           shape["seq"], shape["vocab"], not llama, kernels=kernels, **kw)


def cost_model(cluster: str = "h100x8", costs: str = "calibrated") -> Any:
    """The cost model of ``cluster`` under ``costs`` (device 0 is the GPU the units run on)."""
    from hydra.utils import instantiate

    cfg = compose([f"cluster={cluster}", f"costs={costs}"])
    return build_costs(cfg, instantiate(cfg.cluster, _convert_="all"))


#: the class of a simulated kernel kind, ``memory`` for the others
KIND_CLASS = {GEMM: "gemm", ATTN: "attention"}


def class_seconds(tables: tuple[KernelTable, ...], costs: Any) -> dict[str, tuple[float, int]]:
    """(seconds, kernels) per class (``gemm``, ``attention``, ``memory``) of the kernels of ``tables``
    on device 0 of ``costs``."""
    out = {"gemm": (0.0, 0), "attention": (0.0, 0), "memory": (0.0, 0)}
    for tab in tables:
        each = costs.kernel_times(tab.take(np.arange(len(tab)), np.arange(len(tab))), 0, len(tab))
        for kind, sec in zip(tab.kind, each):
            c = KIND_CLASS.get(int(kind), "memory")
            out[c] = (out[c][0] + float(sec), out[c][1] + 1)
    return out


def _unit_index(graph: Any, unit: str) -> int:
    return {"embedding": 0, "block": 1, "head": graph.num_nodes - 1}[unit]


def probe_table(costs: Any | None = None, data_dir: Path = A100_H100_DATA) -> pd.DataFrame:
    """Per probed (shape, unit, pass): the measured seconds (mean over the runs, each a median of
    its repetitions; ``runs`` and the runs' spread), the simulated ones and their ratio."""
    costs = costs if costs is not None else cost_model()
    units = pd.read_csv(Path(data_dir) / "h100_probe_units.csv")
    shapes = probe_shapes()
    rows = []
    for (name, unit, phase), g in units.groupby(["shape", "unit", "pass"], sort=False):
        shape = shapes[str(name)]
        kind, kernels = UNITS[str(unit)]
        graph = transformer_stack(spec_of(shape, kernels), shape["batch"], "amp_bf16")
        t = unit_times(graph, _unit_index(graph, kind), Shard(micro_batch=shape["batch"], recompute="none"), costs)
        sim = t.fwd_s + (t.bwd_input_s + t.bwd_weight_s if phase == "forward_backward" else 0.0)
        measured = g["median_s"].to_numpy(np.float64)
        rows.append({"shape": name, "unit": unit, "pass": phase, "batch": shape["batch"], "seq": shape["seq"], "runs": len(measured),
                     "measured_ms": 1e3 * measured.mean(),
                     "run_spread": (measured.max() - measured.min()) / measured.mean() if len(measured) > 1 else np.nan,
                     "simulated_ms": 1e3 * sim, "ratio": sim / measured.mean()})
    return pd.DataFrame(rows)


def op_class(op: str) -> str | None:
    """The simulator's kernel class of a profiled ATen operator: ``gemm``, ``attention``, ``memory``
    (None for what is not an ATen operator: the profiler's kernel and runtime rows)."""
    if not op.startswith("aten::"):
        return None
    if op in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "gemm"
    return "attention" if "attention" in op else "memory"


def class_table(costs: Any | None = None, data_dir: Path = A100_H100_DATA) -> pd.DataFrame:
    """Per probed block and head (eager) and pass (``forward``; ``backward`` = forward + backward
    less forward): measured and simulated milliseconds and kernel counts per class."""
    costs = costs if costs is not None else cost_model()
    ops = pd.read_csv(Path(data_dir) / "h100_probe_ops.csv")
    ops = ops.assign(cls=ops["op"].map(op_class)).dropna(subset=["cls"])
    ops = ops.assign(ms=ops["self_us"] / ops["layers"] / 1e3, n=ops["calls"] / ops["layers"])
    per_run = ops.groupby(["shape", "unit", "pass", "cls", "run"])[["ms", "n"]].sum().reset_index()
    meas = per_run.groupby(["shape", "unit", "pass", "cls"])[["ms", "n"]].mean()
    shapes = probe_shapes()

    def measured(name: str, unit: str, phase: str, cls: str, col: str) -> float:
        def got(p: str) -> float:
            key = (name, unit, p, cls)
            return float(meas.loc[key, col]) if key in meas.index else 0.0

        return got("forward") if phase == "forward" else got("forward_backward") - got("forward")

    rows = []
    for name in ops["shape"].unique():
        shape = shapes[str(name)]
        graph = transformer_stack(spec_of(shape, "eager"), shape["batch"], "amp_bf16")
        for unit in ("block", "block_flash", "head"):
            if not (ops["shape"].eq(name) & ops["unit"].eq(unit)).any():
                continue
            work = unit_work(graph, _unit_index(graph, UNITS[unit][0]), Shard(micro_batch=shape["batch"], recompute="none"))
            for phase, tables in (("forward", (work.fwd,)), ("backward", (work.bwd_input, work.bwd_weight))):
                for c, (sec, n) in class_seconds(tables, costs).items():
                    ms, m_ms, m_n = 1e3 * sec, measured(name, unit, phase, c, "ms"), measured(name, unit, phase, c, "n")
                    if ms == 0 and m_ms == 0:
                        continue
                    rows.append({"shape": name, "unit": unit, "pass": phase, "class": c, "measured_ms": m_ms, "simulated_ms": ms,
                                 "ratio": ms / m_ms if m_ms > 0 else np.nan, "measured_kernels": m_n, "simulated_kernels": n})
    return pd.DataFrame(rows)


def sustained_summary(data_dir: Path = A100_H100_DATA) -> dict[str, Any]:
    """The sustained readings: the Llama block's forward + backward in its first window and the
    median of its last third, and the 8192^3 GEMM's rate at first and after 20 s (per run)."""
    blk = pd.read_csv(Path(data_dir) / "h100_probe_sustained_block.csv")
    first = float(blk["median_s"].iloc[0])
    settled = float(blk["median_s"].iloc[-max(1, len(blk) // 3):].median())
    gemm = pd.read_csv(Path(data_dir) / "h100_probe_sustained.csv")
    env = json.loads((Path(data_dir) / "h100_probe_env.json").read_text())
    return {"block_first_ms": 1e3 * first, "block_settled_ms": 1e3 * settled, "block_after_s": float(blk["after_s"].iloc[-1]),
            "block_factor": first / settled, "gemm": [(int(r.run), r.when, float(r.tflops), str(r.smi)) for r in gemm.itertuples()],
            "gpu": env["1"]["nvidia_smi"]["values"], "torch": env["1"]["torch"], "runs": len(env)}


def attention_table(costs: Any | None = None, data_dir: Path = A100_H100_DATA) -> pd.DataFrame:
    """The probe's isolated attention kernels per backend (``default`` was cuDNN's on its
    software) beside the simulator's FlashAttention-2 cost of the same call."""
    costs = costs if costs is not None else cost_model()
    k = pd.read_csv(Path(data_dir) / "h100_probe_kernels.csv")
    k = k[(k["kernel"] == "attention") & k["name"].str.startswith("sdpa_causal_")]
    shapes = probe_shapes()
    rows = []
    for (name, backend, phase), g in k.groupby(["shape", "name", "pass"], sort=False):
        shape = shapes[str(name)]
        graph = transformer_stack(spec_of(shape, "eager"), shape["batch"], "amp_bf16")
        work = unit_work(graph, 1, Shard(micro_batch=shape["batch"], recompute="none"))
        tables = (work.fwd,) if phase == "forward" else (work.fwd, work.bwd_input, work.bwd_weight)
        sim = class_seconds(tables, costs)["attention"][0]
        measured = float(g["median_s"].mean())
        rows.append({"shape": name, "backend": str(backend).replace("sdpa_causal_", ""), "pass": phase, "measured_ms": 1e3 * measured,
                     "simulated_ms": 1e3 * sim, "ratio": sim / measured})
    return pd.DataFrame(rows)


def between_table(data_dir: Path = A100_H100_DATA) -> pd.DataFrame:
    """FlashAttention-2 timed alone and right after a GEMM or a copy (``--attention-between``):
    per shape and pass, each context's time over the time alone."""
    k = pd.read_csv(Path(data_dir) / "h100_probe_kernels.csv")
    k = k[(k["kernel"] == "attention") & k["name"].str.startswith("flash_")]
    t = k.pivot_table(index=["shape", "pass"], columns="name", values="median_s", aggfunc="mean")
    out = pd.DataFrame({"alone_ms": 1e3 * t["flash_alone"]})
    for c in ("after_gemm", "after_copy"):
        out[c] = t[f"flash_{c}"] / t["flash_alone"]
    return out.reset_index()


def _ratio(df: pd.DataFrame, shape: str, unit: str, phase: str = "forward_backward") -> float:
    r = df[(df["shape"] == shape) & (df["unit"] == unit) & (df["pass"] == phase)]
    return float(r["ratio"].iloc[0]) if len(r) else float("nan")


def probe_lines(units: pd.DataFrame, classes: pd.DataFrame, attention: pd.DataFrame, sustain: dict[str, Any],
                between: pd.DataFrame | None = None) -> list[str]:
    """The README section: the single-GPU check, by unit and by class, and what it says."""
    from experiments.common import frame_markdown

    blocks = units[units["unit"].str.startswith("block")]
    fb = blocks[blocks["pass"] == "forward_backward"]
    cls = classes[classes["unit"] != "head"]
    by_class = {c: cls[cls["class"] == c]["ratio"] for c in ("gemm", "attention", "memory")}
    mem_bwd = cls[(cls["class"] == "memory") & (cls["pass"] == "backward")]
    flash_l = _ratio(units, "llama3_8b", "block_flash")
    att = attention.pivot_table(index=["shape", "pass"], columns="backend", values="measured_ms")
    cudnn_speedup = (att["flash"] / att["cudnn"]) if {"flash", "cudnn"} <= set(att.columns) else pd.Series([np.nan])
    flash_rows = attention[attention["backend"] == "flash"]["ratio"]
    gemm_dev = float((by_class["gemm"] - 1).abs().max())
    fa2_dev = float((blocks[blocks["unit"] != "block"]["ratio"] - 1).abs().max())
    gemm_first = [g for g in sustain["gemm"] if g[1] == "first"]
    gemm_late = [g for g in sustain["gemm"] if g[1] == "sustained"]
    return [
        "## One H100, measured by this project",
        "",
        "`python -m harness.block_probe` ran the probed decoders (`harness/app/probe_model.py`: Llama 3 8B as torchtitan runs it in",
        f"eager mode, MPT in the shapes and layout the Mosaic rows are simulated with) on lent H100 SXM5 80 GB machines ({sustain['gpu'].split(',')[0]}, power",
        f"limit {sustain['gpu'].split(',')[2].strip()}; torch {sustain['torch']}), {sustain['runs']} runs on fresh machines",
        "(`harness/data/gpu/a100_h100/h100_probe_*.csv`, README there).  Beside it the simulation of the same unit for one",
        "micro-batch: the default cost model on `cluster=h100x8`'s H100 SXM5, `model.kernels=eager` (the compiled rows",
        "`compiled_blocks`), no recomputation.  `run_spread` is (max - min) / mean over the runs: the measurement's own noise.",
        "",
        frame_markdown(units, ["shape", "unit", "pass", "batch", "seq", "runs", "measured_ms", "run_spread", "simulated_ms", "ratio"],
                       {"measured_ms": "{:.2f}", "run_spread": "{:.1%}", "simulated_ms": "{:.2f}", "ratio": "{:.3f}"}),
        "",
        "By kernel class (torch.profiler's self device time per ATen operator in one forward and one forward + backward after",
        "warm-up, `backward` their difference; the kernel counts show what the model lists against what PyTorch launched):",
        "",
        frame_markdown(classes, ["shape", "unit", "pass", "class", "measured_ms", "simulated_ms", "ratio", "measured_kernels",
                                 "simulated_kernels"],
                       {"measured_ms": "{:.2f}", "simulated_ms": "{:.2f}", "ratio": "{:.3f}", "measured_kernels": "{:.0f}",
                        "simulated_kernels": "{:.0f}"}),
        "",
        "The attention kernel alone (isolated, per backend; `default` is what PyTorch picked on this software):",
        "",
        frame_markdown(attention, ["shape", "backend", "pass", "measured_ms", "simulated_ms", "ratio"],
                       {"measured_ms": "{:.2f}", "simulated_ms": "{:.2f}", "ratio": "{:.3f}"}),
        "",
        "What it says:",
        "",
        f"* A block's forward + backward is simulated at {fb['ratio'].min():.2f}-{fb['ratio'].max():.2f} of its measured time.  The",
        f"  GEMMs in situ are within {gemm_dev:.0%} per class and pass ({by_class['gemm'].min():.2f}-{by_class['gemm'].max():.2f}; the H100",
        "  BF16 GEMM fit includes these in-situ GEMMs).  The attention kernel is costed as FlashAttention-2 (simulated at",
        f"  {flash_rows.min():.2f}-{flash_rows.max():.2f} of PyTorch's FA2 backend isolated), the kernel of the published torchtitan runs",
        "  (late-2024 nightlies: PyTorch made cuDNN's SDPA opt-in after 2.5, pytorch/pytorch#138522, and prefers it on Hopper",
        "  again where the bundled cuDNN is newer than 9.15, as on this software), while the probe's default picked cuDNN's,",
        f"  {cudnn_speedup.min():.1f}-{cudnn_speedup.max():.1f}x faster than FA2: hence the `block` rows' closeness.  With SDPA held to FA2",
        f"  (`block_flash`) the blocks are simulated within {fa2_dev:.0%} (Llama 3 8B at {flash_l:.2f}).",
        f"  Inside a step the attention kernel ran at {by_class['attention'][cls['unit'] == 'block_flash'].min():.2f}-"
        f"{by_class['attention'][cls['unit'] == 'block_flash'].max():.2f} of its simulated rate, the memory-bound kernels at "
        f"{mem_bwd['ratio'].min():.2f}-{mem_bwd['ratio'].max():.2f} in the backward.  The model lists what these profiles",
        "  counted - autograd's gradient sums where a tensor feeds two consumers, each bias's column sum, the up-casts at the",
        "  rate they ran, log_softmax's three passes - but for the copies that make RoPE's and GQA's views contiguous.",
        f"* Sustained load: the Llama block ran {sustain['block_first_ms']:.1f} ms in its first window and "
        f"{sustain['block_settled_ms']:.1f} ms over the last third of {sustain['block_after_s']:.0f} s back to back (a factor of "
        f"{sustain['block_factor']:.3f}) at the power limit; an 8192^3 GEMM loop fell from "
        f"{min(g[2] for g in gemm_first):.0f}-{max(g[2] for g in gemm_first):.0f} to {min(g[2] for g in gemm_late):.0f}-"
        f"{max(g[2] for g in gemm_late):.0f} TFLOP/s within 20 s (nvidia-smi: {gemm_first[0][3].split(',')[0]} -> "
        f"{gemm_late[0][3].split(',')[0]}): GEMMs alone draw more power than a step, whose kernels keep nearly their rate.  The",
        "  in-situ factor the published rows imply (\"One in-situ factor\" below) is therefore not a kernel's own slowdown under",
        "  sustained load on one GPU at its full power.",
        *([f"* Right after a GEMM, FlashAttention-2 ran {between['after_gemm'].min():.2f}-{between['after_gemm'].max():.2f} times its time",
           f"  alone (the SM clock the GEMM left), after a copy {between['after_copy'].min():.2f}-{between['after_copy'].max():.2f}: a step's",
           "  GEMMs explain a few per cent of the attention's slowdown inside it, not all of it (not modelled).",
           "",
           frame_markdown(between, ["shape", "pass", "alone_ms", "after_gemm", "after_copy"],
                          {"alone_ms": "{:.2f}", "after_gemm": "{:.3f}", "after_copy": "{:.3f}"}),
           ""] if between is not None and len(between) else []),
        f"* So on one 700 W H100 the model is within {fa2_dev:.0%} of a block's kernels, FlashAttention-2 included; the published H100",
        "  rows' larger misses lie beyond one 700 W GPU's kernels: torchtitan's H100s run at 500 W (conf/cluster/torchtitan_h100.yaml;",
        "  costed at the rate FBGEMM's GEMMs on such a board reached, `board: H100-500W`), FSDP's collectives run beside the",
        "  kernels, and the published runs used older software.  The embedding's backward (a",
        "  sort and an index_put that the model costs as one pass) is several times the model, about 1 ms a step: left alone.",
        "",
    ]
