"""The layout's rules, read from the imports of every module (issue 20).

* The core ring (``harness.core``: graph IR, capture and zoo, clusters, costs, strategy)
  imports nothing of the harness outside it, nor ``algorithms``, ``simulators`` or ``experiments``.
* Data flows one way: ``algorithms`` and ``simulators`` see the core only and never each other
  (an algorithm never reaches into the simulator; the simulator never knows the algorithm);
  the app ring (``harness`` outside its core: run, CLI, jobs, collect, measurement) may use
  them all but ``experiments``, which sits on top.
* No private name (``_x``) is imported from another module, and a test imports shared helpers
  from a helpers module, never from another test module or ``conftest``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "algorithms", "simulators", "experiments")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(*roots: str) -> dict[str, Path]:
    out = {}
    for root in roots:
        for p in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" not in p.parts:
                out[module_name(p)] = p
    return out


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every import of a file, anywhere in it: (line, module, names imported from it)."""
    found = []
    pkg = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: resolve against the importing package
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join([*base, mod] if mod else base)
            found.append((node.lineno, mod, [a.name for a in node.names]))
    return found


def ring(mod: str) -> str | None:
    """Which part of the layout a module belongs to."""
    top = mod.split(".")[0]
    if top == "harness":
        return "core" if mod == "harness.core" or mod.startswith("harness.core.") else "app"
    return top if top in PACKAGES else None


#: what each part may import (besides itself, the standard library and third-party packages)
ALLOWED = {
    "core": {"core"},
    "algorithms": {"core", "algorithms"},
    "simulators": {"core", "simulators"},
    "app": {"core", "app", "algorithms", "simulators"},
    "experiments": {"core", "app", "algorithms", "simulators", "experiments"},
}


def test_the_core_ring_exists():
    core = [m for m in modules("harness") if ring(m) == "core"]
    assert {"harness.core.graph", "harness.core.cluster", "harness.core.costs", "harness.core.strategy"} <= set(core)


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_flow_one_way(part):
    bad = []
    for mod, path in modules(*PACKAGES).items():
        if ring(mod) != part:
            continue
        for line, target, _ in imports(path):
            to = ring(target)
            if to is not None and to not in ALLOWED[part]:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {target} ({part} -> {to})")
    assert not bad, "\n".join(bad)


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for mod, path in modules(*PACKAGES, "tests").items():
        for line, target, names in imports(path):
            if target.split(".")[0] not in (*PACKAGES, "tests") or target == mod:
                continue
            bad += [f"{path.relative_to(REPO)}:{line} imports {n} from {target}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_tests_share_helpers_through_helper_modules():
    bad = []
    for mod, path in modules("tests").items():
        for line, target, _ in imports(path):
            leaf = target.rsplit(".", 1)[-1]
            if target.startswith("tests.") and (leaf.startswith("test_") or leaf == "conftest"):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    """No two modules import each other, directly or around a loop, not even inside a function
    (an import put inside a function to dodge a cycle keeps the cycle)."""
    import networkx as nx

    mods = modules(*PACKAGES)
    g = nx.DiGraph()
    for mod, path in mods.items():
        for _, target, names in imports(path):
            for t in (target, *(f"{target}.{n}" for n in names)):
                if t in mods and t != mod:
                    g.add_edge(mod, t)
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, cycles
