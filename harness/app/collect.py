"""``python -m harness.collect DIR``: one table from a sweep (or any tree of job dirs).

Every job directory under DIR (one with ``result.json``, ``error.json`` or Hydra's ``.hydra/``)
becomes a row: its result (status ``ok``; nested keys flattened with dots, lists kept as JSON
text in the CSV), or its error (status ``error``), or status ``corrupt`` (its result.json or
error.json cannot be read) or ``missing`` (it has neither: the job never finished).  Column
``problem`` names each corrupt or missing file; the command prints them on stderr and still
writes the table, and says ``N of M jobs`` when some have no result.  Writes ``results.csv`` and
``results.parquet`` into DIR (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd


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


def _job_row(root: Path, d: Path) -> dict[str, Any]:
    """The row of one job directory."""
    row: dict[str, Any] = {"job_dir": str(d.relative_to(root)), "status": "missing"}
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
            row.update(status="error", error=rec.get("error"), overrides=" ".join(map(str, rec.get("overrides") or [])))
    if row["status"] == "missing":
        row["status"] = "corrupt" if problems else "missing"
        problems = problems or ["no result.json or error.json: the job did not finish"]
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
    ap.add_argument("--out", help="where to write results.csv / results.parquet (default: DIR)")
    a = ap.parse_args(argv)
    df = collect(a.dir)
    if df.empty:
        print(f"no result.json or error.json under {a.dir}")
        return 1
    for jd, problem in df.loc[df["problem"].notna(), ["job_dir", "problem"]].itertuples(index=False):
        print(f"{Path(a.dir) / jd}: {problem}", file=sys.stderr)
    csv, pq = write_table(df, a.out or a.dir)
    shown = ("model", "cluster", "algo", "num_devices", "step_time_s", "lower_bound_s", "search_seconds", "oom", "status", "job_dir")
    cols = [c for c in shown if c in df.columns]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df[cols].to_string(index=False))
    ok = int((df["status"] == "ok").sum())
    print(f"{ok} of {len(df)} jobs have a result" if ok < len(df) else f"{len(df)} jobs", f"-> {csv}, {pq}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
