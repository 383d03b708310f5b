"""The rank summary of ``experiments sim_accuracy``: how well the simulator orders the strategies
of a model that were run for real (the searches use it to rank, not to predict).

Per model, across its executed strategies: Kendall's tau-b between simulated and measured step
times (:func:`kendall_tau`) and the regret of the simulator's pick (:func:`pick_regret`), with
the profile taken before the run and the one interleaved with it; beside them the noise floor
the repeated rounds show (how far a case's measured step moves between rounds, and how well one
round's measured times rank another's).  Written to ``sim_accuracy_ranks.csv`` and to the
README section between :data:`RANK_SECTION`'s markers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments.common import print_table

#: the simulated step times ranked against ``measured_s`` (the same round's measured step), by the
#: profile they were simulated with: taken before the run, and during that same run
RANK_PROFILES = {"before": "simulated_s", "interleaved": "interleaved_s"}
#: the goal for the ranking with the interleaved profile
TAU_GOAL, REGRET_GOAL = 0.8, 0.05
RANKS_CSV = "sim_accuracy_ranks.csv"
#: the README section the rank summary owns (``--summarize-only`` replaces what lies between)
RANK_SECTION = ("<!-- rank summary: python -m experiments sim_accuracy --summarize-only -->", "<!-- end of rank summary -->")


def _pairs(simulated: Sequence[float], measured: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Which strategies have both a simulated and a measured time (a mask over the inputs), the two
    times as arrays, and why no ranking can be made of them ('' when one can)."""
    s, m = np.asarray(simulated, dtype=float), np.asarray(measured, dtype=float)
    if s.ndim != 1 or s.shape != m.shape:
        raise ValueError(f"simulated {s.shape} and measured {m.shape} times must be two lists of one length")
    keep = np.isfinite(s) & np.isfinite(m)
    n = int(keep.sum())
    why = "" if n >= 2 else f"{n} of {len(s)} strategies have both a simulated and a measured time, a ranking needs 2"
    return keep, s, m, why


def kendall_tau(simulated: Sequence[float], measured: Sequence[float]) -> tuple[float, str]:
    """Kendall's tau-b (``scipy.stats.kendalltau``, ``variant="b"``: a pair tied in either ranking
    counts as neither concordant nor discordant, and the denominator leaves it out on that side)
    between the simulated and the measured step times of one model's strategies, over those with
    both; and why it is NaN where it is ('' otherwise): fewer than 2 such strategies, or one side
    all equal (no ranking to compare)."""
    from scipy.stats import kendalltau

    keep, s, m, why = _pairs(simulated, measured)
    if why:
        return float("nan"), why
    s, m = s[keep], m[keep]
    for side, v in (("simulated", s), ("measured", m)):
        if (v == v[0]).all():
            return float("nan"), f"the {side} times are all equal"
    return float(kendalltau(s, m, variant="b").statistic), ""


def pick_regret(simulated: Sequence[float], measured: Sequence[float]) -> tuple[float, list[int], str]:
    """The regret of the simulator's pick: the measured time of the strategy with the shortest
    simulated step over the shortest measured step, minus 1 (0 when it picks the truly fastest),
    over the strategies with both times.  Where several tie for the shortest simulated step a
    search may return any of them: the regret of their mean measured time.  Returns the regret,
    the picks (indices into the inputs) and why it is NaN where it is ('' otherwise)."""
    keep, s, m, why = _pairs(simulated, measured)
    if why:
        return float("nan"), [], why
    picks = np.flatnonzero(keep & (s == s[keep].min()))
    return float(m[picks].mean() / m[keep].min() - 1.0), picks.tolist(), ""


def _round_noise(ok: pd.DataFrame) -> tuple[dict[str, Any], str]:
    """The noise floor one model's rounds show: the median spread of a case's measured step across
    the rounds (``run_spread``), and, over every pair of rounds, the median tau-b between two
    rounds' measured times of its strategies and the median regret of picking one round's fastest
    judged by the other's; and why the round figures are NaN where they are ('' otherwise)."""
    noise = {"spread_median": float(ok["run_spread"].median()) if "run_spread" in ok else float("nan"),
             "rounds": 0, "rounds_tau_b": float("nan"), "rounds_regret": float("nan")}
    if "measured_runs_ms" not in ok:
        return noise, "no measured_runs_ms column: the rounds' times are unknown"
    runs = [[float(x) for x in str(v).split()] for v in ok["measured_runs_ms"]]
    counts = sorted({len(r) for r in runs})
    if len(counts) > 1:
        return noise, f"its strategies ran {counts} rounds: the rounds cannot be lined up"
    noise["rounds"] = counts[0] if counts else 0
    if noise["rounds"] < 2:
        return noise, f"{noise['rounds']} round: no second one to compare with"
    t = np.array(runs)
    pairs = list(itertools.combinations(range(t.shape[1]), 2))
    taus = [kendall_tau(t[:, i], t[:, j]) for i, j in pairs]
    regrets = [pick_regret(t[:, i], t[:, j])[0] for a, b in pairs for i, j in ((a, b), (b, a))]
    if all(np.isnan(x) for x, _ in taus):
        return noise, f"rounds: {taus[0][1]}"
    noise.update(rounds_tau_b=float(np.nanmedian([x for x, _ in taus])), rounds_regret=float(np.nanmedian(regrets)))
    return noise, ""


def rank_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, across its executed strategies (``status == "ok"``) of a sim_accuracy table: how
    well the simulated step times rank the strategies as the measured ones (``measured_s``) do,
    with the profile taken before the run (``simulated_s``) and the one taken during it
    (``interleaved_s``): Kendall's tau-b (:func:`kendall_tau`), the regret of the simulator's
    pick (:func:`pick_regret`) and the pick; whether the goal (interleaved tau >= 0.8, regret
    <= 5%) is met; the noise floor of the model's rounds (:func:`_round_noise`); and, in
    ``note``, why a figure is NaN.  One row per model, in the table's order."""
    missing = [c for c in ("model", "algo", "status", "measured_s", RANK_PROFILES["before"]) if c not in df]
    if missing:
        raise ValueError(f"sim_accuracy table lacks column(s) {missing}")
    rows = []
    for model, g in df.groupby("model", sort=False):
        ok = g[g["status"] == "ok"]
        meas = ok["measured_s"].to_numpy(dtype=float)
        row: dict[str, Any] = {"model": model, "strategies": len(ok),
                               "fastest": ok["algo"].iloc[int(np.nanargmin(meas))] if np.isfinite(meas).any() else ""}
        notes = []
        for p, col in RANK_PROFILES.items():
            sim = ok[col].to_numpy(dtype=float) if col in ok else np.full(len(ok), np.nan)
            tau, why_tau = kendall_tau(sim, meas)
            regret, picks, why_regret = pick_regret(sim, meas)
            row.update({f"tau_b_{p}": tau, f"regret_{p}": regret, f"pick_{p}": "=".join(ok["algo"].iloc[picks])})
            notes += [f"{p}: {w}" for w in dict.fromkeys((why_tau, why_regret)) if w]
        row["goal_met"] = bool(row["tau_b_interleaved"] >= TAU_GOAL and row["regret_interleaved"] <= REGRET_GOAL)
        noise, why = _round_noise(ok)
        row.update(noise)
        if why:
            notes.append(f"noise: {why}")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows)


def _tau(x: float) -> str:
    return f"{x:+.2f}" if np.isfinite(x) else "n/a"


def _share(x: float) -> str:
    return f"{x * 100:.1f}%" if np.isfinite(x) else "n/a"


def rank_section(summary: pd.DataFrame, df: pd.DataFrame) -> str:
    """The README section of the rank summary (between the :data:`RANK_SECTION` markers)."""
    ok = df[df["status"] == "ok"]
    spread = float(ok["run_spread"].median()) if "run_spread" in ok and len(ok) else float("nan")
    lines = [
        RANK_SECTION[0],
        "## Ranking the strategies: Kendall's tau and the regret of the simulator's pick",
        "",
        f"Per model, across the strategies executed for it ({RANKS_CSV}): Kendall's tau-b (`scipy.stats.kendalltau`,",
        "variant b: a pair tied in either ranking counts as neither concordant nor discordant) between the simulated and the",
        "measured step times, and the regret of the simulator's pick: the measured time of the strategy it ranks fastest",
        "over the fastest measured time, minus 1 (where strategies tie for its fastest, a search may return any of them:",
        "their mean measured time).  Measured = the row's measured step; simulated with the profile taken before the run",
        "(`simulated_s`) and with the one taken during that same run (`interleaved_s`).  A model's rows can come from",
        "different rounds (each reports the round with its median error), so its before-run times can come from different",
        f"profiles.  Goal, with the interleaved profile: tau >= {TAU_GOAL:g} and regret <= {REGRET_GOAL * 100:g}%.",
        "",
        f"Noise floor, from the rounds this run took: a case's measured step moved by a median {_share(spread)} between its",
        f"rounds (spread, (max - min) / median, over {len(ok)} cases; per model below).  Rounds: tau-b between two rounds'",
        "measured times of the same strategies, and the regret of picking one round's fastest judged by another round's,",
        "the median over the pairs of rounds: what a ranking made in advance, even one that predicted a round's measurement",
        "exactly, can expect against another round.  The interleaved figures pair each strategy's simulated step with the",
        "very run it is compared with, so they can come out above that; the measured order they are scored against is",
        "itself one sample of an order that moves by as much between rounds.",
        "",
        "| model | strategies | fastest measured | before: tau-b | regret | pick | interleaved: tau-b | regret | pick | goal met | spread "
        "| rounds: tau-b | regret |",
        "|---|---:|---|---:|---:|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for _, r in summary.iterrows():
        lines.append(f"| {r['model']} | {r['strategies']} | {r['fastest']} | {_tau(r['tau_b_before'])} | {_share(r['regret_before'])} | "
                     f"{r['pick_before']} | {_tau(r['tau_b_interleaved'])} | {_share(r['regret_interleaved'])} | {r['pick_interleaved']} | "
                     f"{'yes' if r['goal_met'] else 'no'} | {_share(r['spread_median'])} | {_tau(r['rounds_tau_b'])} | "
                     f"{_share(r['rounds_regret'])} |")
    lines += ["", f"Goal met with the interleaved profile for {int(summary['goal_met'].sum())} of {len(summary)} models."]
    notes = summary[summary["note"] != ""]
    if len(notes):
        lines += ["", "Figures left out:", ""] + [f"* {r['model']}: {r['note']}" for _, r in notes.iterrows()]
    lines += ["", f"Regenerate this section and {RANKS_CSV} from sim_accuracy.csv, measuring nothing:",
              "`python -m experiments sim_accuracy --summarize-only` (reads and writes only the --out directory).", RANK_SECTION[1]]
    return "\n".join(lines)


def write_rank_summary(df: pd.DataFrame, out: Path) -> pd.DataFrame:
    """Compute the rank summary of a sim_accuracy table, write it to ``out/sim_accuracy_ranks.csv``
    and put its section into ``out/README.md`` (replacing the section there, appended otherwise);
    return it."""
    summary = rank_summary(df)
    summary.to_csv(out / RANKS_CSV, index=False)
    readme = out / "README.md"
    text, section = (readme.read_text() if readme.is_file() else ""), rank_section(summary, df)
    begin, end = RANK_SECTION
    if begin in text and end in text[text.index(begin):]:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + section + "\n"
    readme.write_text(text)
    return summary


def print_rank_summary(summary: pd.DataFrame) -> None:
    """The per-model rank figures, on stdout."""
    rows = [{"model": r["model"], "n": r["strategies"],
             "tau_b_before": _tau(r["tau_b_before"]), "regret_before": _share(r["regret_before"]),
             "tau_b_interleaved": _tau(r["tau_b_interleaved"]), "regret_interleaved": _share(r["regret_interleaved"]),
             "pick_interleaved": r["pick_interleaved"], "fastest": r["fastest"], "goal_met": r["goal_met"],
             "spread": _share(r["spread_median"]), "rounds_tau_b": _tau(r["rounds_tau_b"]), "rounds_regret": _share(r["rounds_regret"])}
            for _, r in summary.iterrows()]
    print_table(rows, list(rows[0]) if rows else ["model"],
                title=f"ranking the strategies per model (goal, interleaved: tau-b >= {TAU_GOAL:g}, regret <= {REGRET_GOAL * 100:g}%; "
                      "spread and rounds = the noise floor of the run's rounds)")
    for _, r in summary[summary["note"] != ""].iterrows():
        print(f"  {r['model']}: {r['note']}")
