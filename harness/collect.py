"""``python -m harness.collect DIR``: one table from a sweep (or any tree of job dirs).

Every ``result.json`` under DIR becomes a row (nested keys flattened with dots, lists kept
as JSON text in the CSV); a job that failed and left an ``error.json`` becomes a row with
its error, so a partial sweep still gives a table.  Writes ``results.csv`` and
``results.parquet`` into DIR (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
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


def collect(root: str | Path) -> pd.DataFrame:
    """All job results under ``root`` as one DataFrame (``job_dir`` says where each came from)."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    rows: list[dict[str, Any]] = []
    for f in sorted(root.rglob("result.json")):
        row = _flatten(json.loads(f.read_text()))
        row["job_dir"] = str(f.parent.relative_to(root))
        row["status"] = "ok"
        rows.append(row)
    done = {r["job_dir"] for r in rows}
    for f in sorted(root.rglob("error.json")):
        jd = str(f.parent.relative_to(root))
        if jd in done:
            continue
        err = json.loads(f.read_text())
        rows.append({"job_dir": jd, "status": "error", "error": err.get("error"), "overrides": " ".join(err.get("overrides", []))})
    return pd.DataFrame(rows)


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
    csv, pq = write_table(df, a.out or a.dir)
    cols = [c for c in ("model", "cluster", "algo", "num_devices", "step_time_s", "lower_bound_s", "search_seconds", "oom", "status") if c in df.columns]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df[cols].to_string(index=False))
    print(f"{len(df)} jobs -> {csv}, {pq}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
