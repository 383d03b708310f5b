"""The on-disk cache of captured graphs: a model config is captured once, and every later job
(a sweep over algorithms or clusters, a re-run) loads the graph in milliseconds.

An entry is keyed by everything the captured graph depends on: the model config and the graph
options (as the source gives them), the torch version, the harness version, and the content of
the code that captures (every ``.py`` under ``harness/core``) and of the file defining the model's
factory (a custom model outside the harness). An edit to any of them gives a new key, so an
entry is never stale. Entries are pickles of the graph (an :class:`~harness.core.graph.OpGraph`
without its fx module, or a :class:`~harness.core.layergraph.LayerGraph`).

Safe under parallel jobs: the first job to miss takes a per-entry file lock and captures; the
others wait on the lock and then load what it wrote; an entry appears atomically (written to a
temporary file, then renamed). A corrupt or unreadable entry is captured again.

Where: ``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/harness/graphs``, else
``~/.cache/harness/graphs``. ``graph.cache=false`` turns it off for a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

CACHE_ENV = "HARNESS_CACHE_DIR"
_CORE = Path(__file__).resolve().parent
_DIGESTS: dict[str, str] = {}
G = TypeVar("G")


def cache_root() -> Path:
    """The cache directory (see the module docstring); created on first use."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness" / "graphs"


def _file_digest(path: Path) -> str:
    key = str(path)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    return _DIGESTS[key]


def code_digest() -> str:
    """Digest of the capturing code: every ``.py`` file under ``harness/core`` (read once per process)."""
    if "core" not in _DIGESTS:
        h = hashlib.sha256()
        for p in sorted(_CORE.rglob("*.py")):
            h.update(str(p.relative_to(_CORE)).encode())
            h.update(_file_digest(p).encode())
        _DIGESTS["core"] = h.hexdigest()
    return _DIGESTS["core"]


def source_file_digest(fn: Any) -> str:
    """Digest of the file that defines ``fn`` (a model factory), ``""`` when it has none."""
    import inspect

    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        return ""
    return _file_digest(Path(path).resolve()) if path else ""


def harness_version() -> str:
    """The installed harness's version (pyproject.toml), ``"unknown"`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harness")
    except PackageNotFoundError:
        return "unknown"


def entry_key(kind: str, parts: Any) -> str:
    """The cache key of a ``kind`` graph (``op`` / ``layer``) of a source described by ``parts``."""
    import torch

    blob = json.dumps([kind, parts, torch.__version__, harness_version(), code_digest()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(path: Path) -> Any | None:
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a corrupt or foreign entry is captured again
        return None


def cached(kind: str, parts: Any, build: Callable[[], G], enabled: bool = True) -> tuple[G, bool]:
    """``(graph, from_cache)``: the entry for ``(kind, parts)`` if there is one, else ``build()``
    stored for the next job. ``enabled=False`` builds and stores nothing."""
    if not enabled:
        return build(), False
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return build(), False  # no writable cache: capture as if it were off
    path = root / f"{kind}-{entry_key(kind, parts)}.pkl"
    hit = _read(path)
    if hit is not None:
        return hit, True
    with _locked(path.with_suffix(".lock")):
        hit = _read(path)  # another job may have captured it while this one waited
        if hit is not None:
            return hit, True
        graph = build()
        fd, tmp = tempfile.mkstemp(dir=root, prefix=path.stem, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(graph, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return graph, False
