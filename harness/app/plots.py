"""``python -m harness.collect DIR --plot``: a sweep's figures against what it swept.

One PNG per figure - step time, speed-up over one device, speed-up over data parallelism,
search time - with the first swept key on the x axis (categorical for names such as ``algo``
or ``model``, numeric for numbers such as ``model.batch_size``) and a line per value of the
other swept keys.  The swept keys are the overrides (``override.<key>`` columns of
:func:`harness.app.collect.collect`) with more than one value among the jobs with a result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

#: (column, y-axis label, file name) of each figure
FIGURES = (
    ("step_time_s", "simulated step time (s)", "plot_step_time.png"),
    ("speedup_vs_single_device", "speed-up over one device (x)", "plot_speedup_vs_single_device.png"),
    ("speedup_vs_data_parallel", "speed-up over data parallelism (x)", "plot_speedup_vs_data_parallel.png"),
    ("search_seconds", "search time (s)", "plot_search_time.png"),
)

#: column prefix of a job's overrides in the collected table
OVERRIDE = "override."

#: the keys put on the x axis first when they are swept
X_FIRST = ("algo", "model", "cluster")

_MARKERS = ["o", "s", "^", "D", "v", "x", "*", "P"]
_LINES = ["-", "--", "-.", ":"]


def swept_keys(df: pd.DataFrame) -> list[str]:
    """The override columns with more than one value among the jobs with a result, the
    :data:`X_FIRST` keys first."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    cols = [c for c in df.columns if c.startswith(OVERRIDE) and ok[c].dropna().astype(str).nunique() > 1]
    rank = {f"{OVERRIDE}{k}": i for i, k in enumerate(X_FIRST)}
    return sorted(cols, key=lambda c: (rank.get(c, len(rank)), c))


def _numeric(values: pd.Series) -> pd.Series | None:
    """The values as numbers, or None when one is not a number."""
    out = pd.to_numeric(values, errors="coerce")
    return None if out.isna().any() else out


def plot_sweep(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """The figures of :data:`FIGURES` that ``df`` (a collected table) has values for, written
    into ``out``; the paths written.  A sweep that swept nothing is plotted against ``algo``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"].copy() if "status" in df.columns else df.copy()
    if ok.empty:
        return []
    swept = swept_keys(df)
    xcol = swept[0] if swept else "algo"
    groups = swept[1:]
    ok[xcol] = ok[xcol].astype(str)
    num = _numeric(ok[xcol])
    cats = sorted(ok[xcol].unique(), key=(lambda v: float(v)) if num is not None else str)
    label = ok[groups].astype(str).agg(", ".join, axis=1) if groups else pd.Series("", index=ok.index)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for col, ylabel, name in FIGURES:
        if col not in ok.columns:
            continue
        y_all = pd.to_numeric(ok[col], errors="coerce")
        if not np.isfinite(y_all).any():
            continue
        fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(cats) + 3.0), 3.6))
        for i, (lab, sub) in enumerate(sorted(ok.groupby(label), key=lambda kv: str(kv[0]))):
            y = pd.to_numeric(sub[col], errors="coerce")
            keep = np.isfinite(y)
            if not keep.any():
                continue
            xs = sub[xcol][keep]
            pos = pd.to_numeric(xs) if num is not None else xs.map({c: j for j, c in enumerate(cats)})
            order = np.argsort(pos.to_numpy(), kind="stable")
            # one series over names (algorithms, models) is points: a line between names would mean nothing
            line = _LINES[(i // len(_MARKERS)) % len(_LINES)] if groups or num is not None else "none"
            ax.plot(pos.to_numpy()[order], y[keep].to_numpy()[order], marker=_MARKERS[i % len(_MARKERS)], linestyle=line,
                    label=lab or None)
        if num is None:
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels(cats, rotation=30 if len(cats) > 4 else 0, ha="right" if len(cats) > 4 else "center")
        pos_y = y_all[np.isfinite(y_all) & (y_all > 0)]
        if len(pos_y) and pos_y.max() / pos_y.min() > 100:
            ax.set_yscale("log")
        if col.startswith("speedup"):
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel(xcol.removeprefix(OVERRIDE))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if groups:
            ax.legend(title=", ".join(g.removeprefix(OVERRIDE) for g in groups), fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        written.append(out / name)
    return written
