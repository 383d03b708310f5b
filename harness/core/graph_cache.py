"""The on-disk cache of captured graphs: a model config is captured once, and every later job
(a sweep over algorithms or clusters, a re-run) loads the graph in milliseconds.

An entry is keyed by everything the captured graph depends on: the model config and the graph
options (as the source gives them), the torch version, the harness version, and the content of
the code that captures (every ``.py`` under ``harness/core``) and of the file defining the model's
factory (a custom model outside the harness), and the entry format (:data:`FORMAT`). An edit
to any of them gives a new key, so an entry is never stale.

An entry can hold data only, never code: it is an ``.npz`` file read with ``allow_pickle=False``
(:func:`encode`, :func:`decode`): the graph's arrays as arrays, everything else (names, shapes,
the meta mapping) as one JSON document beside them, and the graph rebuilt by its own
constructor, which checks it - the classes it may name are :data:`CLASSES`, nothing else.  A
planted or corrupt file is read as a miss and captured again; entries of the earlier pickle
format (``.pkl``) are never read.  A graph that holds anything else (a traced fx module) is
not stored.

Safe under parallel jobs: the first job to miss takes a per-entry file lock and captures; the
others wait on the lock and then load what it wrote; an entry appears atomically (written to a
temporary file, then renamed). A corrupt or unreadable entry is captured again.

Where: ``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/harness/graphs``, else
``~/.cache/harness/graphs``. ``graph.cache=false`` turns it off for a run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from harness.core.graph import OpGraph
from harness.core.kernels import KernelTable
from harness.core.layergraph import LayerGraph

CACHE_ENV = "HARNESS_CACHE_DIR"
#: the entry format, part of every key: 2 = npz + JSON (1 was a pickle)
FORMAT = 2
#: the classes an entry may hold, by name; each is rebuilt by its constructor from its fields
CLASSES: dict[str, type] = {c.__name__: c for c in (OpGraph, LayerGraph, KernelTable)}
#: the array of an entry that holds its JSON document
DOC = "__doc__"
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

    blob = json.dumps([kind, parts, torch.__version__, harness_version(), code_digest(), FORMAT], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class NotStorable(TypeError):
    """A value the entry format cannot hold (see :func:`encode`)."""


def encode(value: Any) -> dict[str, np.ndarray]:
    """The arrays of an entry holding ``value``: a graph of :data:`CLASSES` (a dataclass, by its
    constructor's fields), or any tree of dicts, lists, tuples, strings, numbers, booleans,
    ``None``, numpy scalars and numpy arrays of numbers; ``DOC`` is the JSON document of the
    tree, its arrays stand in it as ``{"@array": name}``.  Every JSON object of the document is
    such a tag (a mapping is ``{"@dict": [[key, value], ...]}``), so that :func:`decode` reads it
    in one pass of the JSON parser.  Anything else is :class:`NotStorable`."""
    arrays: dict[str, np.ndarray] = {}

    def enc(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject or x.dtype.kind not in "biufc":
                raise NotStorable(f"an array of dtype {x.dtype}")
            name = f"a{len(arrays)}"
            arrays[name] = x
            return {"@array": name}
        if isinstance(x, np.generic):
            return {"@scalar": x.dtype.str, "v": x.item()}
        if isinstance(x, (list, tuple)):
            items = [enc(v) for v in x]
            return items if isinstance(x, list) else {"@tuple": items}
        if isinstance(x, dict):
            return {"@dict": [[enc(k), enc(v)] for k, v in x.items()]}
        cls = type(x)
        if CLASSES.get(cls.__name__) is cls:
            fields = {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
            return {"@class": cls.__name__, "fields": fields}
        raise NotStorable(f"a {cls.__module__}.{cls.__qualname__}")

    doc = json.dumps(enc(value)).encode()
    return {DOC: np.frombuffer(doc, dtype=np.uint8), **arrays}


def decode(arrays: Any) -> Any:
    """The value :func:`encode` stored, from the arrays of an entry (an ``np.load`` result); a
    class not in :data:`CLASSES` is a ``KeyError``."""

    def tag(x: dict[str, Any]) -> Any:  # every object of the document, innermost first
        if "@array" in x:
            return arrays[x["@array"]]
        if "@tuple" in x:
            return tuple(x["@tuple"])
        if "@dict" in x:
            return dict(x["@dict"])
        if "@scalar" in x:
            return np.dtype(x["@scalar"]).type(x["v"])
        if "@class" in x:
            return CLASSES[x["@class"]](**x["fields"])
        return x  # the fields of a class, by name

    return json.loads(bytes(np.asarray(arrays[DOC], dtype=np.uint8)).decode(), object_hook=tag)


def _read(path: Path) -> Any | None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return decode({k: npz[k] for k in npz.files})
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a corrupt, foreign or planted entry is captured again
        return None


def _write(path: Path, value: Any) -> None:
    """Store ``value`` at ``path`` atomically (a temporary file beside it, then renamed); a value
    the format cannot hold, or a cache that cannot be written, is not stored."""
    try:
        arrays = encode(value)
    except NotStorable:
        return
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


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
    path = root / f"{kind}-{entry_key(kind, parts)}.npz"
    hit = _read(path)
    if hit is not None:
        return hit, True
    with _locked(path.with_suffix(".lock")):
        hit = _read(path)  # another job may have captured it while this one waited
        if hit is not None:
            return hit, True
        graph = build()
        _write(path, graph)
    return graph, False
