"""Simulator accuracy on cpu2: simulated vs measured step time per strategy (OptCNN Table 4, Celeritas Table 5 style).

For each small model the ops are first profiled on this CPU at one thread (the thread count
of a cpu2 rank) at the batch sizes the strategies need (B and B/2), into the profile
directory of this CPU (:func:`harness.core.machine.cpu_kind`), which must be cpu2's device kind:
cpu2's figures are measured on the CPU it names (``python -m harness.calibrate --threads 1
--write``), and on another CPU the run is refused before any work, in one line that says so.
``--quick`` checks the pipeline, not the accuracy: on another CPU it runs cpu2 as this CPU with
the other one's communication figures, and its README says so.  By default each op is timed
*in situ* (its call inside whole steps, ``harness.app.profile mode=in_situ``, filed under
``<out>/profiles``): timed in isolation (``--profile-mode isolated``, the profiles of
results/profiles) an op runs on warm caches and the steps of these small models come out short
on a single device.  Then, for each
algorithm whose plan can run for real (operator placements and data parallelism on the
captured graph), ``python -m harness cluster=cpu2 costs=profiled sim=realrun`` is run: the
event simulator gives the simulated step time, the two pinned gloo ranks the measured one
(5 warm-up steps, mean of the next 50).  A shared machine drifts by tens of percent between
minutes, so the experiment runs ``--repeats`` rounds; in each, every model is profiled and
its cases are planned, simulated and run right after, with that round's profile, so that a
fast or slow spell falls on both sides of the round's error.  A
case reports the round with the median error, with every round's measured time and error
and their spread; the profiles kept under ``<out>/profiles`` are the rounds' medians, op by
op.  Reported per case: both times, the relative error (simulated / measured - 1), and
the same for the analytical roofline (costs=analytical on the same plan) for comparison;
overall the mean absolute error.  Goal: |error| <= 10% per case, mean <= 5%.

The runs also profile *during* the measurement (``sim.interleave_profile``; ``--no-interleave``
turns it off): after every measured step one rank in turn runs the whole graph alone, timing
each op in situ, and the same plan is simulated again with those times (``interleaved_s``,
``interleaved_error``, the median over the rounds).  The profile before the run is what a user
has when choosing a plan; the interleaved one sees the machine the run saw, so the gap between
the two errors is the machine's drift, and what is left is the simulator's own.  Every case is
also simulated under the simulator's other model of what a message costs a CPU rank
(``host_comm.recv_when: busy``, :func:`busy_model`) with both profiles: ``busy_error``,
``interleaved_busy_error``.

The communication figures of cpu2 (link, all-reduce and what a message costs the ranks'
cores, ``host_comm``) come from ``python -m harness.calibrate --write``, measured the way
``sim=realrun`` runs (each rank on its own core, idle spinners on both).  The profiler and
the ranks both keep the memory they free (:func:`simulators.realrun.timing.steady_malloc`).  Timing needs a quiet machine: the load average is recorded before and after
the run.

The searches use the simulator to *rank* strategies, so per model, across its executed
strategies, the run also reports (:func:`experiments._sim_rank.rank_summary`) Kendall's tau-b between simulated and
measured step times and the regret of the simulator's pick (the measured time of the strategy it
ranks fastest over the fastest measured time, minus 1), with both profiles; goal, with the
interleaved one: tau >= 0.8, regret <= 5%.  Beside them, the noise floor the rounds already
show: how far a case's measured step moves between rounds, and how well one round's measured
times rank the strategies of another's.  ``--summarize-only`` recomputes this from
``<out>/sim_accuracy.csv`` and measures nothing.

Outputs (``--out``, default results/sim_accuracy/): sim_accuracy.csv, sim_accuracy.png,
sim_accuracy_ranks.csv, README.md.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments._sim_rank import RANKS_CSV, print_rank_summary, write_rank_summary
from experiments.common import output_dir, print_table, style
from harness.app.compose import CONF, compose

#: small models whose step takes 10-100 ms on one core: name -> overrides of python -m harness
MODELS: dict[str, list[str]] = {
    "lenet5": ["model=lenet5", "model.batch_size=64"],
    "alexnet_small": ["model=alexnet", "model.image_size=67", "model.batch_size=16", "+model.module.widths=[24,64,96,96,64]",
                      "+model.module.fc_width=512", "model.module.num_classes=100", "model.target.high=100"],
    "resnet_tiny": ["model=resnet50", "model.batch_size=16", "model.image_size=32", "+model.module.layers=[1,1,1,1]",
                    "+model.module.width=16", "model.module.num_classes=10", "model.target.high=10"],
    "transformer_tiny": ["model=transformer", "model.batch_size=16", "model.src_len=16", "model.tgt_len=16", "model.vocab=1000",
                         "model.module.d_model=64", "model.module.num_heads=4", "model.module.d_ff=256",
                         "model.module.num_encoder_layers=2", "model.module.num_decoder_layers=2"],
}
#: strategies compared (those present in conf/algo; a plan that cannot run for real is listed as refused)
ALGOS = ["single_device", "data_parallel", "round_robin", "m_topo", "m_etf", "m_sct", "metis", "dfs_topo", "heft", "celeritas",
         "order_place", "fddps"]
QUICK = {"models": ["lenet5"], "algos": ["round_robin"], "steps": 3, "warmup": 1, "reps": 2}
QUICK_MODEL = {"lenet5": ["model=lenet5", "model.batch_size=16"]}


def _cpu2() -> Any:
    from hydra.utils import instantiate

    return instantiate(compose(["cluster=cpu2"]).cluster, _convert_="all")


def _comm_summary(c: Any) -> str:
    """cpu2's link, collective and host_comm figures, for the README."""
    parts = [f"link {c.route_lat[0, 1] * 1e6:.0f} us + bytes / {c.route_bw[0, 1] / 1e9:.2f} GB/s"]
    if c.meta.get("collective"):
        parts.append("all-reduce ring alpha {lat_us} us, beta {bw_GBps} GB/s".format(**c.meta["collective"]))
    if c.meta.get("host_comm"):
        h = c.meta["host_comm"]
        parts.append("each transfer costs both endpoints {per_message_us} us + bytes / {copy_GBps} GB/s of compute".format(**h))
        if h.get("send_cold_us"):
            parts.append("a sender {send_cold_us} us x (1 - exp(-gap / {send_tau_us} us)) more after computing gap since its previous send".format(**h))
    return "; ".join(parts)


def profile_model_once(src: Any, profile_root: Path, kind: str, reps: int, warmup: int, mode: str) -> pd.DataFrame:
    """Profile one model at B and B/2 on this CPU at one thread, file it under this CPU's device
    kind ``kind`` in ``profile_root`` and return it."""
    from harness.app.profile import profile_model
    from harness.core.profiled import profile_dir_for

    B = int(src.batch_size)
    files = profile_model(src, device="cpu", batch_sizes=sorted({max(1, B // 2), B}), threads=1, warmup=warmup, reps=reps,
                          out_dir=profile_dir_for(kind, profile_root), name=kind, progress=False, mode=mode)
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def median_profile(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Profiles of one model taken several times: every time column is the median over them, node by node."""
    df = frames[0].copy()
    for col in ("time_s", "time_mean_s", "time_min_s"):
        df[col] = np.median(np.stack([f[col].to_numpy() for f in frames]), axis=0)
    return df


def calibrated_elsewhere(cpu2: Any) -> str | None:
    """cpu2's device kind when it names another CPU than this one (its figures were calibrated
    there), else None."""
    from harness.core.machine import foreign_cpu

    kind = cpu2.devices[0].spec.kind
    return kind if foreign_cpu(kind) is not None else None


def busy_model(cluster: Any) -> Any | None:
    """The cluster with ``host_comm.recv_when: busy`` (a receive costs a waiting receiver
    ``recv_idle_us``, a computing one ``per_message_us`` taken from the op it runs), the
    simulator's other model of what a message costs a CPU rank; None where the cluster has no
    calibrated ``recv_idle_us`` (``python -m harness.calibrate --write`` measures it)."""
    host = cluster.meta.get("host_comm") or {}
    if "recv_idle_us" not in host:
        return None
    return cluster.with_host_comm({**host, "recv_when": "busy"})


def _has_interleaved(ok: pd.DataFrame) -> bool:
    """Whether any executed case was also simulated with the profile taken during its run."""
    return "interleaved_error" in ok and bool(ok["interleaved_error"].notna().any())


def run_case(model: str, overrides: list[str], algo: str, profile_root: Path, steps: int, warmup: int, interleave: bool = True,
             cluster: list[str] | None = None) -> dict[str, Any]:
    """One (model, algorithm) on cpu2 (with the ``cluster`` overrides): simulated (profiled and
    analytical costs) and measured; with ``interleave``, also simulated with the profile the
    ranks took between the measured steps (``sim.interleave_profile``)."""
    from harness.core.costs import AnalyticalCostModel
    from harness.app.run import run
    from simulators.realrun import RealRunError
    from simulators.simulate import simulate

    cfg = compose([*overrides, f"algo={algo}", "cluster=cpu2", *(cluster or []), "costs=profiled", f"costs.profile_dir={profile_root}",
                   "sim=realrun", f"sim.interleave_profile={str(interleave).lower()}", f"sim.steps={steps}", f"sim.warmup={warmup}",
                   "output.gantt=false", "output.trace=false", "output.worth=false"])
    row: dict[str, Any] = {"model": model, "algo": algo}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = run(cfg)
    except RealRunError as e:
        return {**row, "status": "refused", "note": str(e).splitlines()[0][:200]}
    r = res.row
    ana = simulate(res.plan.graph, res.plan.strategy, res.cluster, AnalyticalCostModel(res.cluster)).step_time_s
    meas = float(r["measured_step_time_s"])
    # the same plan and profiles under the simulator's other host_comm model (recv_when: busy)
    busy, run_costs = busy_model(res.cluster), res.sim.interleaved_costs
    busy_s = busy_ie = np.nan
    if busy is not None:
        from harness.app.run import build_costs

        costs = build_costs(cfg, res.cluster)
        busy_s = simulate(res.plan.graph, res.plan.strategy, busy, costs).step_time_s
        if run_costs is not None:
            busy_ie = simulate(res.plan.graph, res.plan.strategy, busy, run_costs).step_time_s / meas - 1.0
    rep = r.get("costs_report", {})
    return {
        **row, "status": "ok", "mode": r["realrun"]["mode"], "batch": r["batch_size"], "nodes": r["plan_nodes"],
        "devices_used": r["devices_used"], "simulated_s": r["step_time_s"], "measured_s": meas,
        "measured_std_s": r["measured_step_time_std_s"], "error": r["step_time_s"] / meas - 1.0,
        "analytical_s": ana, "analytical_error": ana / meas - 1.0, "fallback_nodes": rep.get("fallback_nodes", np.nan),
        "sim_busy_s": r["device_busy_s"], "measured_busy_s": r["measured_rank_busy_s"], "comm_bytes": r["comm_bytes"],
        "measured_send_s": r["measured_rank_send_s"], "measured_wait_s": r["measured_rank_wait_s"],
        "measured_page_faults": r["measured_rank_page_faults"],
        "interleaved_s": _nan(r.get("step_time_interleaved_s")), "interleaved_error": _nan(r.get("sim_relative_error_interleaved")),
        "reference_step_s": _nan(r.get("measured_reference_step_s")),
        "busy_s": busy_s, "busy_error": busy_s / meas - 1.0, "interleaved_busy_error": busy_ie,
    }


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def combine_runs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One case run in several rounds, each with its own profile (simulated) and real run
    (measured): the round whose error is the median of the rounds' errors is reported (its
    simulated and measured times, so that the row is one consistent pair), with the rounds'
    measured times, their errors and their spread ((max - min) / median measured).  The
    interleaved-profile error is the median of the rounds' own (``interleaved_run_errors``)."""
    if rows[0]["status"] != "ok":
        return rows[0]
    ok = [r for r in rows if r["status"] == "ok"]
    meas = np.array([r["measured_s"] for r in ok])
    err = np.array([r["simulated_s"] / r["measured_s"] - 1.0 for r in ok])
    k = int(np.argsort(err, kind="stable")[(len(err) - 1) // 2])
    row = dict(ok[k])
    row.update(error=float(err[k]), analytical_error=row["analytical_s"] / row["measured_s"] - 1.0, runs=len(ok),
               measured_runs_ms=" ".join(f"{x * 1e3:.2f}" for x in meas), run_errors=" ".join(f"{e * 100:+.1f}%" for e in err),
               run_spread=float((meas.max() - meas.min()) / np.median(meas)))
    ie = np.array([r.get("interleaved_error", np.nan) for r in ok], dtype=float)
    if np.isfinite(ie).any():
        row.update(interleaved_error=float(np.nanmedian(ie)), interleaved_run_errors=" ".join(f"{e * 100:+.1f}%" if np.isfinite(e) else "n/a" for e in ie))
    for key in ("busy_error", "interleaved_busy_error"):  # the other communication model: median over the rounds, as above
        v = np.array([r.get(key, np.nan) for r in ok], dtype=float)
        if np.isfinite(v).any():
            row[key] = float(np.nanmedian(v))
    return row


def write_outputs(df: pd.DataFrame, out: Path, meta: dict[str, Any]) -> pd.DataFrame:
    """Write the table, its figure, the README and the rank summary (:func:`write_rank_summary`,
    returned) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "sim_accuracy.csv", index=False)
    ok = df[df["status"] == "ok"].copy()
    style()
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6, 0.55 * len(ok) + 2), 6.5), sharex=True)
    labels = [f"{m}\n{a}" for m, a in zip(ok["model"], ok["algo"])]
    x = np.arange(len(ok))
    ax1.bar(x - 0.2, ok["measured_s"] * 1e3, 0.4, label="measured", color="#4c72b0", edgecolor="black", hatch="//")
    ax1.bar(x + 0.2, ok["simulated_s"] * 1e3, 0.4, label="simulated (profiled)", color="#dd8452", edgecolor="black", hatch="..")
    ax1.set_ylabel("step time (ms)")
    ax1.legend()
    inter = _has_interleaved(ok)
    w = 0.27 if inter else 0.4
    ax2.bar(x - w / 2 - (w / 2 if inter else 0), ok["error"] * 100, w, label="profiled before the run", color="#dd8452", edgecolor="black", hatch="..")
    if inter:
        ax2.bar(x, ok["interleaved_error"] * 100, w, label="profiled during the run (interleaved)", color="#8172b3", edgecolor="black", hatch="\\\\")
    ax2.bar(x + w / 2 + (w / 2 if inter else 0), ok["analytical_error"] * 100, w, label="analytical", color="#55a868", edgecolor="black", hatch="xx")
    for y in (-10, 10):
        ax2.axhline(y, color="black", linestyle=":", linewidth=0.8)
    ax2.set_ylabel("simulated / measured - 1 (%)")
    ax2.set_xticks(x, labels, rotation=70, fontsize=7)
    ax2.legend()
    fig.suptitle(f"simulator accuracy on cpu2 ({meta['cpu']}, 1 thread per rank)")
    fig.tight_layout()
    fig.savefig(out / "sim_accuracy.png")
    plt.close(fig)
    fmt = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    pct = lambda e: f"{e * 100:+.1f}%"  # noqa: E731
    lines = [
        "# Simulator accuracy: simulated vs measured step time on cpu2",
        "",
        "Regenerate: `" + meta["command"] + "`",
        "",
        f"Two CPU devices of one core each ({meta['cpu']}, torch {meta['torch']}), gloo over loopback; costs=profiled from a",
        f"profile of the same CPU at one thread ({meta['mode']} op timing); measured = mean of {meta['steps']} steps after {meta['warmup']} warm-up steps",
        f"(sim=realrun, idle spinners on the ranks' cores; the profiler and the ranks keep the memory they free, steady_malloc). {meta['repeats']} rounds: in each, every model is profiled and its cases planned, simulated",
        "and run right after with that profile; a row is the round with the median error (its own measured and simulated times).",
        f"Load average before / after: {meta['load_before']} / {meta['load_after']} ({meta['date']}).",
        f"cpu2's communication figures (`python -m harness.calibrate --write`): {meta.get('comm', 'n/a')}"
        + (f" - measured on another CPU ({meta['calibrated_on']}): cpu2 ran as this CPU with them, a check of the pipeline only."
           if meta.get("calibrated_on") else "."),
        "Error = simulated / measured - 1, in the style of OptCNN Table 4 and Celeritas Table 5.",
        "",
        "Interleaved = the same plan simulated with its ops' times profiled *during* the run: after every measured step one",
        "rank in turn runs the whole graph alone and times each op in situ (`sim.interleave_profile`), and each device takes",
        "every op's mean over its own rank's reference steps; the median over the rounds of that error.  The plan itself",
        "was made with the profile taken before the run.  The two columns differ by how far the machine moved between the",
        "profile and the run.",
        "",
        "Spread = (slowest - fastest measured run) / median: how far this machine moves between runs of the same case.",
        "",
        "| model | strategy | mode | measured (ms) | runs (ms) | spread | simulated (ms) | error | errors of the runs | interleaved error | its runs | analytical (ms) | error | fallback ops |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in ok.iterrows():
        ie = r.get("interleaved_error", np.nan)
        lines.append(f"| {r['model']} | {r['algo']} | {r['mode']} | {fmt(r['measured_s'])} | {r['measured_runs_ms']} | {r['run_spread'] * 100:.0f}% | {fmt(r['simulated_s'])} | "
                     f"{pct(r['error'])} | {r['run_errors']} | {pct(ie) if np.isfinite(ie) else 'n/a'} | {r.get('interleaved_run_errors', '') if np.isfinite(ie) else 'not profiled during the run'} | "
                     f"{fmt(r['analytical_s'])} | {pct(r['analytical_error'])} | {int(r['fallback_nodes'])} |")
    if len(ok):
        mae, worst = float(ok["error"].abs().mean()), float(ok["error"].abs().max())
        within = int((ok["error"].abs() <= 0.10).sum())
        lines += ["", f"Mean absolute error {mae * 100:.1f}% (goal <= 5%), worst {worst * 100:.1f}% (goal <= 10% per case), "
                  f"{within} of {len(ok)} cases within 10%. Analytical roofline: mean absolute error "
                  f"{float(ok['analytical_error'].abs().mean()) * 100:.1f}%. Median spread between runs of one case "
                  f"{float(ok['run_spread'].median()) * 100:.0f}%."]
        if inter:
            lines += ["", f"With the profile interleaved with the run: {_errors(ok['interleaved_error'])}."]
        busy = [(c, w) for c, w in (("busy_error", "the profile taken before the run"), ("interleaved_busy_error", "the interleaved profile"))
                if c in ok and ok[c].notna().any()]
        if busy:
            lines += ["", "The simulator's other model of what a message costs a CPU rank, `host_comm.recv_when: busy` (a receiver",
                      "that waited pays the calibrated `recv_idle_us` in the op after the wait, one that computes pays `per_message_us`",
                      "out of the op it runs; cpu2 uses `always`: every first reader pays `per_message_us`), the same plans and",
                      "profiles simulated again, the median over the rounds: "
                      + "; ".join(f"with {w}, {_errors(ok[c])}" for c, w in busy) + "."]
    ref = df[df["status"] != "ok"]
    if len(ref):
        lines += ["", "Not executed (only simulated):", ""] + [f"* {r['model']} / {r['algo']}: {r['note']}" for _, r in ref.iterrows()]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return write_rank_summary(df, out)


def _errors(e: pd.Series) -> str:
    """Mean absolute, worst, within 10 % and mean signed of a column of relative errors."""
    e = e.dropna()
    return (f"mean absolute error {float(e.abs().mean()) * 100:.1f}%, worst {float(e.abs().max()) * 100:.1f}%, "
            f"{int((e.abs() <= 0.10).sum())} of {len(e)} cases within 10%, mean signed error {float(e.mean()) * 100:+.1f}%")


def main(argv: list[str] | None = None) -> int:
    from experiments.common import experiment_args

    ap = experiment_args("sim_accuracy", __doc__, "sim_accuracy", models=f"all of {list(MODELS)}", batch=None,
                         quick="lenet5 (batch 16), round robin, 3 steps: checks the pipeline, not the accuracy")
    ap.add_argument("--algos", nargs="*", default=None, help="algorithms (default: those of ALGOS present in conf/algo)")
    ap.add_argument("--steps", type=int, default=50, help="measured steps per case (Celeritas: 50)")
    ap.add_argument("--warmup", type=int, default=5, help="discarded steps per case (Celeritas: 5)")
    ap.add_argument("--reps", type=int, default=10, help="profiler repetitions per op")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds: in each, profile every model and run its cases with that profile; each case reports "
                         "the round with the median error (default 3)")
    ap.add_argument("--profile-dir", default=None, help="profile root (default <out>/profiles; results/profiles with --profile-mode isolated)")
    ap.add_argument("--no-profile", action="store_true", help="reuse the profiles already in the profile root")
    ap.add_argument("--profile-mode", default="in_situ", choices=["isolated", "in_situ"],
                    help="in_situ (default): every op inside whole steps; isolated: each distinct op alone (harness.app.profile's default)")
    ap.add_argument("--no-interleave", action="store_true", help="do not profile during the real runs (sim.interleave_profile=false)")
    ap.add_argument("--summarize-only", action="store_true",
                    help=f"measure nothing: recompute the per-model rank summary from <out>/sim_accuracy.csv into <out>/{RANKS_CSV} "
                         "and its section of <out>/README.md (writes nothing else, nowhere else)")
    a = ap.parse_args(argv)
    from harness.core.machine import cpu_kind, cpu_kind_override

    cpu2 = _cpu2()
    kind = cpu_kind(1)  # what this run measures is filed under this CPU's name
    elsewhere = calibrated_elsewhere(cpu2)
    if elsewhere and not (a.quick or a.summarize_only):
        ap.error(f"cpu2 was calibrated on {elsewhere!r}, not on this machine's {kind!r}: run `python -m harness.calibrate --threads 1 "
                 "--write` here first (--quick checks the pipeline on any machine)")
    out = output_dir(a)
    if a.summarize_only:
        other = [f"--{k.replace('_', '-')}" for k, v in vars(a).items() if k not in ("summarize_only", "out") and v != ap.get_default(k)]
        if other:
            ap.error(f"--summarize-only measures nothing and takes only --out, not {' '.join(other)}")
        if not (out / "sim_accuracy.csv").is_file():
            ap.error(f"--summarize-only: no {out / 'sim_accuracy.csv'} to summarize")
        print_rank_summary(write_rank_summary(pd.read_csv(out / "sim_accuracy.csv"), out))
        print(f"wrote {out / RANKS_CSV} and the rank section of {out / 'README.md'} (nothing else)")
        return 0
    import torch

    overrides = dict(MODELS)
    if a.quick:
        overrides.update(QUICK_MODEL)
        models, algos = QUICK["models"], QUICK["algos"]
        a.steps, a.warmup, a.reps, a.repeats = QUICK["steps"], QUICK["warmup"], QUICK["reps"], 1
    else:
        models = a.models or list(MODELS)
        present = {p.stem for p in (CONF / "algo").glob("*.yaml")}
        algos = a.algos or [x for x in ALGOS if x in present]
    unknown = [m for m in models if m not in overrides]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    root = Path(a.profile_dir) if a.profile_dir else (CONF.parent / "results" / "profiles" if a.profile_mode == "isolated" and not a.quick
                                                      else out / "profiles")
    cluster = [cpu_kind_override(1)] if elsewhere else []
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.time()
    from harness.app.profile import write_profile
    from harness.core.profiled import profile_dir_for
    from harness.app.run import build

    srcs = {m: build(compose(overrides[m]))[0] for m in models}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(m, algo): [] for m in models for algo in algos}
    profiles: dict[str, list[pd.DataFrame]] = {m: [] for m in models}
    steps = a.repeats * len(models) * (len(algos) + (0 if a.no_profile else 1))
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=steps, desc="profiles and real runs", unit="job") as bar:
        # rounds: each model is profiled and its cases run right after, with that profile, so
        # that a slow or fast spell of a shared machine falls on both sides of a round's error
        for k in range(a.repeats):
            for m in models:
                rroot = root if a.no_profile else Path(tmp) / f"round{k}"
                if not a.no_profile:
                    profiles[m].append(profile_model_once(srcs[m], rroot, kind, a.reps, 1 if a.quick else 3, a.profile_mode))
                    bar.update()
                for algo in algos:
                    if not runs[(m, algo)] or runs[(m, algo)][0]["status"] == "ok":
                        runs[(m, algo)].append(run_case(m, overrides[m], algo, rroot, a.steps, a.warmup, not a.no_interleave, cluster))
                    bar.update()
    for m, frames in profiles.items():  # the committed profiles: the median of the rounds', node by node
        if frames:
            write_profile(median_profile(frames), profile_dir_for(kind, root))
    df = pd.DataFrame([combine_runs(rs) for rs in runs.values()])
    from harness.core.machine import cpu_model

    cmd = "python -m experiments sim_accuracy" + (" --quick" if a.quick else "") + (f" --profile-mode {a.profile_mode}" if a.profile_mode != "in_situ" else "")
    meta = {"cpu": cpu_model(), "torch": torch.__version__, "steps": a.steps, "warmup": a.warmup, "load_before": load_before, "mode": a.profile_mode,
            "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()), "date": _dt.date.today().isoformat(), "command": cmd, "repeats": a.repeats,
            "comm": _comm_summary(cpu2), "calibrated_on": elsewhere}
    summary = write_outputs(df, out, meta)
    ok = df[df["status"] == "ok"]
    if len(ok):
        print_table(ok.assign(measured_ms=ok["measured_s"] * 1e3, simulated_ms=ok["simulated_s"] * 1e3, error_pct=ok["error"] * 100,
                              analytical_pct=ok["analytical_error"] * 100).to_dict("records"),
                    ["model", "algo", "mode", "measured_ms", "simulated_ms", "error_pct", "analytical_pct", "fallback_nodes"],
                    title=f"simulated vs measured on cpu2 (mean |error| {ok['error'].abs().mean() * 100:.1f}%"
                          + (f"; profiled during the run {ok['interleaved_error'].abs().mean() * 100:.1f}%)" if _has_interleaved(ok) else ")"))
    print_rank_summary(summary)
    print(f"wrote {out / 'sim_accuracy.csv'}, {out / 'sim_accuracy.png'}, {out / RANKS_CSV}, {out / 'README.md'} "
          f"in {time.time() - t0:.0f} s")
    return 0
