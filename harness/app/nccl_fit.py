"""Fit the fabric's NCCL calibration to nccl-tests measurements of A100 and H100 systems.

``python -m harness.nccl_fit`` reads the samples of ``harness/data/gpu/a100_h100/nccl.csv``
(:mod:`harness.app.nccl_samples`: every row a sample or a reason), fits the factors of
:mod:`harness.core.nccl_calibration` on a seeded 70 % of the ``fit`` rows of every stratum (a
class and a system: :func:`harness.app.kernel_fit.split_indices`), reports the error of every row
the fit never saw - the other 30 % and the ``check`` rows - per class, and with ``--write``
stores the table :class:`harness.core.fabric.Fabric` is calibrated by
(``harness/data/nccl_calibration.json``).  The same data and seed give the same table.

The model is NCCL's own tuning model (:func:`harness.core.fabric.collective_time`: ring and tree
in LL / LL128 / Simple, NVLS and NVLSTree, the fastest) on calibrated figures; the parameters,
each a factor on a datasheet figure or on NCCL's latency table (:func:`harness.core.fabric.calibrate`):

* ``A100.bus_eff``, ``H100.bus_eff``: the ring's bus bandwidth over NVLink's datasheet figure;
* ``H100.nvls_eff``: NVLS's all-reduce algorithm bandwidth over NVLink's datasheet figure;
* ``lat_scale``: NCCL's base and intra-node latencies (one for both families: only the A100 has
  a measured sweep down to small messages);
* ``p2p_eff``: a send / receive's bandwidth over the ring's (one for both: only the A100 has
  NCCL send / receive rows);
* ``net_eff``, ``net_lat_scale``: the NICs' achieved share of their line rate, NCCL's network
  latencies.

Least squares on log time (soft-L1, so a few odd rows do not drag the rest), plus a weak pull of
each factor's log towards its prior - 1, the datasheet's figure and NCCL's latencies; NVLS: NCCL's
own 5/6 - so that a factor no training row pins stays where NCCL puts it.  ``--seeds`` refits on
other seeds' splits: how far the held-out errors move with nothing but the split (the floor,
written into the table as ``floor``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from harness.app.kernel_fit import TRAIN_SHARE, split_indices
from harness.app.nccl_samples import CLASSES, NCCL_CSV, NVLINK, Left, Sample, load
from harness.core.fabric import NCCL_REF, Group, calibrate, collective_time, p2p_time
from harness.core.nccl_calibration import TABLE, TABLE_FORMAT, IntraCalibration, NetCalibration

SEED = 0
#: the seeds whose refits give the floor (the committed seed besides)
FLOOR_SEEDS: tuple[int, ...] = tuple(range(1, 10))
#: the parameters and their priors
PRIOR: dict[str, float] = {"A100.bus_eff": 1.0, "H100.bus_eff": 1.0, "H100.nvls_eff": 5 / 6, "lat_scale": 1.0, "p2p_eff": 1.0,
                           "net_eff": 1.0, "net_lat_scale": 1.0}
PARAMS: tuple[str, ...] = tuple(PRIOR)
#: bounds of each factor (efficiencies below 1.5: a link does not run far above its datasheet figure)
BOUNDS: dict[str, tuple[float, float]] = {k: (0.05, 1.5) if "eff" in k else (0.1, 20.0) for k in PARAMS}
PRIOR_WEIGHT = 0.03


def calibrations(th: Mapping[str, float], family: str) -> tuple[IntraCalibration | None, NetCalibration]:
    """The calibrations parameters ``th`` give a ``family`` NVSwitch node and the network."""
    intra = None
    if family:
        intra = IntraCalibration(f"{family}/nvswitch", th[f"{family}.bus_eff"], th["p2p_eff"], th["lat_scale"],
                                 th["H100.nvls_eff"] if family == "H100" else 0.0)
    return intra, NetCalibration("ib_roce", th["net_eff"], th["net_lat_scale"])


def predict(s: Sample, th: Mapping[str, float]) -> float:
    """Seconds the calibrated model gives sample ``s`` under parameters ``th``."""
    intra, net = calibrations(th, s.family)
    f = calibrate(s.base, intra, net if s.net else None, s.nvls)
    if s.op == "p2p":
        return p2p_time(f, s.nbytes, same_node=s.base.nodes == 1)
    return collective_time(f, s.op, s.nbytes, Group(s.ranks))


def split(samples: Sequence[Sample], seed: int = SEED) -> set[int]:
    """The training rows (indices into ``samples``): a seeded 70 % of the ``fit`` rows of each
    stratum; the rest, and every ``check`` row, are held out."""
    train: set[int] = set()
    strata = sorted({s.system for s in samples})
    for k, name in enumerate(strata):
        idx = [i for i, s in enumerate(samples) if s.system == name and s.use == "fit"]
        if idx:
            tr, _ = split_indices(len(idx), seed + 1000 * k)
            train.update(idx[j] for j in tr)
    return train


def fit(samples: Sequence[Sample], train: set[int]) -> dict[str, float]:
    """The parameters (module docstring) fitted on the ``train`` samples."""
    from scipy.optimize import least_squares

    rows = [samples[i] for i in sorted(train)]
    log_t = np.log([s.time_s for s in rows])
    prior = np.log([PRIOR[k] for k in PARAMS])
    lo, hi = np.log([BOUNDS[k][0] for k in PARAMS]), np.log([BOUNDS[k][1] for k in PARAMS])

    def resid(x: np.ndarray) -> np.ndarray:
        th = dict(zip(PARAMS, np.exp(x)))
        return np.concatenate([np.log([predict(s, th) for s in rows]) - log_t, PRIOR_WEIGHT * (x - prior)])

    res = least_squares(resid, prior, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, diff_step=1e-4, max_nfev=400)
    return {k: float(v) for k, v in zip(PARAMS, np.exp(res.x))}


def error_rows(samples: Sequence[Sample], th: Mapping[str, float], train: set[int]) -> list[dict[str, Any]]:
    """One row per sample: its class, system, split (``train``, ``test`` or ``check``), measured
    and predicted seconds and their relative error."""
    out = []
    for i, s in enumerate(samples):
        pred = predict(s, th)
        part = "train" if i in train else "test" if s.use == "fit" else "check"
        out.append({"row": s.row, "class": s.cls, "system": s.system, "family": s.family, "split": part, "op": s.op, "ranks": s.ranks,
                    "nodes": s.base.nodes, "bytes": s.nbytes, "measured_s": s.time_s, "predicted_s": pred,
                    "rel_error": pred / s.time_s - 1, "reading": s.reading, "note": s.note})
    return out


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and 90th percentile |error| of the held-out rows (test and check) and of the
    training rows, with their counts and how many rows of either were read off a plot or a slide."""
    held = [abs(r["rel_error"]) for r in rows if r["split"] != "train"]
    train = [abs(r["rel_error"]) for r in rows if r["split"] == "train"]
    return {"heldout_rows": len(held), "train_rows": len(train), "read_off_figure_rows": sum(r["reading"] != "measured" for r in rows),
            "heldout_median_abs_error": float(np.median(held)) if held else None,
            "heldout_p90_abs_error": float(np.percentile(held, 90)) if held else None,
            "train_median_abs_error": float(np.median(train)) if train else None}


def by_class(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`summary` per class (those with rows)."""
    return {c: summary([r for r in rows if r["class"] == c]) for c in CLASSES if any(r["class"] == c for r in rows)}


def system_of(r: Mapping[str, Any]) -> str:
    """The calibration entry a row checks: the network's across nodes, else its family's node."""
    return "ib_roce" if r["nodes"] > 1 else f"{r['family']}/nvswitch"


def fit_table(seed: int = SEED, floor_seeds: Sequence[int] = FLOOR_SEEDS,
              progress: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]], list[Left]]:
    """The calibration table, one error row per sample, the rows left out."""
    samples, left = load()
    train = split(samples, seed)
    th = fit(samples, train)
    rows = error_rows(samples, th, train)
    entries: dict[str, Any] = {}
    for fam in ("A100", "H100"):
        bus = th[f"{fam}.bus_eff"]
        entries[f"{fam}/nvswitch"] = {
            "bus_eff": bus, "p2p_eff": th["p2p_eff"], "lat_scale": th["lat_scale"],
            "nvls_eff": th["H100.nvls_eff"] if fam == "H100" else 0.0,
            "datasheet_GBps": NVLINK[fam] / 1e9, "bus_GBps": bus * NVLINK[fam] / 1e9,
            "heldout": by_class([r for r in rows if system_of(r) == f"{fam}/nvswitch"]),
        }
    entries["H100/nvswitch"]["nvls_GBps"] = th["H100.nvls_eff"] * NVLINK["H100"] / 1e9
    entries["H100/nvswitch"]["shared"] = "lat_scale and p2p_eff: fitted on the A100's rows (no H100 small-message or send/receive row)"
    entries["ib_roce"] = {"net_eff": th["net_eff"], "lat_scale": th["net_lat_scale"],
                          "heldout": by_class([r for r in rows if system_of(r) == "ib_roce"])}
    floor: dict[str, Any] = {"seeds": [seed, *floor_seeds], "classes": {}}
    it: Any = floor_seeds
    if progress and floor_seeds:
        from tqdm import tqdm

        it = tqdm(list(floor_seeds), desc="refitting on other seeds' splits", unit="seed", file=sys.stderr)
    per_seed = {seed: by_class(rows)}
    for s in it:
        tr = split(samples, int(s))
        per_seed[int(s)] = by_class(error_rows(samples, fit(samples, tr), tr))
    for c in by_class(rows):
        med = [per_seed[s][c]["heldout_median_abs_error"] for s in per_seed if per_seed[s].get(c, {}).get("heldout_rows")]
        floor["classes"][c] = {"heldout_median_min": float(min(med)), "heldout_median_max": float(max(med))}
    table = {
        "format": TABLE_FORMAT,
        "source": f"nccl-tests and OSU measurements of A100 / H100 systems: {NCCL_CSV.relative_to(NCCL_CSV.parents[4])} "
                  f"(see its README)",
        "model": NCCL_REF, "seed": seed, "train_share": TRAIN_SHARE, "prior": PRIOR, "prior_weight": PRIOR_WEIGHT,
        "params": th, "systems": entries, "classes": by_class(rows), "floor": floor,
        "rows": {"samples": len(samples), "fit": sum(s.use == "fit" for s in samples), "train": len(train),
                 "check": sum(s.use == "check" for s in samples), "left_out": len(left)},
    }
    return table, rows, left


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.nccl_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the table to {TABLE.relative_to(TABLE.parents[2])}")
    ap.add_argument("--report", help="write one error row per row of nccl.csv (and the reason of each row left out) to this CSV")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--floor-seeds", type=int, default=len(FLOOR_SEEDS), help="refits on other seeds' splits for the floor")
    args = ap.parse_args(argv)
    table, rows, left = fit_table(args.seed, tuple(s for s in range(args.floor_seeds + 1) if s != args.seed)[:args.floor_seeds])
    print("parameters: " + ", ".join(f"{k} {v:.3g}" for k, v in table["params"].items()))
    print(f"{'class':<36} {'held out':>8} {'median':>7} {'p90':>7} {'train':>6} {'median':>7}   floor (median over seeds)")
    for c, s in table["classes"].items():
        fl = table["floor"]["classes"].get(c, {})
        print(f"{c:<36} {s['heldout_rows']:>8} {_pct(s['heldout_median_abs_error'])} {_pct(s['heldout_p90_abs_error'])} "
              f"{s['train_rows']:>6} {_pct(s['train_median_abs_error'])}   "
              f"{_pct(fl.get('heldout_median_min'))} - {_pct(fl.get('heldout_median_max'))}")
    print(f"{len(left)} rows left out (reasons in --report)")
    if args.report:
        import pandas as pd

        pd.DataFrame(rows + [{"row": x.row, "split": "left out", "note": x.reason} for x in left]).sort_values("row").to_csv(
            args.report, index=False)
        print(f"wrote {args.report}")
    if args.write:
        TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {TABLE}")
    return 0


def _pct(x: float | None) -> str:
    return f"{100 * x:6.1f}%" if x is not None else "      -"


if __name__ == "__main__":
    raise SystemExit(main())
