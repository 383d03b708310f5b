"""What a re-run of the GPU accuracy experiment moved: its calibrated ratios beside those of the
``throughput.csv`` it replaces, and the rows whose verdict (within 10 %, within 25 %, beyond)
changed, each with the reason the run can tell (its precision changed, its all-reduces' cost, or its kernel costs).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

#: a ratio that moved less than this (0.5 %) is the same figure (the CSVs keep 4 digits)
MOVED = 0.005


def band(ratio: float) -> str:
    """The verdict band of a simulated / published ratio."""
    err = abs(ratio - 1.0)
    return "within 10 %" if err <= 0.10 else "within 25 %" if err <= 0.25 else "beyond 25 %"


def previous_table(path: Path) -> pd.DataFrame | None:
    """The ``throughput.csv`` a run is about to replace (None when there is none, or it has no calibrated ratios)."""
    if not path.exists():
        return None
    df = pd.read_csv(path)
    return df if {"id", "calibrated_ratio"} <= set(df.columns) else None


def changes_table(previous: pd.DataFrame, tp: pd.DataFrame) -> pd.DataFrame:
    """One row per published row whose calibrated ratio moved by :data:`MOVED` or more: the old and
    new ratio and band, and why (the simulated precision changed, else the kernel costs).  A
    previous table without ``simulated_precision`` ran every AMP row as autocast (``amp_fp16``)."""
    old = previous.set_index("id")
    rows = []
    for r in tp.itertuples():
        if r.id not in old.index or not math.isfinite(float(r.calibrated_ratio)):
            continue
        o = old.loc[r.id]
        before, after = float(o["calibrated_ratio"]), float(r.calibrated_ratio)
        if not math.isfinite(before) or abs(after - before) < MOVED:
            continue
        was = str(o["simulated_precision"]) if "simulated_precision" in old.columns else (
            "fp32" if str(r.simulated_precision) == "fp32" else "amp_fp16")
        ar_before, ar_after = float(o.get("calibrated_allreduce_s", math.nan)), float(getattr(r, "calibrated_allreduce_s", math.nan))
        ar_moved = math.isfinite(ar_before) and math.isfinite(ar_after) and abs(ar_after - ar_before) > MOVED * max(ar_before, 1e-12)
        why = (f"simulated as {r.simulated_precision}, was {was} (its trainer's recipe)" if was != r.simulated_precision
               else f"all-reduce costs ({1e3 * ar_before:.3g} -> {1e3 * ar_after:.3g} ms of all-reduces)" if ar_moved
               else "kernel costs (calibration)")
        rows.append({"id": r.id, "before": before, "after": after, "band_before": band(before), "band_after": band(after),
                     "why": why})
    return pd.DataFrame(rows, columns=["id", "before", "after", "band_before", "band_after", "why"])


def changes_lines(previous: pd.DataFrame | None, tp: pd.DataFrame) -> list[str]:
    """The README section of :func:`changes_table`."""
    head = ["## What moved since the previous run", ""]
    if previous is None:
        return head + ["No earlier `throughput.csv` in this directory to compare with.", ""]
    ch = changes_table(previous, tp)
    if ch.empty:
        return head + [f"No calibrated ratio moved by {100 * MOVED:.1f} % or more.", ""]
    crossed = ch[ch["band_before"] != ch["band_after"]]
    lines = head + [
        f"Calibrated simulated / published ratios that moved by {100 * MOVED:.1f} % or more against the `throughput.csv`",
        "this run replaced (`why`: the row's simulated precision changed, or else the summed time of its all-reduces did,",
        "or else its kernel costs did):",
        "",
        "| id | before | after | verdict before | verdict after | why |",
        "|---|---|---|---|---|---|",
        *[f"| {r.id} | {r.before:.2f} | {r.after:.2f} | {r.band_before} | {r.band_after} | {r.why} |" for r in ch.itertuples()],
        "",
        "Verdicts that moved: " + (", ".join(f"{r.id} ({r.band_before} -> {r.band_after})" for r in crossed.itertuples())
                                   or "none") + ".",
        "",
    ]
    return lines
