"""Shared pieces of the Celeritas experiments (``celeritas_table2`` .. ``celeritas_table5``):
the paper's numbers (printed beside ours, labelled as the paper's, never mixed into our
columns), the models and batch sizes of its evaluation, and a loader that captures each
model once per process."""

from __future__ import annotations

import argparse
from typing import Any

from experiments.common import experiment_args, models_of
from harness.app.compose import compose
from harness.app.run import build

#: Celeritas Sec. 6.2.1: the four models, their batch sizes, 4 x V100 32 GB on PCIe
MODELS: list[tuple[str, int]] = [("inception_v3", 512), ("nmt", 512), ("transformer", 256), ("tensor_holography", 32)]
CLUSTER = "v100x4_pcie"
#: --quick: small and fast (well under a minute); batch 2 shares the zoo tests' captures
QUICK_MODELS: list[tuple[str, int]] = [("tensor_holography", 2), ("lenet5", 64)]

#: Table 2: nodes and CCR of the original graph and after merging (TensorFlow graphs)
PAPER_TABLE2: dict[str, tuple[int, float, int, float]] = {
    "inception_v3": (6332, 33.118, 59, 8.137),
    "nmt": (25463, 18.630, 154, 6.372),
    "transformer": (36352, 111.957, 220, 11.10),
    "tensor_holography": (3810, 49.147, 37, 7.438),
}
#: Table 3: average single-step time (s) on 4 GPUs; None = OOM
TABLE3_ALGOS = ["metis", "m_topo", "m_etf", "m_sct", "hrl", "order_place", "celeritas"]
PAPER_TABLE3: dict[str, list[float | None]] = {
    "inception_v3": [None, 3.100, 10.548, 7.610, 8.565, 2.931, 2.859],
    "nmt": [None, None, None, None, 10.224, 9.117, 9.099],
    "transformer": [None, None, 8.613, 8.411, 42.837, 6.935, 6.536],
    "tensor_holography": [6.591, 2.220, 6.376, 6.013, 3.683, 1.520, 1.461],
}
PAPER_SPEEDUP = {"inception_v3": 7.8, "nmt": 11.0, "transformer": 22.3, "tensor_holography": 34.2}
#: Table 4: placement generation time (s); HRL's "5 hrs" is quoted from Mars; None = "-"
TABLE4_ALGOS = ["m_sct", "hrl", "order_place", "celeritas"]
PAPER_TABLE4: dict[str, list[float | str | None]] = {
    "inception_v3": [8.591, "5 hrs", 5.439, 7.183],
    "nmt": [None, "5 hrs", 54.695, 59.418],
    "transformer": [129.498, "5 hrs", 92.639, 95.304],
    "tensor_holography": [2.968, "5 hrs", 2.711, 3.586],
}
#: Table 5: average relative deviation of Standard Evaluation's estimates (%)
PAPER_TABLE5: dict[str, tuple[float, float]] = {
    "inception_v3": (1.54, 7.99),
    "nmt": (3.93, 10.85),
    "transformer": (6.02, 14.16),
    "tensor_holography": (2.92, 11.32),
}
#: Fig. 6 (Sec. 6.5.2): measurement time in minutes, where the text states it; None = OOM
PAPER_FIG6: dict[str, dict[str, float | None | str]] = {
    "inception_v3": {"m_topo": 6.0, "dfs_topo": 4.22, "celeritas": "dfs_topo + 6 s"},
    "nmt": {"m_topo": None, "dfs_topo": 10.07, "celeritas": 9.50},
    "transformer": {"m_topo": 38.45, "dfs_topo": 34.3, "celeritas": 9.58},
    "tensor_holography": {"m_topo": "n/a", "dfs_topo": "n/a", "celeritas": "dfs_topo + 1 s; 65.1% below m_topo"},
}


def cli(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of a Celeritas experiment (:func:`experiments.common.experiment_args`), with ``--cluster``."""
    ap = experiment_args(name, doc, "celeritas", quick="small models and batches (seconds), for tests", models="the paper's four",
                         batch="the paper's batch size for its four, else the model's own")
    ap.add_argument("--cluster", default=CLUSTER)
    return ap


def models_to_run(a: argparse.Namespace, quick: list[tuple[str, int]] | None = None) -> list[tuple[str, int]]:
    """The (model, batch) pairs of a run: ``--models``, else ``quick`` (default :data:`QUICK_MODELS`)
    for ``--quick``, else the paper's four; batch 0 is the model's own."""
    return [(m, int(b)) for m, b in models_of(a, MODELS, quick or QUICK_MODELS, dict(MODELS), 0)]


def load(model: str, batch: int, cluster: str, extra: list[str] | None = None) -> tuple[Any, Any, Any, Any, Any]:
    """(graph source, graph, cluster, costs, cfg) for a model at a batch size (batch 0: the model's own)."""
    ov = [f"model={model}", f"cluster={cluster}"] + ([f"model.batch_size={batch}"] if batch else []) + list(extra or [])
    cfg = compose(ov)
    source, cl, costs, _, _ = build(cfg)
    return source, source.op_graph(**cfg.graph), cl, costs, cfg


def fmt_paper(v: Any) -> str:
    if v is None:
        return "OOM"
    if isinstance(v, str):
        return v
    return f"{v:g}"
