"""``python -m harness.collect DIR``: one table from a sweep (or any tree of job dirs).

Every job directory under DIR (one with ``result.json``, ``error.json`` or Hydra's ``.hydra/``)
becomes a row: its result (status ``ok``; nested keys flattened with dots, lists kept as JSON
text in the CSV), or its error (status ``error``), or status ``corrupt`` (its result.json or
error.json cannot be read) or ``missing`` (it has neither: the job never finished).  Column
``problem`` names each corrupt or missing file; the command prints them on stderr and still
writes the table, and says ``N of M jobs`` when some have no result.  Every override a job was
given (its ``.hydra/overrides.yaml``, else its error.json's list) is a column
``override.<key>``, so the keys a sweep swept tell its rows apart; the whole config that could
change a result is in result.json's ``config`` (columns ``config.<key>``).  Writes
``results.csv`` and ``results.parquet`` into DIR (or ``--out``); with ``--plot``, the figures
of :mod:`harness.app.plots` too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.app.plots import OVERRIDE, plot_sweep, swept_keys


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k not in ("versions",):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _read(f: Path) -> dict[str, Any]:
    """A job's JSON record; ValueError when it is not one."""
    d = json.loads(f.read_text())
    if not isinstance(d, dict):
        raise ValueError(f"a JSON {type(d).__name__}, not an object")
    return d


def job_overrides(d: Path, record: dict[str, Any] | None = None) -> dict[str, str]:
    """The overrides a job was given, ``{key: value}``: from its ``.hydra/overrides.yaml``, else
    from ``record`` (its error.json); a key's ``+`` / ``~`` prefix is dropped."""
    items: Any = None
    f = d / ".hydra" / "overrides.yaml"
    if f.exists():
        try:
            items = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError):
            items = None
    if not isinstance(items, list) and record is not None:
        items = record.get("overrides")
    out: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        key, eq, value = str(item).partition("=")
        if eq:
            out[key.lstrip("+~")] = value
    return out


def _job_row(root: Path, d: Path) -> dict[str, Any]:
    """The row of one job directory."""
    row: dict[str, Any] = {"job_dir": str(d.relative_to(root)), "status": "missing"}
    record: dict[str, Any] | None = None
    problems = []
    for f in (d / "result.json", d / "error.json"):
        if not f.exists() or row["status"] != "missing":
            continue
        try:
            rec = _read(f)
        except (OSError, ValueError) as e:
            problems.append(f"{f.name} is corrupt ({type(e).__name__}: {e})")
            continue
        if f.name == "result.json":
            row = {**_flatten(rec), **row, "status": "ok"}
        else:
            record = rec
            row.update(status="error", error=rec.get("error"), overrides=" ".join(map(str, rec.get("overrides") or [])))
    if row["status"] == "missing":
        row["status"] = "corrupt" if problems else "missing"
        problems = problems or ["no result.json or error.json: the job did not finish"]
    row.update({f"{OVERRIDE}{k}": v for k, v in job_overrides(d, record).items()})
    return {**row, "problem": "; ".join(problems) or None}


def collect(root: str | Path) -> pd.DataFrame:
    """A row per job directory under ``root`` (``job_dir`` says which, ``status`` ok / error /
    corrupt / missing how it ended; see the module docstring)."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    dirs = {f.parent for name in ("result.json", "error.json") for f in root.rglob(name)}
    dirs |= {h.parent for h in root.rglob(".hydra") if h.is_dir()}
    return pd.DataFrame([_job_row(root, d) for d in sorted(dirs)])


def write_table(df: pd.DataFrame, out: str | Path) -> tuple[Path, Path]:
    """results.csv and results.parquet in ``out`` (lists and dicts as JSON text)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    flat = df.copy()
    for c in flat.columns:
        if flat[c].map(lambda x: isinstance(x, (list, dict))).any():
            flat[c] = flat[c].map(lambda x: json.dumps(x) if isinstance(x, (list, dict)) else x)
    csv, pq = out / "results.csv", out / "results.parquet"
    flat.to_csv(csv, index=False)
    flat.to_parquet(pq, index=False)
    return csv, pq


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.collect", description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a sweep dir (multirun/...) or any dir containing job dirs")
    ap.add_argument("--out", help="where to write results.csv / results.parquet and the figures (default: DIR)")
    ap.add_argument("--plot", action="store_true",
                    help="also plot step time, speed-ups and search time against the swept keys (plot_*.png)")
    a = ap.parse_args(argv)
    if not Path(a.dir).is_dir():
        print(f"error: {a.dir} is not a directory: give a sweep dir (multirun/...) or a directory of job dirs", file=sys.stderr)
        return 1
    df = collect(a.dir)
    if df.empty:
        print(f"no result.json or error.json under {a.dir}")
        return 1
    for jd, problem in df.loc[df["problem"].notna(), ["job_dir", "problem"]].itertuples(index=False):
        print(f"{Path(a.dir) / jd}: {problem}", file=sys.stderr)
    try:
        csv, pq = write_table(df, a.out or a.dir)
    except OSError as e:  # a read-only folder, a file in the way: one line naming it
        why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e)
        print(f"error: cannot write results.csv into {a.out or a.dir}: {why}; give --out a directory you can write", file=sys.stderr)
        return 1
    swept = swept_keys(df)
    named = ("model", "cluster", "algo")
    shown = (*named, *(c for c in swept if c.removeprefix(OVERRIDE) not in named), "num_devices", "step_time_s", "lower_bound_s",
             "search_seconds", "oom", "status", "job_dir")
    cols = list(dict.fromkeys(c for c in shown if c in df.columns))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df[cols].to_string(index=False))
    ok = int((df["status"] == "ok").sum())
    print(f"{ok} of {len(df)} jobs have a result" if ok < len(df) else f"{len(df)} jobs", f"-> {csv}, {pq}")
    if a.plot:
        figures = plot_sweep(df, a.out or a.dir)
        print("figures:", ", ".join(map(str, figures)) if figures else "none (no job has a result)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
