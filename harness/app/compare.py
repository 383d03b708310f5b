"""``python -m harness.compare A B``: what differs between two runs, or two sweeps.

A and B are each a job directory (one with a ``result.json``) or a sweep directory (one with
job directories below it).  For two jobs it prints the config keys whose values differ
(result.json's ``config``, else the job's ``.hydra/config.yaml``, the digests of the input
files, and the commit and package versions that ran it) and, for every figure - step time,
lower bound, peak memory, bytes moved, search time, the speed-ups over one device and over
data parallelism - A, B and B / A.  For two sweeps it
prints the override keys whose values differ between them, matches the jobs of A with those of
B by their other overrides, and prints a table per figure, one row per matched pair; jobs
without a partner are listed.  A directory that is missing or holds no job is one line
(``error: ...``) and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import yaml

from harness.app.collect import collect, job_overrides
from harness.app.run import NON_RESULT_KEYS
from harness.app.summary import format_bytes, format_seconds
from harness.core.errors import UserError


class CompareError(UserError):
    """A or B is not something to compare: missing, holds no job, or a job and a sweep."""


def _max(v: Any) -> Any:
    return max(v) if isinstance(v, list) and v else v


#: (label, result key, how to show a value, how to reduce it first)
FIGURES: tuple[tuple[str, str, Callable[[float], str], Callable[[Any], Any]], ...] = (
    ("step time", "step_time_s", format_seconds, lambda v: v),
    ("lower bound", "lower_bound_s", format_seconds, lambda v: v),
    ("peak memory", "peak_memory_bytes", format_bytes, _max),
    ("bytes moved", "comm_bytes", format_bytes, lambda v: v),
    ("search time", "search_seconds", format_seconds, lambda v: v),
    ("vs one device", "speedup_vs_single_device", lambda x: f"{x:.3f}x", lambda v: v),
    ("vs data parallel", "speedup_vs_data_parallel", lambda x: f"{x:.3f}x", lambda v: v),
)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": value}`` (lists kept whole)."""
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def kind_of(path: Path) -> str:
    """``"job"`` (a directory with a result.json) or ``"sweep"`` (job directories below it);
    :class:`CompareError` for anything else."""
    if not path.exists():
        raise CompareError(f"{path} does not exist: give a job dir (with result.json) or a sweep dir")
    if not path.is_dir():
        raise CompareError(f"{path} is not a directory: give a job dir (with result.json) or a sweep dir")
    if (path / "result.json").is_file():
        return "job"
    if (path / "error.json").is_file():
        try:
            why = json.loads((path / "error.json").read_text()).get("error")
        except (OSError, ValueError, AttributeError):
            why = "unreadable"
        raise CompareError(f"{path} is a job that failed ({why}): it has no result to compare")
    if any(path.rglob("result.json")):
        return "sweep"
    raise CompareError(f"{path} holds no job: no result.json in it or below it")


def read_result(job: Path) -> dict[str, Any]:
    """A job's result.json; :class:`CompareError` when it cannot be read."""
    try:
        rec = json.loads((job / "result.json").read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"{job / 'result.json'} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(rec, dict):
        raise CompareError(f"{job / 'result.json'} is not a JSON object")
    return rec


def job_config(job: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The flat config that could change a job's result: result.json's ``config`` (and its
    ``input_files`` digests), else the job's ``.hydra/config.yaml`` without the keys that
    cannot change a result; and the code that ran it (``code.git_sha``, ``code.versions.*``)."""
    cfg = result.get("config")
    if not isinstance(cfg, dict):
        try:
            cfg = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        except (OSError, yaml.YAMLError):
            cfg = None
        cfg = {k: v for k, v in (cfg or {}).items() if k not in NON_RESULT_KEYS}
    out = flatten(cfg)
    out.update({f"input_files.{k}": v for k, v in (result.get("input_files") or {}).items()})
    out.update({f"code.versions.{k}": v for k, v in (result.get("versions") or {}).items()})
    out["code.git_sha"] = result.get("git_sha")
    return out


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, value in a, value in b)`` for every key whose values differ (missing: None)."""
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def figure(rec: dict[str, Any], key: str, reduce: Callable[[Any], Any]) -> float | None:
    """A figure of a result, or None when it has none (or not a finite number)."""
    v = reduce(rec.get(key))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def ratio(a: float | None, b: float | None) -> str:
    """B / A, or "-" when it is not a number."""
    return f"{b / a:.3f}" if a is not None and b is not None and a > 0 else "-"


def compare_jobs(a: Path, b: Path) -> str:
    """The report on two job directories (see the module docstring)."""
    ra, rb = read_result(a), read_result(b)
    lines = [f"A: {a}", f"B: {b}", ""]
    diff = config_diff(job_config(a, ra), job_config(b, rb))
    if diff:
        lines.append("config that differs:")
        w = max(len(k) for k, _, _ in diff)
        lines += [f"  {k:<{w}}  A={va!r}  B={vb!r}" for k, va, vb in diff]
    else:
        lines.append("config: the same")
    rows = [("figure", "A", "B", "B/A")]
    for label, key, show, reduce in FIGURES:
        fa, fb = figure(ra, key, reduce), figure(rb, key, reduce)
        if fa is None and fb is None:
            continue
        rows.append((label, show(fa) if fa is not None else "-", show(fb) if fb is not None else "-", ratio(fa, fb)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines.append("")
    lines += [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}" for r in rows]
    return "\n".join(lines)


def _jobs(sweep: Path) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """``(overrides, result)`` of every job with a result under ``sweep``; overrides of keys that
    cannot change a result (``output.*``, ``resume``, ``debug``) left out."""
    df = collect(sweep)
    out = []
    for jd in df.loc[df["status"] == "ok", "job_dir"]:
        d = sweep / jd
        ov = {k: v for k, v in job_overrides(d).items() if k.split(".", 1)[0] not in NON_RESULT_KEYS}
        out.append((ov, read_result(d)))
    return out


def differing_keys(a: list[dict[str, str]], b: list[dict[str, str]]) -> list[str]:
    """The override keys whose sets of values differ between the jobs of two sweeps."""
    keys = {k for ov in a + b for k in ov}

    def values(jobs: list[dict[str, str]], k: str) -> set[str | None]:
        return {ov.get(k) for ov in jobs}

    return sorted(k for k in keys if values(a, k) != values(b, k))


def pair_jobs(ja: list[tuple[dict[str, str], dict[str, Any]]], jb: list[tuple[dict[str, str], dict[str, Any]]],
              differ: list[str]) -> tuple[list[tuple[dict[str, str], dict[str, str], dict[str, Any], dict[str, Any]]],
                                          list[dict[str, str]], list[dict[str, str]]]:
    """Every job of A with every job of B whose overrides agree outside ``differ``: ``(overrides
    of A, overrides of B, result of A, result of B)``; and the overrides of the jobs of A and of
    B that found no partner."""
    def key(ov: dict[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v) for k, v in ov.items() if k not in differ))

    by_b: dict[tuple[tuple[str, str], ...], list[tuple[dict[str, str], dict[str, Any]]]] = {}
    for ov, rec in jb:
        by_b.setdefault(key(ov), []).append((ov, rec))
    pairs, alone_a, matched = [], [], set()
    for ov, rec in ja:
        partners = by_b.get(key(ov), [])
        if not partners:
            alone_a.append(ov)
        else:
            matched.add(key(ov))
        pairs += [(ov, ov_b, rec, rec_b) for ov_b, rec_b in partners]
    alone_b = [ov for k, jobs in by_b.items() if k not in matched for ov, _ in jobs]
    return pairs, alone_a, alone_b


def compare_sweeps(a: Path, b: Path) -> str:
    """The report on two sweep directories (see the module docstring)."""
    ja, jb = _jobs(a), _jobs(b)
    differ = differing_keys([ov for ov, _ in ja], [ov for ov, _ in jb])
    lines = [f"A: {a} ({len(ja)} jobs with a result)", f"B: {b} ({len(jb)} jobs with a result)", ""]
    if differ:
        lines.append("overrides that differ:")
        for k in differ:
            va = sorted({str(ov.get(k, "(not set)")) for ov, _ in ja})
            vb = sorted({str(ov.get(k, "(not set)")) for ov, _ in jb})
            lines.append(f"  {k}  A: {', '.join(va)}  B: {', '.join(vb)}")
    else:
        lines.append("overrides: the same keys and values")
    pairs, alone_a, alone_b = pair_jobs(ja, jb, differ)
    same_keys = sorted({k for ov, _, _, _ in pairs for k in ov if k not in differ})
    for label, key, show, reduce in FIGURES:
        table = []
        for ov_a, ov_b, ra, rb in pairs:
            fa, fb = figure(ra, key, reduce), figure(rb, key, reduce)
            if fa is None and fb is None:
                continue
            table.append({**{k: ov_a.get(k, "") for k in same_keys},
                          **{f"{k} (A)": ov_a.get(k, "") for k in differ}, **{f"{k} (B)": ov_b.get(k, "") for k in differ},
                          "A": show(fa) if fa is not None else "-", "B": show(fb) if fb is not None else "-", "B/A": ratio(fa, fb)})
        if table:
            lines += ["", f"{label}:", pd.DataFrame(table).to_string(index=False)]
    if not pairs:
        lines += ["", "no job of A has a partner in B with the same other overrides"]
    for name, alone in (("A", alone_a), ("B", alone_b)):
        if alone:
            lines.append(f"jobs of {name} without a partner: "
                         + "; ".join(" ".join(f"{k}={v}" for k, v in sorted(ov.items())) or "(no overrides)" for ov in alone))
    return "\n".join(lines)


def compare(a: str | Path, b: str | Path) -> str:
    """The report on A and B: two jobs or two sweeps (:class:`CompareError` otherwise)."""
    a, b = Path(a), Path(b)
    ka, kb = kind_of(a), kind_of(b)
    if ka != kb:
        raise CompareError(f"{a} is a {ka} and {b} a {kb}: compare two job dirs or two sweep dirs")
    return compare_jobs(a, b) if ka == "job" else compare_sweeps(a, b)


def main(argv: list[str] | None = None) -> int:
    """The command: print :func:`compare`'s report, or one line for a mistake."""
    ap = argparse.ArgumentParser(prog="python -m harness.compare", description=__doc__.splitlines()[0])
    ap.add_argument("a", help="a job dir (with result.json) or a sweep dir")
    ap.add_argument("b", help="another of the same kind")
    args = ap.parse_args(argv)
    try:
        print(compare(args.a, args.b))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
