"""``costs=profiled``: operator times measured by ``python -m harness.profile``.

A :class:`ProfiledCostModel` reads the Parquet profiles of each device kind of the cluster
(``results/profiles/<slug of the kind>/``, or a directory given per kind) and answers
:meth:`node_times` from them:

1. *by node*: when a profile of the same model and granularity has the graph's fingerprint
   (:func:`harness.core.fingerprint.graph_fingerprint`: the targets, batch roles, FLOPs per sample
   and parameter sizes agree, so node i is the op that was profiled as node i), node i's
   time at the requested batch ``b = batch_size x fraction`` is interpolated linearly
   between the profiled batch sizes (extrapolated linearly from the nearest two outside
   them; with a single profiled batch the time above the launch floor scales with b);
2. *by key*: otherwise a node whose (target, FLOPs, bytes, output bytes) equals a profiled
   op's takes that op's time (scaled like 1. with one batch when ``fraction < 1``);
3. else the analytical roofline (``fallback`` parameters), and the node is counted:
   :meth:`report` says how many nodes fell back, of which targets; ``harness.app.run`` puts it
   into result.json as ``costs_report``.

Never below a floor: the smaller of the node's smallest profiled time and the device's
launch floor (the 5th percentile of the profile's kernel times).  Views, getitem and detach
take their measured time (``free_ops: measured``, a few microseconds of dispatch) or
nothing (``free_ops: zero``, as the analytical model).  Transfers, all-reduce and memory
are the analytical model's (alpha-beta links of the cluster, ring all-reduce, bytes), not the
calibrated model's NCCL-on-the-fabric all-reduce: profiles are taken on this machine's CPU,
whose collectives the analytical ring reads from the cluster's own measured ``collective``
figures (``python -m harness.calibrate``), which no NCCL calibration covers; the measured
operator times are the only thing this model changes against ``costs=analytical``.

What is given is checked when the model is built: a ``costs.profile_dir`` or a
``costs.profiles`` entry that does not exist, or an entry for a device kind the cluster does
not have, is a :class:`harness.core.errors.ProfileError` (not a silent fall-back to the roofline);
the ``fallback`` figures as :func:`harness.core.costs.check_roofline` (named ``costs.fallback.*``).
Without ``profile_dir`` the profiles of the repository are read, and a GPU kind none was
taken for falls back (counted in the report).

A profile belongs to the machine that measured it.  A CPU device kind
(:func:`harness.core.machine.cpu_kind`, ``"<CPU model> (N thread(s))"``) is this machine's CPU:
a cluster whose CPU kind names another CPU (``cluster=cpu2`` calibrated elsewhere) is a
``ProfileError`` that says what to run here (:func:`check_cpu_kinds`), and so is this CPU
without a profile among the repository's; an explicit ``costs.profile_dir`` or
``costs.profiles`` entry is the user's word (a kind it has nothing for falls back, counted).
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core import machine
from harness.core.cluster import Cluster
from harness.core.costs import AnalyticalCostModel, CostModelError, check_roofline, refuse_unknown, with_measured
from harness.core.fingerprint import graph_fingerprint, node_keys
from harness.core.errors import ProfileError
from harness.core.graph import OpGraph
from harness.core.kernels import KernelTable

#: where operator profiles live: ``results/profiles/<device slug>/`` (written by ``python -m harness.profile``)
PROFILE_ROOT = Path(__file__).resolve().parents[2] / "results" / "profiles"


def slug(name: str) -> str:
    """A directory name for a device name (``Intel(R) Xeon(R) Processor (1 thread)`` ->
    ``intel-r-xeon-r-processor-1-thread``)."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "device"


def profile_dir_for(kind: str, root: str | Path | None = None) -> Path:
    """Where the profiles of a device kind live (``results/profiles/<slug>``)."""
    return Path(root or PROFILE_ROOT) / slug(kind)


BY_INDEX, BY_KEY, FALLBACK = 0, 1, 2


def _profile_root(profile_dir: str | Path | None) -> Path:
    """The directory of per-device-kind profiles: ``costs.profile_dir``, which must exist, or
    the repository's ``results/profiles`` when it is null."""
    if not profile_dir:
        return PROFILE_ROOT
    root = Path(profile_dir)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise ProfileError(f"costs.profile_dir={profile_dir} {what}: give the directory python -m harness.profile wrote "
                           f"(a subdirectory per device kind), or null for {PROFILE_ROOT}")
    return root


def _profile_paths(profiles: Mapping[str, str] | None, cluster: Cluster) -> dict[str, Path]:
    """``costs.profiles``: per device kind of the cluster, an existing profile directory or
    .parquet file."""
    kinds = sorted({d.spec.kind for d in cluster.devices})
    out: dict[str, Path] = {}
    for kind, path in dict(profiles or {}).items():
        key = f"costs.profiles[{str(kind)!r}]"
        if str(kind) not in kinds:
            raise ProfileError(f"{key}: cluster {cluster.name!r} has no device of kind {str(kind)!r} (its kinds: {', '.join(map(repr, kinds))})")
        if not Path(path).exists():
            raise ProfileError(f"{key}={path} does not exist: give a profile directory or .parquet file of python -m harness.profile")
        out[str(kind)] = Path(path)
    return out


def _has_profiles(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(path.glob("*.parquet")))


def check_cpu_kinds(cluster: Cluster, root: Path, given: Mapping[str, Path], default_root: bool) -> None:
    """Refuse, in one line that says what to run, a CPU device kind of another CPU than this
    machine's, and (reading the repository's profiles) this CPU without a profile."""
    for kind in sorted({d.spec.kind for d in cluster.devices}):
        threads = machine.cpu_kind_threads(kind)
        if threads is None:
            continue
        measure = f"python -m harness.profile device=cpu threads={threads} model=<model>"
        here = machine.foreign_cpu(kind)
        if here is not None:
            raise ProfileError(
                f"costs=profiled: cluster {cluster.name!r} has devices of kind {kind!r}, another CPU than this machine's {here!r}, "
                f"and a profile is used only on the CPU that measured it; to simulate this machine run `python -m harness.calibrate "
                f"--threads {threads} --write` (cpu2's figures and kind) and `{measure}`, or use costs=analytical")
        if default_root and kind not in given and not _has_profiles(profile_dir_for(kind, root)):
            raise ProfileError(f"costs=profiled: no profile of this machine's CPU {kind!r} in {profile_dir_for(kind, root)}: "
                               f"run `{measure}` (or give costs.profile_dir), or use costs=analytical")


class _Parts:
    """Per (graph, device kind): the interpolation table and which nodes use which source."""

    def __init__(self, n: int) -> None:
        self.source = np.full(n, FALLBACK, np.int8)
        self.batches = np.zeros(0)
        self.T = np.zeros((0, n))  # profiled times [batch, node]
        self.key_t = np.full(n, np.nan)
        self.floor = np.zeros(n)
        self.ovh = 0.0
        self.cache: dict[float, np.ndarray] = {}
        self.files: list[str] = []


class ProfiledCostModel:
    """Measured operator times per device kind, analytical fallback (see the module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        profile_dir: str | Path | None = None,
        profiles: Mapping[str, str] | None = None,
        fallback: Mapping[str, Any] | None = None,
        free_ops: str = "measured",
        stat: str = "time_s",
        **unknown: Any,
    ) -> None:
        refuse_unknown(type(self), unknown)
        if free_ops not in ("measured", "zero"):
            raise CostModelError(f"costs.free_ops must be 'measured' or 'zero', got {free_ops!r}")
        if stat not in ("time_s", "time_mean_s", "time_min_s"):
            raise CostModelError(f"costs.stat must be time_s (median), time_mean_s or time_min_s, got {stat!r}")
        self.cluster = cluster
        check_roofline(dict(fallback or {}), "costs.fallback")
        self.analytical = AnalyticalCostModel(cluster, **dict(fallback or {}))
        self.root = _profile_root(profile_dir)
        self.paths = _profile_paths(profiles, cluster)
        check_cpu_kinds(cluster, self.root, self.paths, default_root=not profile_dir)
        self.free_ops = free_ops
        self.stat = stat
        self._tables: dict[str, Any] = {}
        self._parts: "weakref.WeakKeyDictionary[Any, dict[str, _Parts]]" = weakref.WeakKeyDictionary()
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ profiles
    def profile_path(self, kind: str) -> Path:
        """The directory (or file) holding the profiles of a device kind."""
        return self.paths.get(kind, profile_dir_for(kind, self.root))

    def table(self, kind: str) -> Any:
        """Every profile row of a device kind (an empty frame when there is none)."""
        import pandas as pd

        if kind not in self._tables:
            p = self.profile_path(kind)
            files = sorted(p.glob("*.parquet")) if p.is_dir() else ([p] if p.is_file() else [])
            frames = []
            for f in files:
                try:
                    d = pd.read_parquet(f)
                except Exception as e:  # noqa: BLE001 - name the bad file
                    raise ProfileError(f"cannot read profile {f}: {e}") from e
                d["file"] = f.name
                frames.append(d)
            self._tables[kind] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._tables[kind]

    def _build(self, graph: OpGraph, kind: str) -> _Parts:
        n = graph.num_nodes
        parts = _Parts(n)
        df = self.table(kind)
        if df.empty:
            return parts
        stat = self.stat
        kern = df.loc[~df["free"].astype(bool), stat].to_numpy(float)
        parts.ovh = float(np.percentile(kern, 5)) if len(kern) else 0.0
        model = graph.meta.get("model")
        gran = graph.meta.get("granularity", "aten")
        fp = graph_fingerprint(graph)
        mine = df[(df["graph_fp"] == fp) & (df["model"] == model) & (df["granularity"] == gran)]
        batches, rows = [], []
        for b, part in mine.groupby("batch_size", sort=True):
            part = part.drop_duplicates("node", keep="last")
            if len(part) != n or part["node"].min() != 0 or part["node"].max() != n - 1:
                continue
            t = part.sort_values("node")[stat].to_numpy(float)
            if not np.array_equal(part.sort_values("node")["target"].to_numpy(), np.asarray(graph.targets, dtype=object)):
                continue
            batches.append(float(b))
            rows.append(t)
        if batches:
            parts.batches = np.asarray(batches)
            parts.T = np.vstack(rows)
            parts.source[:] = BY_INDEX
            parts.floor = np.minimum(parts.T.min(axis=0), parts.ovh)
            parts.files = sorted(mine["file"].unique().tolist())
            return parts
        by_key = df.groupby("key")[stat].median()
        keys = node_keys(graph)
        kt = by_key.reindex(keys).to_numpy(float)
        hit = ~np.isnan(kt)
        parts.key_t = kt
        parts.source[hit] = BY_KEY
        parts.floor = np.where(hit, np.minimum(np.nan_to_num(kt), parts.ovh), 0.0)
        if hit.any():
            parts.files = sorted(df.loc[df["key"].isin(set(np.asarray(keys, dtype=object)[hit].tolist())), "file"].unique().tolist())
        return parts

    def _parts_for(self, graph: OpGraph, kind: str) -> _Parts:
        per = self._parts.setdefault(graph, {})
        if kind not in per:
            per[kind] = self._build(graph, kind)
            self._record(graph, kind, per[kind])
        return per[kind]

    def _record(self, graph: OpGraph, kind: str, p: _Parts) -> None:
        if self._last.get("graph_id") != id(graph):
            self._last = {"graph_id": id(graph), "graph": f"{graph.meta.get('model', '?')} ({graph.num_nodes} nodes)", "by_kind": {}}
        kernel = ~graph.free
        given = graph.measured_times(kind)
        measured = ~np.isnan(given) if given is not None else np.zeros(graph.num_nodes, dtype=bool)
        fb = (p.source == FALLBACK) & kernel & ~measured  # the graph's own measured times are no fallback
        self._last["by_kind"][kind] = {
            "profile": str(self.profile_path(kind)),
            "files": p.files,
            "profiled_batches": [int(b) for b in p.batches.tolist()],
            "nodes": int(graph.num_nodes),
            "kernel_nodes": int(kernel.sum()),
            "by_node": int((p.source == BY_INDEX).sum()),
            "by_key": int((p.source == BY_KEY).sum()),
            "measured_in_graph": int(measured.sum()),
            "fallback_nodes": int(fb.sum()),
            "fallback_targets": dict(Counter(np.asarray(graph.targets, dtype=object)[fb].tolist()).most_common(10)),
        }

    # ------------------------------------------------------------------ report
    @property
    def fallback_count(self) -> int:
        """Kernel nodes of the graph costed last that fell back to the analytical model (max over device kinds)."""
        return max((v["fallback_nodes"] for v in self._last.get("by_kind", {}).values()), default=0)

    def report(self) -> dict[str, Any]:
        """What was looked up for the graph costed last: per device kind, how many nodes came
        from a profile (by node, by key) and how many fell back (and their targets)."""
        return {"model": "profiled", "graph": self._last.get("graph"), "fallback_nodes": self.fallback_count,
                "by_kind": self._last.get("by_kind", {})}

    def describe(self) -> dict[str, Any]:
        return {"model": "profiled", "profile_dir": str(self.root), "profiles": {k: str(v) for k, v in self.paths.items()},
                "free_ops": self.free_ops, "stat": self.stat}

    # ------------------------------------------------------------------ compute
    def _times(self, graph: OpGraph, kind: str, device: int, fraction: float) -> np.ndarray:
        p = self._parts_for(graph, kind)
        frac = float(fraction)
        if frac in p.cache:
            return p.cache[frac]
        n = graph.num_nodes
        out = np.zeros(n)
        B = float(graph.meta.get("batch_size", 1) or 1)
        b = B * frac
        idx = p.source == BY_INDEX
        if idx.any():
            bs, T = p.batches, p.T
            if len(bs) >= 2:
                j = int(np.clip(np.searchsorted(bs, b) - 1, 0, len(bs) - 2))
                w = (b - bs[j]) / (bs[j + 1] - bs[j])
                t = T[j] + (T[j + 1] - T[j]) * w
            else:
                scale = np.where(graph.batch_scaled(), b / bs[0], 1.0)
                t = p.ovh + (T[0] - p.ovh) * scale
            out[idx] = np.maximum(t, p.floor)[idx]
        key = p.source == BY_KEY
        if key.any():
            scale = np.where(graph.batch_scaled(), frac, 1.0)
            t = p.ovh + (np.nan_to_num(p.key_t) - p.ovh) * scale
            out[key] = np.maximum(t, p.floor)[key]
        fb = p.source == FALLBACK
        if fb.any():
            out[fb] = self.analytical.node_times(graph, device, fraction)[fb]
        if self.free_ops == "zero":
            out[graph.free] = 0.0
        out = with_measured(graph, kind, frac, out)  # the graph's own measured times win over the profile
        p.cache[frac] = out
        return out

    def node_times(self, graph: Any, device: int, fraction: float = 1.0) -> np.ndarray:
        if not isinstance(graph, OpGraph):
            return self.analytical.node_times(graph, device, fraction)
        return self._times(graph, self.cluster.devices[device].spec.kind, device, fraction)

    def compute_time(self, graph: Any, node: int, device: int, fraction: float = 1.0) -> float:
        return float(self.node_times(graph, device, fraction)[node])

    # ------------------------------------------------------------------ communication, memory
    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        return self.analytical.transfer_time(nbytes, src, dst)

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.analytical.transfer_routes()

    @property
    def sync(self) -> str:
        """The all-reduce is the analytical model's."""
        return self.analytical.sync

    @property
    def overlap_slowdown(self) -> float:
        """The analytical model's (``costs.fallback.overlap_slowdown``)."""
        return self.analytical.overlap_slowdown

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        return self.analytical.allreduce_time(nbytes, devices)

    def memory(self, graph: OpGraph) -> np.ndarray:
        return self.analytical.memory(graph)

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        """A kernel table (a transformer block's, never profiled per operator) is the analytical model's."""
        return self.analytical.kernel_times(kernels, device, num_nodes)

    def __getattr__(self, name: str) -> Any:
        # anything else the analytical model offers (e.g. layer-graph costs) comes from it
        if name.startswith("_") or "analytical" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["analytical"], name)
