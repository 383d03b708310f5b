"""How well the simulator's message model can fit real runs at all: chains of messages on cpu2, fitted freely.

``python -m experiments sim_accuracy`` compares the simulator with real runs under cpu2's
calibrated figures; this experiment asks the question under it: is there *any* setting of
the figures the simulator charges a message with on a CPU rank (cpu2's ``host_comm``:
``per_message_us`` to each endpoint, ``copy_GBps`` per byte, and the cold parts of a send and
a receive, ``send_cold_us`` / ``recv_cold_us``) that reproduces real runs?

A synthetic chain of linear layers (:func:`chain_mlp`, not one of the models the accuracy
table evaluates) is run for real on cpu2 at several widths and batch sizes, so that the
compute between two messages and their size vary apart, under round robin (every op on the
other rank than the one before it: a message per op) and m-TOPO (one cut: few messages),
with the profile taken during the run (``sim.interleave_profile``), so that the ops' times
are the run's own and only the messages are left to the model.  Then the figures are
searched on a grid (:func:`fit_host_comm`; cpu2's own figures are one of the candidates) for
the smallest mean absolute error of the re-simulated steps.  The best fit's error is what no
calibration of this model can go below on this machine; its residuals show which regime the
model misses.  The link's own figures (latency, bandwidth) stay cpu2's: on cpu2 the host
charges hold the whole one-way time of a small message.

Outputs (``--out``, default results/sim_accuracy/): comm_fit.csv (one row per real run:
measured, simulated with cpu2's figures and with the best fit), comm_fit.md.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments.common import experiment_args, output_dir
from harness.app.compose import compose

#: (depth, width, batch) of the chains: the compute between messages grows with width^2 x
#: batch, a message with width x batch, so the points vary the two apart
POINTS: list[tuple[int, int, int]] = [(12, 64, 16), (12, 64, 256), (12, 128, 32), (12, 256, 64), (8, 256, 256), (8, 512, 64)]
ALGOS = ["round_robin", "m_topo"]
QUICK = {"points": [(4, 32, 8)], "algos": ["round_robin"], "steps": 3, "warmup": 1}
#: the searched figures: per message and side (us), per byte (GB/s), and a factor on cpu2's calibrated cold parts
GRID: dict[str, list[float]] = {
    "per_message_us": [float(x) for x in range(0, 301, 10)],
    "copy_GBps": [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 1e6],
    "cold_scale": [0.0, 0.5, 1.0, 2.0, 4.0, 8.0],
}


def chain_mlp(depth: int = 8, width: int = 64, num_classes: int = 10) -> Any:
    """``depth`` linear layers of ``width`` features with a ReLU after each, then a classifier:
    a chain, so that round robin sends a message between every two ops."""
    import torch.nn as nn

    layers: list[Any] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


@dataclass
class ChainRun:
    """One real run: the plan, cpu2 as calibrated, the cost model with the run's own op times, and the measured step."""

    name: str
    algo: str
    graph: Any
    strategy: Any
    cluster: Any
    costs: Any
    measured_s: float
    sends: int


def chain_overrides(depth: int, width: int, batch: int) -> list[str]:
    """The ``python -m harness`` overrides of one chain (``model=custom``)."""
    return ["model=custom", "model.name=chain", f"model.module._target_={__name__}.chain_mlp", f"+model.module.depth={depth}",
            f"+model.module.width={width}", f"model.batch_size={batch}", f"model.inputs=[{{shape:[{width}],dtype:float32}}]",
            "model.target.high=10"]


def run_chain(point: tuple[int, int, int], algo: str, steps: int, warmup: int) -> ChainRun:
    """A chain run for real on cpu2 with the profile interleaved with its steps."""
    from harness.app.run import run

    cfg = compose([*chain_overrides(*point), f"algo={algo}", "cluster=cpu2", "costs=analytical", "sim=realrun", "sim.interleave_profile=true",
                   f"sim.steps={steps}", f"sim.warmup={warmup}", "output.gantt=false", "output.trace=false", "output.worth=false"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run(cfg)
    if res.sim.interleaved_costs is None:
        raise RuntimeError(f"chain {point} / {algo}: the run took no interleaved profile")
    d, w, b = point
    return ChainRun(f"d{d} w{w} b{b}", algo, res.plan.graph, res.plan.strategy, res.cluster, res.sim.interleaved_costs,
                    float(res.row["measured_step_time_s"]), int(sum(res.row["realrun"]["sends_per_rank"])))


def with_host_comm(cluster: Any, per_message_us: float, copy_GBps: float, cold_scale: float) -> Any:
    """``cluster`` with these message figures (the cold parts scaled from its own)."""
    h = dict(cluster.meta.get("host_comm") or {})
    h.update(per_message_us=per_message_us, copy_GBps=copy_GBps)
    for k in ("send_cold_us", "recv_cold_us"):
        if k in h:
            h[k] = float(h[k]) * cold_scale
    h.pop("send_us", None)
    h.pop("recv_us", None)
    return cluster.with_host_comm(h)


def calibrated(cluster: Any) -> dict[str, float]:
    """``cluster``'s own message figures, in the terms of :data:`GRID`."""
    own = cluster.meta.get("host_comm") or {}
    return {"per_message_us": float(own.get("per_message_us", 0.0)), "copy_GBps": float(own.get("copy_GBps", 1e6)), "cold_scale": 1.0}


def simulated(runs: Sequence[ChainRun], figures: dict[str, float]) -> np.ndarray:
    """Every run's plan simulated with its own op times and these message figures (seconds)."""
    from simulators.simulate import simulate

    return np.array([simulate(r.graph, r.strategy, with_host_comm(r.cluster, **figures), r.costs).step_time_s for r in runs])


def fit_host_comm(runs: Sequence[ChainRun], grid: dict[str, list[float]] | None = None) -> tuple[dict[str, float], np.ndarray]:
    """The message figures of ``grid`` (cpu2's own among them) whose re-simulated steps have
    the smallest mean absolute relative error against the measured ones, and those errors.
    Ties keep the first candidate in grid order (cpu2's own first)."""
    grid = grid or GRID
    meas = np.array([r.measured_s for r in runs])
    cands = [calibrated(runs[0].cluster)]
    cands += [dict(zip(grid, v)) for v in itertools.product(*grid.values())]
    best: tuple[float, dict[str, float], np.ndarray] | None = None
    for c in tqdm(cands, desc="fitting the message figures", unit="setting", leave=False):
        err = simulated(runs, c) / meas - 1.0
        score = float(np.abs(err).mean())
        if best is None or score < best[0]:
            best = (score, c, err)
    assert best is not None
    return best[1], best[2]


def write_outputs(runs: Sequence[ChainRun], fit: dict[str, float], out: Path, meta: dict[str, Any]) -> pd.DataFrame:
    own_fig = calibrated(runs[0].cluster)
    sim_own, sim_fit = simulated(runs, own_fig), simulated(runs, fit)
    df = pd.DataFrame({"chain": [r.name for r in runs], "algo": [r.algo for r in runs], "sends": [r.sends for r in runs],
                       "measured_s": [r.measured_s for r in runs], "simulated_cpu2_s": sim_own, "simulated_fit_s": sim_fit})
    df["error_cpu2"] = df["simulated_cpu2_s"] / df["measured_s"] - 1.0
    df["error_fit"] = df["simulated_fit_s"] / df["measured_s"] - 1.0
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "comm_fit.csv", index=False)
    pct = lambda e: f"{e * 100:+.1f}%"  # noqa: E731
    fmt_fit = lambda f: (f"per_message_us {f['per_message_us']:g}, copy_GBps {'unbounded' if f['copy_GBps'] >= 1e5 else format(f['copy_GBps'], 'g')}, "  # noqa: E731
                         f"cold parts x {f['cold_scale']:g}")
    lines = ["# How well the simulator's message model can fit real runs", "", f"Regenerate: `{meta['command']}` ({meta['date']}, {meta['seconds']:.0f} s)", "",
             "Chains of linear layers (`experiments.comm_fit.chain_mlp`, depth d, width w, batch b) run for real on cpu2",
             f"(mean of {meta['steps']} steps after {meta['warmup']}), each simulated with the op times profiled during its own run, so that only",
             "the messages are left to the model; then cpu2's message figures searched on a grid for the smallest mean absolute",
             "error (cpu2's own figures are a candidate).  The fit's error bounds what any calibration of this model reaches here.", "",
             f"cpu2 as calibrated: {fmt_fit(own_fig)}; mean absolute error {df['error_cpu2'].abs().mean() * 100:.1f}%.",
             f"Best fit: {fmt_fit(fit)}; mean absolute error {df['error_fit'].abs().mean() * 100:.1f}%, "
             f"worst {df['error_fit'].abs().max() * 100:.1f}%.", "",
             "| chain | strategy | messages | measured (ms) | cpu2's figures (ms) | error | best fit (ms) | error |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.chain} | {r.algo} | {r.sends} | {r.measured_s * 1e3:.2f} | {r.simulated_cpu2_s * 1e3:.2f} | {pct(r.error_cpu2)} | "
                     f"{r.simulated_fit_s * 1e3:.2f} | {pct(r.error_fit)} |")
    (out / "comm_fit.md").write_text("\n".join(lines) + "\n")
    return df


def main(argv: list[str] | None = None) -> int:
    ap = experiment_args("comm_fit", __doc__, "sim_accuracy", quick="one small chain under round robin, 3 steps, a coarse grid: checks the pipeline")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per run (default 30; --quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="discarded steps per run (default 3; --quick 1)")
    a = ap.parse_args(argv)
    points, algos, grid = POINTS, ALGOS, GRID
    if a.quick:
        points, algos = QUICK["points"], QUICK["algos"]
        grid = {"per_message_us": [0.0, 50.0, 100.0], "copy_GBps": [1.0, 1e6], "cold_scale": [0.0, 1.0]}
    if a.steps is None:
        a.steps = QUICK["steps"] if a.quick else 30
    if a.warmup is None:
        a.warmup = QUICK["warmup"] if a.quick else 3
    out = output_dir(a)
    t0 = time.time()
    runs = [run_chain(p, algo, a.steps, a.warmup) for p in tqdm(points, desc="chains run for real", unit="chain") for algo in algos]
    fit, _ = fit_host_comm(runs, grid)
    cmd = "python -m experiments comm_fit" + (" --quick" if a.quick else "")
    df = write_outputs(runs, fit, out, {"command": cmd, "date": _dt.date.today().isoformat(), "seconds": time.time() - t0, "steps": a.steps,
                                        "warmup": a.warmup})
    print((out / "comm_fit.md").read_text())
    print(f"wrote {out / 'comm_fit.csv'}, {out / 'comm_fit.md'} ({len(df)} runs)")
    return 0
