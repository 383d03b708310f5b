"""``python -m experiments NAME [args]`` runs ``experiments/NAME.py``; ``list`` lists them.  A
user's mistake (a :class:`~harness.core.errors.UserError`: an output directory that cannot be
written, a config the harness refuses) ends it with one line and status 1, Ctrl-C with
``interrupted`` and status 130."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import experiments
from harness.core.errors import UserError

HELPERS = {"common"}  # modules starting with "_" are helpers too


def names() -> list[str]:
    """Every experiment: a module of this package with a ``main(argv)`` (helpers excluded)."""
    return sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_") and m.name not in HELPERS)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print("experiments (python -m experiments NAME [--help]):")
        for n in names():
            mod = importlib.import_module(f"experiments.{n}")
            doc = (mod.__doc__ or "").strip().splitlines()
            print(f"  {n:<24} {doc[0] if doc else ''}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in names():
        print(f"unknown experiment {name!r}; available: {', '.join(names())}", file=sys.stderr)
        return 2
    mod = importlib.import_module(f"experiments.{name}")
    try:
        return int(mod.main(rest) or 0)
    except UserError as e:  # a mistake in what was asked (an output dir, a config): one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
