"""``harness.app.run(cfg)``: model -> graph -> algorithm -> strategy -> simulator -> result.

A pure function of the composed config: it writes nothing.  The Hydra shell
(``python -m harness``) writes what it returns into the job's output dir.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.app.bounds import problem_bound
from harness.app.config_checks import check_config
from harness.app.result_checks import baseline_check, check_finite, source_warnings
from harness.app.summary import format_seconds
from harness.core.cluster import Cluster
from harness.core.errors import OptionError, UserError
from harness.core.sources import GraphSource
from simulators.simulate import ExecutingBackend
from harness.core.strategy import PLAN_GRAPH_FILE, Plan, graph_identity

#: figures an algorithm may report in ``Plan.info`` that result.json carries at top level
LIFTED_INFO_KEYS = ("objective_s", "search_complete", "search_budget_s", "samples")

#: keys of result.json that later tools rely on (never rename or drop one)
CONTRACT_KEYS = (
    "model", "cluster", "algo", "num_devices", "batch_size", "graph_nodes", "graph_edges", "search_seconds",
    "step_time_s", "lower_bound_s", "oom", "comm_bytes", "peak_memory_bytes", "device_busy_s", "versions", "git_sha",
)


@dataclass(eq=False)
class Result:
    """What one job produced: the result row (result.json), the plan and the simulation."""

    row: dict[str, Any]
    plan: Plan
    sim: Any
    cluster: Cluster
    extras: dict[str, Any] = field(default_factory=dict)
    #: the graph the algorithm was given (the captured one); ``plan.graph`` may be a rewrite of it
    graph: Any = None
    #: the algorithm's paper, its claim and where the findings are (``Algorithm.about``), for the summary
    about: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the harness source tree, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("torch", "numpy", "hydra-core", "harness"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _to_plain(cfg: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def build(cfg: Any) -> tuple[Any, Cluster, Any, Any, Any]:
    """Instantiate (graph source, cluster, cost model, algorithm, simulator) from a composed config."""
    from hydra.utils import instantiate

    source = instantiate(cfg.model, _recursive_=False)
    cluster = instantiate(cfg.cluster, _convert_="all")
    costs = build_costs(cfg, cluster)
    algo = build_algorithm(cfg)
    sim = instantiate(cfg.sim, _convert_="all")
    return source, cluster, costs, algo, sim


def build_costs(cfg: Any, cluster: Cluster) -> Any:
    """The cost model of ``cfg.costs`` for ``cluster`` (a whole cluster or a sub-cluster)."""
    from hydra.utils import instantiate

    # objects (not config values) are passed to a partial, so OmegaConf never sees them
    return instantiate(cfg.costs, _partial_=True, _convert_="all")(cluster=cluster)


def build_algorithm(cfg: Any) -> Any:
    """The algorithm of ``cfg.algo``.  What its class refuses while taking its parameters - a key
    its ``__init__`` does not declare (TypeError) or a value its checks reject (a UserError or a
    ValueError) - is the user's mistake, reported as an :class:`OptionError` that names the algorithm (and, for an
    unknown key, the parameters it has); anything else it raises goes on as it is."""
    import inspect

    from hydra.errors import InstantiationException
    from hydra.utils import get_class, instantiate

    try:
        return instantiate(cfg.algo, seed=cfg.seed, _convert_="all")
    except InstantiationException as e:
        bad, name = e.__cause__, cfg.algo.get("name", cfg.algo.get("_target_"))
        if isinstance(bad, TypeError) and "unexpected keyword argument" in str(bad):
            key = str(bad).rsplit("argument", 1)[1].strip(" '")
            params = [p for p in inspect.signature(get_class(cfg.algo._target_)).parameters if p not in ("self", "name", "seed")]
            raise OptionError(f"algo.{key} is not a parameter of algo={name}; its parameters: {', '.join(params)}") from e
        if isinstance(bad, (ValueError, UserError)):  # its checks (harness.core.checks) name the key
            raise OptionError(f"algo={name}: {bad}") from e
        raise


#: config blocks that change only what is written or shown, not the result
NON_RESULT_KEYS = ("output", "resume", "debug")

#: the cost model that reads the Parquet profiles under a profile root (``costs=profiled``)
PROFILED_COSTS = "harness.core.profiled.ProfiledCostModel"


def input_files(plain: dict[str, Any]) -> dict[str, Path]:
    """The files a job reads that its (resolved, plain) config names, by how it names them:
    every string value that is the path of an existing file (model=from_file's graph, a
    calibration table, a profile file), and under ``costs=profiled`` every Parquet profile below
    its profile directories (``costs.profile_dir``, by default results/profiles, and the
    ``costs.profiles`` entries), as ``<key>:<path below it>`` - not where the checkout is."""
    found: dict[str, Path] = {}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str) and x:
            try:
                if Path(x).is_file():
                    found[x] = Path(x)
            except OSError:  # not a path (too long, ...)
                pass

    walk(plain)
    costs = plain.get("costs") or {}
    if costs.get("_target_") == PROFILED_COSTS:
        from harness.core.profiled import PROFILE_ROOT

        roots = {"costs.profile_dir": Path(costs.get("profile_dir") or PROFILE_ROOT),
                 **{f"costs.profiles.{k}": Path(v) for k, v in (costs.get("profiles") or {}).items()}}
        for key, root in roots.items():
            if root.is_dir():
                found.update((f"{key}:{f.relative_to(root)}", f) for f in root.rglob("*.parquet"))
    return dict(sorted(found.items()))


def file_digest(path: Path) -> str:
    """sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def result_config(cfg: Any) -> dict[str, Any]:
    """The keys of a composed config that can change a job's result: all of it, resolved, but
    :data:`NON_RESULT_KEYS` (result.json's ``config``)."""
    return {k: v for k, v in (_to_plain(cfg) or {}).items() if k not in NON_RESULT_KEYS}


def input_digests(plain: dict[str, Any]) -> dict[str, str]:
    """sha256 of every input file a (plain) config names (:func:`input_files`), by its name there
    (result.json's ``input_files``)."""
    return {name: file_digest(f) for name, f in input_files(plain).items()}


def config_hash(cfg: Any) -> str:
    """A digest of everything that can change a job's result: the composed config but
    :data:`NON_RESULT_KEYS`, and the content of every input file it names (:func:`input_files`),
    so that an edited graph or profile is run again; the key re-running a sweep uses to skip
    finished jobs.  A config that names no input file hashes as it did before input files counted."""
    plain = result_config(cfg)
    digests = input_digests(plain)
    if digests:
        plain["__input_files__"] = digests
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run(cfg: Any, on_plan: Callable[[Plan, Any], None] | None = None, reference_cache: Path | None = None) -> Result:
    """Run one job.  ``on_plan`` (optional) receives the plan and the captured graph as soon as
    the plan exists, so a caller can save it even if the simulation then fails.  Unless ``output.worth`` is false
    the row also says what the plan is worth (:mod:`harness.app.worth`); ``reference_cache`` is a
    directory the jobs of one sweep share for its reference steps."""
    check_config(cfg)
    source, cluster, costs, algo, sim = build(cfg)
    gcfg = _to_plain(cfg.get("graph", {})) or {}
    if not isinstance(source, GraphSource):
        raise UserError(f"model {getattr(source, 'name', '?')!r} ({type(source).__name__}) is not a graph source "
                        f"(harness.core.sources.GraphSource), which algo={algo.name} needs: give model._target_ a class with name, "
                        "batch_size, graph_source and op_graph (and layer_graph, stack_graph)")
    kind = pick_graph_kind(algo, source)
    if isinstance(sim, ExecutingBackend):  # a backend that executes the graph (sim=realrun) needs its fx module
        if kind == "stack":
            raise UserError(f"sim=realrun executes operator-graph plans, and algo={algo.name} plans the stack graph (a parallel plan "
                            "the simulator replays): use sim=default")
        gcfg = {**gcfg, "keep_fx": True}
        sim.bind(source, seed=int(cfg.seed), graph_cfg=gcfg)
    t0 = time.perf_counter()
    if kind == "op":
        graph = source.op_graph(**gcfg)
    elif kind == "stack":
        graph = source.stack_graph(precision=str(gcfg.get("precision", "fp32")))
    else:
        graph = source.layer_graph(precision=str(gcfg.get("precision", "fp32")), cache=bool(gcfg.get("cache", True)))
    capture_s = time.perf_counter() - t0
    graph_source = str(source.graph_source)
    t0 = time.perf_counter()
    plan = algo.plan(graph, cluster, costs)
    search_s = time.perf_counter() - t0
    if on_plan is not None:
        on_plan(plan, graph)
    t0 = time.perf_counter()
    res = sim(plan.graph, plan.strategy, cluster, costs)
    sim_s = time.perf_counter() - t0
    summary = res.summary()
    bound = problem_bound(graph, cluster, costs)
    plain = result_config(cfg)
    digests = input_digests(plain)
    row: dict[str, Any] = {
        "model": source.name,
        "cluster": cluster.name,
        "algo": algo.name,
        "num_devices": cluster.num_devices,
        "batch_size": int(source.batch_size),
        "graph_nodes": int(graph.num_nodes),
        "graph_edges": edge_count(graph),
        "plan_nodes": int(plan.graph.num_nodes),
        "plan_edges": edge_count(plan.graph),
        "search_seconds": search_s,
        "capture_seconds": capture_s,
        "graph_from_cache": graph_source in ("disk", "memory"),
        "graph_source": graph_source,
        "graph_kind": kind,
        "simulate_seconds": sim_s,
        **summary,
        **bound,
        "gap_to_bound": res.step_time_s / bound["lower_bound_s"] - 1.0 if bound["lower_bound_s"] > 0 else 0.0,
        "devices_used": len(plan.strategy.devices_used()),
        "algo_params": _jsonable(algo.describe()),
        "algo_info": _jsonable(plan.info),
        **{k: _jsonable(plan.info[k]) for k in LIFTED_INFO_KEYS if k in plan.info},
        "costs_report": _jsonable(costs.report()),
        **_worth(cfg, graph, cluster, costs, kind, res.step_time_s, plan.info, reference_cache),
        "seed": int(cfg.seed),
        "precision": str(plain.get("precision", "fp32")),
        "config": _jsonable(plain),
        **({"input_files": digests} if digests else {}),
        "config_hash": config_hash(cfg),
        "versions": versions(),
        "git_sha": git_sha(),
    }
    row.update(_checked_warnings(cfg, source, graph, cluster, costs, res.step_time_s, plan.info, row))
    check_finite(row)
    about = algo.about() if hasattr(algo, "about") else {}
    return Result(row=row, plan=plan, sim=res, cluster=cluster, graph=graph, about=about)


#: what each graph kind needs of a model source: the method that gives it
GRAPH_METHODS = {"op": "op_graph", "layer": "layer_graph", "stack": "stack_graph"}


def source_graph_kinds(source: Any) -> tuple[str, ...]:
    """The graph kinds a model source gives: its ``graph_kinds`` where it declares them (a model
    described by its shape, ``model=llm``, gives only ``("stack",)``), else ``op`` and each kind
    whose method it has (``layer_graph``, ``stack_graph``)."""
    declared = getattr(source, "graph_kinds", None)
    if declared is not None:
        return tuple(str(k) for k in declared)
    return ("op", *(k for k in ("layer", "stack") if callable(getattr(source, GRAPH_METHODS[k], None))))


def pick_graph_kind(algo: Any, source: Any) -> str:
    """The first of the algorithm's graph kinds (``graph_kinds``, in its order of preference;
    ``(graph_kind,)`` for an algorithm that declares one) that the model source gives; a model
    that gives none of them is one line naming what the algorithm plans on."""
    wanted = tuple(getattr(algo, "graph_kinds", None) or (getattr(algo, "graph_kind", "op"),))
    given = source_graph_kinds(source)
    for k in wanted:
        if k in given:
            return k
    what = {"op": "an operator graph (a PyTorch model it captures)", "layer": "a layer graph (harness.core.sources.LayerGraphSource)",
            "stack": "a stack graph (a transformer by its shape, model=llm and its presets, or a zoo CNN's layers in order)"}
    need = " or ".join(what.get(k, k) for k in wanted)
    by = {"op": "algorithms that place operators (algo=m_topo, heft, fddps, ...)", "layer": "layer-graph searches (algo=optcnn, pase, ...)",
          "stack": "the stack algorithms (algo=megatron, fsdp, data_parallel, hybrid_search)"}
    raise UserError(f"algo={getattr(algo, 'name', '?')} plans on {need}, and model {getattr(source, 'name', '?')!r} "
                    f"({type(source).__name__}) gives {', '.join(given)} graphs only: plan it with {' or '.join(by.get(k, k) for k in given)}")


def edge_count(graph: Any) -> int:
    """A graph's edges (a stack graph: the chain between its units, ``units - 1``, where it does not count them itself)."""
    n = getattr(graph, "num_edges", None)
    return int(n) if n is not None else max(int(graph.num_nodes) - 1, 0)


def _checked_warnings(cfg: Any, source: Any, graph: Any, cluster: Cluster, costs: Any, step_s: float,
                      info: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``warnings`` (what the source flags, a search slower in simulation than a baseline it
    ranks no better) and the baseline comparison (:mod:`harness.app.result_checks`), which runs
    with the worth references (``output.worth``)."""
    warnings = source_warnings(source) + [str(w) for w in info.get("warnings", ())]  # a plan's (a TP group across nodes)
    out: dict[str, Any] = {}
    if (cfg.get("output") or {}).get("worth", True):
        out = baseline_check(graph, cluster, costs, step_s, info, {"data_parallel": row.get("data_parallel_step_s")})
        warnings += out.pop("warnings", [])
    return {**out, **({"warnings": warnings} if warnings else {})}


def _worth(cfg: Any, graph: Any, cluster: Cluster, costs: Any, kind: str, step_s: float, info: dict[str, Any],
           cache: Path | None) -> dict[str, Any]:
    """The plan's speed-ups over one device and data parallelism and its estimate's gap."""
    from harness.app.worth import reference_key, reference_steps, simulate_references, worth

    if not (cfg.get("output") or {}).get("worth", True):
        return {}
    graph_cfg = {k: v for k, v in (_to_plain(cfg.get("graph", {})) or {}).items() if k != "keep_fx"}
    key = reference_key({"model": _to_plain(cfg.model), "graph": graph_cfg, "cluster": _to_plain(cfg.cluster),
                         "costs": _to_plain(cfg.costs), "graph_kind": kind})
    refs = reference_steps(key, lambda: simulate_references(graph, cluster, costs, kind), cache)
    return worth(step_s, refs, info)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def write_json_atomic(path: Path, obj: Any, indent: int | None = 1) -> None:
    """``path`` holds either what it held before or all of ``obj`` as JSON, never a part: the
    JSON goes into a temporary file beside it, which is then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=indent))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_plan(plan: Plan, graph: Any, outdir: Path) -> None:
    """strategy.json with what replaying it (``algo=from_file``) needs: the strategy's keys plus
    ``graph`` (:func:`graph_identity` of the captured graph) and, when the plan's graph is not the
    captured one (FD-DPS's split graph), ``plan_graph`` (:data:`PLAN_GRAPH_FILE`, written beside it
    first) and ``plan_origin``.  docs/strategy_format.md describes the file."""
    d = plan.strategy.to_dict()
    if graph is not None:
        d["graph"] = graph_identity(graph)
        if plan.graph is not graph:
            write_json_atomic(outdir / PLAN_GRAPH_FILE, plan.graph.to_dict(), indent=None)
            d["plan_graph"] = PLAN_GRAPH_FILE
            d["plan_origin"] = None if plan.origin is None else np.asarray(plan.origin).tolist()
    write_json_atomic(outdir / "strategy.json", d, indent=None)


def write_outputs(result: Result, outdir: Path, cfg: Any) -> None:
    """trace.json, gantt.png (and a real run's measured trace) into ``outdir``, then result.json,
    last and atomically: a result.json exists only for a job whose outputs were all written, and
    one that fails here leaves none.  strategy.json (and a rewritten plan graph) is the job
    runner's, written by :func:`write_plan` as soon as the plan exists, before simulating."""
    outdir.mkdir(parents=True, exist_ok=True)
    out = cfg.get("output", {})
    r = result.row
    if out.get("trace", True):
        result.sim.write_trace(outdir / "trace.json", max_tasks=out.get("trace_max_tasks"))
    if out.get("gantt", True):
        from simulators.gantt import plot_gantt

        plot_gantt(result.sim, outdir / "gantt.png",
                   title=f"{r['model']} / {r['algo']} / {r['cluster']}: step {format_seconds(r['step_time_s'])}")
    tl = getattr(result.sim, "measured_timeline", None)
    if tl is not None:
        write_measured_trace(tl, outdir / "measured_trace.csv")
        if out.get("gantt", True):
            from simulators.gantt import plot_measured_gantt

            plot_measured_gantt(result.sim, outdir / "gantt_measured.png",
                                title=f"{r['model']} / {r['algo']} / {r['cluster']}: simulated {format_seconds(r['step_time_s'])}")
    write_json_atomic(outdir / "result.json", r)


def write_measured_trace(tl: dict[str, Any], path: Path) -> None:
    """``measured_trace.csv``: a real run's events (sim=realrun with sim.trace), one row each:
    rank, kind (op, send, recv_wait, allreduce_wait, drain), id (node or message tag), node and
    phase (ops), mean start, end and duration in seconds over the measured steps."""
    import csv

    from harness.core.graph import PHASES
    from simulators.realrun import TRACE_KINDS, TRACE_OP

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["rank", "kind", "id", "node", "phase", "start_s", "end_s", "duration_s"])
        for q in range(len(tl["rank"])):
            k, i = int(tl["kind"][q]), int(tl["id"][q])
            op = k == TRACE_OP
            ph = int(tl["node_phase"][i]) if op else -1
            w.writerow([int(tl["rank"][q]), TRACE_KINDS[k], i, tl["node_name"][i] if op else "", PHASES[ph] if ph >= 0 else "",
                        f"{tl['start_s'][q]:.9f}", f"{tl['end_s'][q]:.9f}", f"{tl['duration_s'][q]:.9f}"])
