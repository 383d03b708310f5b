"""Shared helpers for experiment scripts: config composition, output dirs, figure style."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
CONF = REPO / "conf"
#: where a smoke run (--quick) writes unless --out says where: never the committed results/
SCRATCH = REPO / "outputs" / "experiments_quick"


def compose(overrides: Sequence[str] = ()) -> Any:
    """The config ``python -m harness <overrides>`` would run, without starting a Hydra job."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hcompose(config_name="config", overrides=list(overrides))


def zoo_models() -> list[str]:
    """Names of the PyTorch zoo models (every conf/model file that captures a torch module, but custom)."""
    out = []
    for f in sorted((CONF / "model").glob("*.yaml")):
        d = yaml.safe_load(f.read_text()) or {}
        if d.get("_target_") == "harness.models.TorchModel" and f.stem != "custom":
            out.append(f.stem)
    return out


def output_dir(args: argparse.Namespace, *parts: str) -> Path:
    """The directory an experiment writes into (created), from its ``--out`` and ``--quick``
    arguments: ``--out`` when given; else, for a smoke run (``--quick``), the scratch directory
    ``outputs/experiments_quick/<parts>``; else the committed ``results/<parts>``.  A committed
    artefact thus changes only when its full run is asked for."""
    p = Path(args.out) if args.out else (SCRATCH if args.quick else RESULTS).joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def style() -> None:
    """One figure style for every experiment, readable in black and white."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.rcParams.update({
        "figure.dpi": 110,
        "font.size": 9,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.prop_cycle": cycler(color=["#1b1b1b", "#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3"])
        + cycler(linestyle=["-", "--", "-.", ":", "-", "--", "-."])
        + cycler(marker=["o", "s", "^", "D", "v", "x", "*"]),
        "hatch.linewidth": 0.6,
    })


HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo"]

_COLORS = ["#1b1b1b", "#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3"]
_MARKERS = ["o", "s", "^", "D", "v", "x", "*"]
_LINES = ["-", "--", "-.", ":"]


def series_style(i: int) -> dict[str, Any]:
    """Matplotlib keywords for the i-th of many series (an algorithm per series), distinct in
    black and white: 7 markers, hollow from the 8th series on, a line style per block of 7,
    and the colour shifted each block so no two of the first 28 series look alike."""
    block = i // len(_MARKERS)
    color = _COLORS[(i + block) % len(_COLORS)]
    return {"color": color, "marker": _MARKERS[i % len(_MARKERS)], "linestyle": _LINES[block % len(_LINES)],
            "markerfacecolor": color if block % 2 == 0 else "none"}


def print_table(rows: Iterable[dict[str, Any]], cols: Sequence[str], title: str | None = None) -> str:
    """A plain-text table (also returned, for README files)."""
    rows = list(rows)
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    w = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ([title] if title else []) + ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols))]
    lines.append("  ".join("-" * x for x in w))
    lines += ["  ".join(x[i].ljust(w[i]) for i in range(len(cols))) for x in cells]
    text = "\n".join(lines)
    print(text)
    return text
