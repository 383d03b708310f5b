"""Shared pieces of the FD-DPS experiments (``fddps_table3`` .. ``fddps_fig5``): the paper's
numbers (printed beside ours, labelled as the paper's, never mixed into our columns), the
models and batch sizes of its evaluation, loading, running one algorithm, and the
results/fddps/README.md assembled from each experiment's section."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from tqdm import tqdm

from experiments.common import experiment_args, models_of
from harness.app.compose import compose
from harness.app.run import build, build_costs

#: FD-DPS Table 3 / 5: the six models and their batch sizes; the testbed is 8 P100 in one server
MODELS: list[tuple[str, int]] = [
    ("vgg16", 64), ("inception_v3", 64), ("resnet50", 64), ("resnet200", 16), ("pnasnet_mobile", 64), ("nasnet_large", 16),
]
CLUSTER = "p100x8"
DEVICES = [2, 4, 8]
#: --quick: small models and batches (seconds), for tests
QUICK_MODELS: list[tuple[str, int]] = [("lenet5", 8), ("vgg16", 4)]
QUICK_DEVICES = [2, 4]
#: quick runs keep FastT short
QUICK_OVERRIDES: dict[str, dict[str, Any]] = {"fastt": {"max_rounds": 2}}

# ---------------------------------------------------------------------------- the paper's numbers
#: Table 3: operators and edges of the TensorFlow (TF-Slim) graphs
PAPER_TABLE3: dict[str, tuple[int, int]] = {
    "vgg16": (3932, 5461), "inception_v3": (12745, 21928), "resnet50": (12692, 24345),
    "resnet200": (45472, 82347), "pnasnet_mobile": (62192, 91957), "nasnet_large": (83206, 148548),
}
#: Table 5: single-GPU iteration time (s); "OOM" where the paper says so
PAPER_SINGLE: dict[str, float | str] = {
    "vgg16": 0.794, "inception_v3": 0.574, "resnet50": 0.394, "resnet200": 2.331, "pnasnet_mobile": 0.822, "nasnet_large": "OOM",
}
TABLE5_ALGOS = ["data_parallel", "fastt", "mp_dps", "fddps"]
#: Table 5: (model, GPUs) -> DP, FastT, MP-DPS, FD-DPS iteration time (s); the paper reports two GPU counts per model
PAPER_TABLE5: dict[tuple[str, int], tuple[float | str, float, float, float]] = {
    ("vgg16", 2): (1.272, 1.122, 1.066, 1.051), ("vgg16", 4): (1.770, 1.975, 1.905, 1.812),
    ("inception_v3", 2): (0.738, 0.712, 0.702, 0.685), ("inception_v3", 4): (0.943, 0.912, 0.872, 0.823),
    ("resnet50", 4): (0.895, 0.834, 0.719, 0.683), ("resnet50", 8): (1.983, 1.874, 1.741, 1.587),
    ("resnet200", 4): (0.986, 0.853, 0.806, 0.743), ("resnet200", 8): (2.321, 2.046, 1.955, 1.723),
    ("pnasnet_mobile", 4): (1.669, 1.624, 1.547, 1.384), ("pnasnet_mobile", 8): (2.643, 2.459, 2.147, 1.873),
    ("nasnet_large", 4): ("OOM", 4.289, 3.876, 3.627), ("nasnet_large", 8): ("OOM", 7.425, 6.550, 5.931),
}
#: Table 5's "Speedup 2" column (FD-DPS over FastT, %) as printed
PAPER_SPEEDUP2: dict[tuple[str, int], float] = {
    ("vgg16", 2): 6.33, ("vgg16", 4): 8.25, ("inception_v3", 2): 3.79, ("inception_v3", 4): 9.76, ("resnet50", 4): 18.11,
    ("resnet50", 8): 15.31, ("resnet200", 4): 12.90, ("resnet200", 8): 15.79, ("pnasnet_mobile", 4): 14.59,
    ("pnasnet_mobile", 8): 23.83, ("nasnet_large", 4): 15.43, ("nasnet_large", 8): 20.12,
}
TABLE7_ALGOS = ["mp_dps", "dddps_f", "fddps"]
#: Table 7 (4 GPUs): MP-DPS, D-DPS(-F), FD-DPS (s), speed (FD-DPS over D-DPS(-F), %), split operators
PAPER_TABLE7: dict[str, tuple[float, float, float, float, str]] = {
    "vgg16": (1.905, 1.926, 1.812, 5.92, "Conv2D, Conv2Dbp"),
    "inception_v3": (0.872, 0.843, 0.823, 2.37, "Conv2D, Conv2Dbp"),
    "resnet50": (0.719, 0.735, 0.683, 7.07, "Conv2D, Conv2Dbp"),
    "resnet200": (0.806, 0.825, 0.743, 9.94, "Conv2D, Conv2Dbp"),
    "pnasnet_mobile": (1.547, 1.489, 1.314, 11.75, "Conv2D, Conv2Dbp, Matmul"),
    "nasnet_large": (3.876, 4.211, 3.627, 13.87, "Conv2D, Conv2Dbp, Matmul"),
}
FIG4_MODELS: list[tuple[str, int]] = [("resnet50", 64), ("resnet200", 16), ("pnasnet_mobile", 64), ("nasnet_large", 16)]
FIG4_CLUSTER = "p100x8_2containers"
#: Fig. 4: speed-up over FastT (%) stated in the text (Sec. 5.2); the other bar labels are
#: legible in the OCR but cannot be assigned to bars with confidence
PAPER_FIG4: dict[str, dict[str, float]] = {"pnasnet_mobile": {"mp_dps": 4.9, "fddps": 16.0}}
PAPER_FIG4_UNASSIGNED = [12.07, 18.79, 16.0, 11.49, 14.53]
FIG5_ALGOS = ["fastt", "mp_dps", "dddps_f", "fddps"]
#: Fig. 5: search time on 8 GPUs (s) that the text pins down: PnasNet FastT - FD-DPS = 185.8 s;
#: NasNet FD-DPS - MP-DPS = 117.3 s and FD-DPS - D-DPS(-F) = 21.8 s; with the bar labels
#: 922.3 / 1108.1 (PnasNet) and 1043.6 / 1021.6 / 926.3 (NasNet) this gives:
PAPER_FIG5: dict[str, dict[str, float]] = {
    "pnasnet_mobile": {"fddps": 922.3, "fastt": 1108.1},
    "nasnet_large": {"fddps": 1043.6, "dddps_f": 1021.6, "mp_dps": 926.3},
}
PAPER_FIG5_UNASSIGNED = [745.9, 59.7, 61.1, 64.5, 68.4, 1045.1, 888.3, 912.5]

LABELS = {"single_device": "single GPU", "data_parallel": "DP", "fastt": "FastT", "mp_dps": "MP-DPS", "dddps_f": "D-DPS(-F)",
          "fddps": "FD-DPS", "heft": "HEFT"}
#: how our aten targets map to the op names of Table 7
OP_NAMES = {"aten.convolution.default": "Conv2D", "aten.convolution_backward.default": "Conv2Dbp", "aten.mm.default": "Matmul",
            "aten.addmm.default": "Matmul", "aten.bmm.default": "Matmul"}
SECTIONS = ["table3", "table5", "table7", "fig4", "fig5"]


def cli(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of an FD-DPS experiment (:func:`experiments.common.experiment_args`)."""
    return experiment_args(name, doc, "fddps", quick="small models and batches (seconds), for tests", models="the paper's six",
                           batch="the paper's batch size for its six, else 32")


def models_to_run(a: argparse.Namespace, full: list[tuple[str, int]] | None = None) -> list[tuple[str, int]]:
    """The (model, batch) pairs of a run: ``--models``, else the quick ones, else ``full`` (the paper's six)."""
    return [(m, int(b)) for m, b in models_of(a, full or MODELS, QUICK_MODELS, dict(MODELS), 32)]


def load(model: str, batch: int, cluster: str = CLUSTER, granularity: str = "aten") -> tuple[Any, Any, Any, Any]:
    """(config, op graph, cluster, simulator) of a model at a batch size (captures are memoised)."""
    cfg = compose([f"model={model}", f"model.batch_size={batch}", f"cluster={cluster}", f"graph.granularity={granularity}"])
    source, cl, _, _, sim = build(cfg)
    return cfg, source.op_graph(**cfg.graph), cl, sim


def make_algo(name: str, quick: bool = False, **over: Any) -> Any:
    """The algorithm registered as conf/algo/<name>.yaml, with overrides."""
    cfg = compose([f"algo={name}"])
    kw = {**(QUICK_OVERRIDES.get(name, {}) if quick else {}), **over}
    return instantiate(cfg.algo, seed=0, _convert_="all", **kw)


def run_algo(graph: Any, cluster: Any, costs: Any, sim: Any, algo: Any) -> dict[str, Any]:
    """Plan (timed: wall clock and process CPU) and simulate one step."""
    w0, c0 = time.perf_counter(), time.process_time()
    plan = algo.plan(graph, cluster, costs)
    search_s, search_cpu_s = time.perf_counter() - w0, time.process_time() - c0
    res = sim(plan.graph, plan.strategy, cluster, costs)
    info = plan.info
    split = info.get("split_by_target") or {}
    return {
        "step_time_s": res.step_time_s,
        "plan_lower_bound_s": res.plan_lower_bound_s,
        "oom": bool(res.oom),
        "objective_s": info.get("objective_s"),
        "search_s": search_s,
        "search_cpu_s": search_cpu_s,
        "plan_nodes": plan.graph.num_nodes,
        "split_ops": int(info.get("split_ops", 0) or 0),
        "split_kinds": ", ".join(sorted({OP_NAMES.get(t, t) for t in split})) if split else "",
        "devices_used": len(plan.strategy.devices_used()),
        "comm_gib": res.comm_bytes / 2**30,
    }


class Runs(list):
    """The rows of :func:`run_grid`, with a lookup by (model, algorithm)."""

    def get(self, model: str, algo: str) -> dict[str, Any]:  # type: ignore[override]
        return next(r for r in self if r["model"] == model and r["algo"] == algo)


def run_grid(models: list[tuple[str, int]], algos: list[str], cluster: str, devices: int | None, quick: bool, desc: str) -> Runs:
    """Every algorithm on every (model, batch), on the first ``devices`` devices of ``cluster``
    (all of them when None): each graph loaded once, one :func:`run_algo` row per run."""
    runs = Runs()
    bar = tqdm(total=len(models) * len(algos), desc=desc, unit="run")
    for model, batch in models:
        cfg, g, full, sim = load(model, batch, cluster)
        cl = full.subset(devices) if devices is not None and devices < full.num_devices else full
        costs = build_costs(cfg, cl)
        for name in algos:
            bar.set_postfix_str(f"{model} {name}")
            r = run_algo(g, cl, costs, sim, make_algo(name, quick=quick))
            runs.append({"model": model, "batch": batch, "nodes": g.num_nodes, "devices": cl.num_devices, "cluster": cl.name,
                         "algo": name, **r})
            bar.update()
    bar.close()
    return runs


def fmt_time(row: dict[str, Any] | None) -> str:
    """A step time for a table cell: seconds, or OOM, or n/a."""
    if row is None:
        return "n/a"
    if row.get("oom"):
        return f"OOM ({row['step_time_s']:.4g})"
    return f"{row['step_time_s']:.4g}"


def paper_batch(model: str, batch: int) -> bool:
    """Whether a run uses the paper's batch size for this model (else its numbers are not shown)."""
    return dict(MODELS).get(model) == batch


def write_section(out: Path, name: str, text: str) -> None:
    """Write one experiment's section and rebuild README.md from all sections present."""
    (out / f"{name}.md").write_text(text.rstrip() + "\n")
    parts = [
        "# FD-DPS (Wang et al., Mathematics 2022): our reproduction\n",
        "Every number in our columns is a step simulated by `simulators/` with the calibrated cost model "
        "(`costs=calibrated`: P100 kernel times fitted to DeepBench's measurements, docs/gpu_costs.md) "
        "on the clusters of `conf/cluster/` (`p100x8`: 8 P100 behind two PCIe switches; 2 and 4 devices are "
        "`p100x8.subset(k)`, the first k GPUs). Columns marked *paper* are the paper's numbers, printed for "
        "comparison only. Each section names the command that regenerates it.\n",
    ]
    for sec in SECTIONS:
        f = out / f"{sec}.md"
        if f.exists():
            parts.append(f.read_text())
    notes = out / "notes.md"
    if notes.exists():
        parts.append(notes.read_text())
    (out / "README.md").write_text("\n".join(parts))


def markdown_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
