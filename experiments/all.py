"""Regenerate every table and figure of the four papers (and the cross-paper studies).

``python -m experiments all`` runs every experiment in order into ``results/<paper>/``;
``--quick`` runs each one's quick mode (small models, batches and device counts) into a
scratch directory (``outputs/experiments_quick/<paper>/`` unless ``--out``: each experiment's
``--quick`` writes there, see ``experiments.common.output_dir``), so the committed results are
never overwritten by a smoke run.  An experiment that fails is reported and
the others still run; the exit status says whether all succeeded.
"""

from __future__ import annotations

import importlib
import time
import traceback
from pathlib import Path

from experiments.common import OneLineParser, out_dir_arg

#: run order: producers before the experiments that reuse their files (optcnn_fig7 writes
#: the sweep fig8 / table4 read, pase_search_time the strategies pase_speedup reads)
ORDER = [
    "graph_stats",
    "fddps_table3", "fddps_table5", "fddps_table7", "fddps_fig4", "fddps_fig5",
    "celeritas_table2", "celeritas_table3", "celeritas_table4", "celeritas_table5",
    "optcnn_table3", "optcnn_fig7", "optcnn_fig8", "optcnn_table4", "optcnn_table5",
    "pase_search_time", "pase_speedup",
    "sim_accuracy", "comm_fit", "gpu_accuracy", "llm_accuracy", "llm_plans",
    "leaderboard",
    "scaling",
]
PAPERS = ("fddps", "celeritas", "optcnn", "pase")


def out_dir(name: str, root: Path) -> Path:
    """Where an experiment writes in a run with ``--out``: its paper's dir, or its own."""
    prefix = name.split("_", 1)[0]
    return root / (prefix if prefix in PAPERS else name)


def experiments() -> list[str]:
    from experiments.__main__ import names

    known = set(names()) - {"all"}
    return [n for n in ORDER if n in known] + sorted(known - set(ORDER))


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m experiments all", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every experiment's quick mode, into a scratch dir")
    ap.add_argument("--out", default=None, type=out_dir_arg, help="root for all outputs (default: results/, or outputs/experiments_quick with --quick)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these experiments")
    ap.add_argument("--skip", nargs="*", default=(), help="experiments to leave out")
    a = ap.parse_args(argv)
    root = Path(a.out) if a.out else None
    names = [n for n in (a.only or experiments()) if n not in set(a.skip)]
    status: dict[str, tuple[str, float]] = {}
    for i, name in enumerate(names, 1):
        args = (["--quick"] if a.quick else []) + (["--out", str(out_dir(name, root))] if root is not None else [])
        print(f"\n=== [{i}/{len(names)}] python -m experiments {name} {' '.join(args)}", flush=True)
        t0 = time.perf_counter()
        try:
            rc = int(importlib.import_module(f"experiments.{name}").main(args) or 0)
            status[name] = ("ok" if rc == 0 else f"exit {rc}", time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - one failing experiment must not stop the others
            traceback.print_exc()
            status[name] = (f"failed: {type(e).__name__}: {e}", time.perf_counter() - t0)
    print("\n=== summary")
    for name, (st, dt) in status.items():
        print(f"  {name:<22} {dt:8.1f} s  {st}")
    return 0 if all(st == "ok" for st, _ in status.values()) else 1
