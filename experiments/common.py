"""Shared helpers for experiment scripts: the registered algorithms and
models, the command line every experiment shares and its output dir, figure style."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Sequence

import yaml

from harness.app.compose import CONF
from harness.core.errors import OutputError

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
#: where a smoke run (--quick) writes unless --out says where: never the committed results/
SCRATCH = REPO / "outputs" / "experiments_quick"


def zoo_models() -> list[str]:
    """Names of the PyTorch zoo models (every conf/model file that captures a torch module, but custom)."""
    out = []
    for f in sorted((CONF / "model").glob("*.yaml")):
        d = yaml.safe_load(f.read_text()) or {}
        if d.get("_target_") == "harness.core.models.TorchModel" and f.stem != "custom":
            out.append(f.stem)
    return out


#: variant columns: a registered algorithm with other settings (``NAME@SETTING`` -> overrides); data
#: parallelism costed on the layer graph is the like-for-like reference for the layer-graph
#: algorithms (the same strategy as data_parallel, at their granularity)
VARIANTS: dict[str, list[str]] = {"data_parallel@layer": ["algo=data_parallel", "algo.graph=layer"]}


def needs_input(name: str) -> list[str]:
    """The keys of ``conf/algo/<name>.yaml`` that are mandatory (``???``): an algorithm with one
    needs an input the user gives (``algo=from_file algo.path=...``), so runs over every
    registered algorithm (:func:`algorithms`, the CLI and contract tests) leave it out."""
    d = yaml.safe_load((CONF / "algo" / f"{name}.yaml").read_text()) or {}
    return sorted(k for k, v in d.items() if v == "???")


def algorithms() -> list[str]:
    """Every registered algorithm (a file of conf/algo: its module and YAML are all an
    algorithm needs to be here) but those that need an input (:func:`needs_input`), then the
    :data:`VARIANTS`."""
    return sorted(p.stem for p in (CONF / "algo").glob("*.yaml") if not needs_input(p.stem)) + sorted(VARIANTS)


def algo_overrides(name: str) -> list[str]:
    """The ``python -m harness`` overrides that select algorithm ``name`` of :func:`algorithms`."""
    return list(VARIANTS.get(name, [f"algo={name}"]))


#: the keys by which an algorithm's YAML declares a wall-clock budget of its search
BUDGET_KEYS = ("budget_s", "time_budget_s")


def budget_overrides(name: str, seconds: float) -> list[str]:
    """Overrides that give algorithm ``name`` of :func:`algorithms` a search budget of ``seconds``,
    by the budget key its YAML declares (none when it declares none): what lets a grid with a
    time limit per cell get an answer from every search instead of a timeout."""
    base = next((o.split("=", 1)[1] for o in algo_overrides(name) if o.startswith("algo=")), name)
    d = yaml.safe_load((CONF / "algo" / f"{base}.yaml").read_text()) or {}
    return [f"algo.{k}={seconds:g}" for k in BUDGET_KEYS if k in d]


def model_overrides(name: str, batch: int | None = None) -> list[str]:
    """The ``python -m harness`` overrides of a model at a batch size (None: the model's own)."""
    return [f"model={name}"] + ([f"model.batch_size={batch}"] if batch else [])


# ---------------------------------------------------------------------------- command line
class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line (``error: PROG: argument --out: ...``, status 2)
    instead of the usage and the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (--help lists the options)\n")


def model_names() -> list[str]:
    """Every model of ``conf/model`` (what ``--models`` may name)."""
    return sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


def parse_model(spec: str) -> tuple[str, int | None]:
    """``NAME[:BATCH]`` -> (name, batch or None); NAME must be a model of ``conf/model``."""
    name, sep, batch = spec.partition(":")
    if not name or (sep and not (batch.isdigit() and int(batch) > 0)):
        raise argparse.ArgumentTypeError(f"{spec!r} is not NAME or NAME:BATCH (a positive batch size)")
    if name not in model_names():
        raise argparse.ArgumentTypeError(f"unknown model {name!r}: the models (conf/model) are {', '.join(model_names())}")
    return name, int(batch) if sep else None


def out_dir_arg(value: str) -> str:
    """The argparse ``type`` of ``--out``: a directory, existing or not; an empty one (which would
    mean the default, results/ among them) or a file is refused."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty --out names no directory: give one, or leave --out out for the default")
    if Path(value).exists() and not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"--out {value} is a file, not a directory: give a directory")
    return value


def _model_spec(batch: str | None) -> Callable[[str], str]:
    """The argparse ``type`` of ``--models``: checks one NAME[:BATCH] and keeps it as written."""
    def check(spec: str) -> str:
        if parse_model(spec)[1] is not None and batch is None:
            raise argparse.ArgumentTypeError(f"{spec!r}: this experiment takes model names only (its batch sizes have their own option)")
        return spec
    return check


def experiment_args(name: str, doc: str | None, topic: str, *, quick: str, models: str | None = None,
                    batch: str | None = "the model's own batch size") -> argparse.ArgumentParser:
    """The parser of ``python -m experiments NAME`` with the options every experiment shares
    (the experiment adds its own):

    * ``--quick``: small settings (seconds) -- ``quick`` says which -- into the scratch dir;
    * ``--out DIR``: where to write (:func:`output_dir`: default ``results/<topic>``, with
      ``--quick`` ``outputs/experiments_quick/<topic>``; an empty DIR or a file is refused, so
      ``--out ''`` never falls back to the committed results/);
    * ``--models NAME[:BATCH] ...`` when ``models`` is given (it describes the default list):
      the models to run instead of the default, an explicit list winning over ``--quick``'s;
      ``batch`` says what a NAME without ``:BATCH`` runs at, None where the experiment sets
      batch sizes otherwise (a ``:BATCH`` is then an error).  :func:`models_of` resolves it.
    """
    ap = OneLineParser(prog=f"python -m experiments {name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.set_defaults(topic=topic)
    ap.add_argument("--quick", action="store_true", help=f"{quick}; into outputs/experiments_quick/{topic} unless --out")
    ap.add_argument("--out", default=None, metavar="DIR", type=out_dir_arg,
                    help=f"output dir (default results/{topic}; --quick: outputs/experiments_quick/{topic})")
    if models is not None:
        what = "NAME[:BATCH]" if batch is not None else "NAME"
        ap.add_argument("--models", nargs="*", default=None, type=_model_spec(batch), metavar=what,
                        help=f"models to run (default: {models})" + (f"; a NAME without :BATCH runs at {batch}" if batch else ""))
    return ap


def models_of(args: argparse.Namespace, full: Sequence[str | tuple[str, int | None]],
              quick: Sequence[str | tuple[str, int | None]] | None = None, batches: dict[str, int] | None = None,
              fallback: int | None = None) -> list[tuple[str, int | None]]:
    """The (model, batch) pairs a run of :func:`experiment_args` covers: its ``--models``, else
    the ``quick`` list for ``--quick``, else ``full`` (entries ``NAME[:BATCH]`` or (name, batch));
    a model without a batch runs at ``batches[NAME]``, else at ``fallback`` (None: its own)."""
    chosen = args.models or (quick if (args.quick and quick is not None) else full)
    pairs = [parse_model(x) if isinstance(x, str) else (x[0], x[1]) for x in chosen]
    return [(m, b if b is not None else (batches or {}).get(m, fallback)) for m, b in pairs]


def output_dir(args: argparse.Namespace, *parts: str) -> Path:
    """The directory an experiment writes into (created), from its ``--out`` and ``--quick``
    arguments: ``--out`` when given; else, for a smoke run (``--quick``), the scratch directory
    ``outputs/experiments_quick/<parts>``; else the committed ``results/<parts>``.  A committed
    artefact thus changes only when its full run is asked for.  ``parts`` default to the topic
    of :func:`experiment_args`.  An ``--out`` given but empty is refused (it is not "the default"),
    and a directory that cannot be made is an :class:`OutputError` naming it."""
    parts = parts or (args.topic,)
    if args.out is not None and not str(args.out).strip():
        raise OutputError("an empty --out names no directory: give one, or leave --out out for the default")
    p = Path(args.out) if args.out else (SCRATCH if args.quick else RESULTS).joinpath(*parts)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e)
        raise OutputError(f"cannot write the output directory {p} ({'--out' if args.out else 'the default'}): {why}") from e
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


def md_cell(text: Any) -> str:
    """Text in a Markdown table cell (a ``|`` escaped)."""
    return str(text).replace("|", "\\|")


def frame_markdown(df: Any, cols: Sequence[str], fmt: dict[str, str] | None = None) -> str:
    """The columns ``cols`` of a DataFrame as a Markdown table: floats by ``fmt`` (a format per
    column; 3 significant digits otherwise), a non-finite float as ``n/a``, text escaped."""
    import math

    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for col in cols:
            v = r.get(col, "")
            if isinstance(v, float):  # numpy's float64 is a float
                cells.append("n/a" if not math.isfinite(v) else fmt.get(col, "{:.3g}").format(v))
            else:
                cells.append(md_cell(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parity_plot(path: Path, lo: float, hi: float, draw: Callable[[Any], None], *, xlabel: str, ylabel: str, title: str,
                figsize: tuple[float, float] = (6.4, 5.8)) -> None:
    """A predicted-against-published figure, log-log over ``[lo, hi]`` on both axes: the +-25 % and
    +-10 % bands round the diagonal, ``draw(ax)`` adds the points, the legend top left."""
    style()
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=figsize)
    xs = np.geomspace(lo, hi, 50)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="#999999", alpha=0.18, label="+-25 %")
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="#555555", alpha=0.25, label="+-10 %")
    ax.plot(xs, xs, color="black", lw=0.8, ls="-", marker="")
    draw(ax)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
