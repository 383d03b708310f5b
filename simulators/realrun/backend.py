"""The ``sim=realrun`` backend (:class:`RealRun`): check that a plan can run for real, turn it into
a :class:`~simulators.realrun.job.Job` of per-rank programs (an operator placement, data
parallelism, or data parallelism with channel-parallel layers), simulate it, launch it, and
report what was measured beside the simulated step; and the single-process run a distributed run
must reproduce (:func:`reference_outputs`)."""

from __future__ import annotations

import copy
import math
import os
from typing import Any, Sequence

import numpy as np

from harness.core.checks import boolean, known_keys, non_negative_int, one_of, positive_int, positive_number
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.machine import cpu_kind_threads
from harness.core.fingerprint import layer_runs
from simulators.realrun.execgraph import ExecGraph, initial_state
from harness.core.graph import OpGraph
from simulators.realrun.timing import rank_cores
from harness.core.strategy import Strategy
from simulators.realrun.channel import channel_plan, layer_channel_split, split_dims
from simulators.realrun.codegen import dp_program, placement_programs
from simulators.realrun.costs import interleaved_costs
from simulators.realrun.job import Job, RankProgram, RealRunError
from simulators.realrun.launcher import launch, write_job
from simulators.realrun.measured import Measured
from simulators.realrun.sealed import KEY_ENV, new_key
from simulators.engine import MODES
from simulators.simulate import SimResult, simulate
from simulators.shards import param_home_nodes


#: the keys of ``conf/sim/realrun.yaml`` (:class:`RealRun`'s parameters)
KEYS = ("warmup", "steps", "backend", "device", "threads_per_rank", "launcher", "order", "timeout_s", "job_dir", "spin_idle",
        "early_recv", "steady_malloc", "interleave_profile", "trace", "rank_timeout_s", "force")
#: how the ranks are started (``sim.launcher``)
LAUNCHERS = ("spawn", "torchrun", "prepare")
#: a device kind that names a CPU: :func:`simulators.realrun.timing.device_name`'s "<model> (N thread(s))"


def _is_layer_graph(graph: Any) -> bool:
    return type(graph).__name__ == "LayerGraph"


def _uniform_sample_config(strategy: Strategy, what: str, names: Sequence[str]) -> tuple[int, ...] | None:
    """The devices of a pure data-parallel strategy; None for a pure placement; refuse mixes."""
    cid = strategy.config_id
    if (cid < 0).all():
        return None
    if (cid < 0).any():
        v = int(np.flatnonzero(cid < 0)[0])
        raise RealRunError(
            f"{what}: node {v} ({names[v]}) is placed while others carry parallel configs; a mix of placement and "
            "configs is only simulated (sim=realrun executes pure placements and pure data parallelism)"
        )
    used = sorted(set(cid.tolist()))
    cfgs = [strategy.configs[c] for c in used]
    first = cfgs[0]
    for c, cfg in zip(used, cfgs):
        other = {k: d for k, d in cfg.dims if d > 1 and k != "sample"}
        if other:
            v = int(np.flatnonzero(cid == c)[0])
            raise RealRunError(
                f"{what}: node {v} ({names[v]}) has config {cfg}, split along {sorted(other)}; sim=realrun executes "
                "sample-dimension (data) parallelism only on this graph - other configs are only simulated"
            )
        if cfg.devices != first.devices:
            v = int(np.flatnonzero(cid == c)[0])
            raise RealRunError(
                f"{what}: node {v} ({names[v]}) has config {cfg} but others {first}; data parallelism with different "
                "device sets per node is only simulated"
            )
    return tuple(first.devices)



class RealRun:
    """``sim=realrun``: simulate (``step_time_s``) and execute for real (``measured_step_time_s``).
    An :class:`~simulators.simulate.ExecutingBackend`: harness.app.run captures the graph with
    its fx module and calls :meth:`bind` with the source."""

    def __init__(
        self,
        warmup: int = 5,
        steps: int = 50,
        backend: str = "auto",
        device: str = "auto",
        threads_per_rank: int = 1,
        launcher: str = "spawn",
        order: str = "strict",
        timeout_s: float = 600.0,
        job_dir: str | None = None,
        spin_idle: bool = True,
        early_recv: bool = True,
        steady_malloc: bool = True,
        interleave_profile: bool = False,
        trace: bool = False,
        rank_timeout_s: float = 120.0,
        force: bool = False,
        **params: Any,
    ) -> None:
        known_keys(params, KEYS, "sim", RealRunError)
        self.launcher = one_of(launcher, "sim.launcher", LAUNCHERS, RealRunError)
        self.backend = one_of(backend, "sim.backend", ("auto", "gloo", "nccl"), RealRunError)
        self.device = one_of(device, "sim.device", ("auto", "cpu", "cuda"), RealRunError)
        self.order = one_of(order, "sim.order", MODES, RealRunError)
        self.warmup = non_negative_int(warmup, "sim.warmup", RealRunError)
        self.steps = positive_int(steps, "sim.steps", RealRunError)
        self.threads = positive_int(threads_per_rank, "sim.threads_per_rank", RealRunError)
        self.timeout_s = positive_number(timeout_s, "sim.timeout_s", RealRunError)
        numeric = isinstance(rank_timeout_s, (int, float, np.number)) and not isinstance(rank_timeout_s, bool)
        self.rank_timeout_s = float(rank_timeout_s) if numeric else math.nan
        if not 0 < self.rank_timeout_s < self.timeout_s:  # NaN fails too
            raise RealRunError(f"sim.rank_timeout_s must be > 0 and below sim.timeout_s ({timeout_s}), torch.distributed's own timeout, "
                               f"or a rank waiting for a stalled one fails first and the stalled one goes unnamed; got {rank_timeout_s} "
                               "(raise sim.timeout_s with it)")
        if job_dir is not None and (not isinstance(job_dir, str) or not job_dir.strip()):
            raise RealRunError(f"sim.job_dir must be a directory's path or null (a temporary directory), got {job_dir!r}")
        self.job_dir = job_dir
        self.force = boolean(force, "sim.force", RealRunError)
        self.spin_idle = boolean(spin_idle, "sim.spin_idle", RealRunError)
        self.early_recv = boolean(early_recv, "sim.early_recv", RealRunError)
        self.steady_malloc = boolean(steady_malloc, "sim.steady_malloc", RealRunError)
        self.interleave_profile = boolean(interleave_profile, "sim.interleave_profile", RealRunError)
        self.trace = boolean(trace, "sim.trace", RealRunError)
        self.source: Any = None
        self.seed = 0
        self.graph_cfg: dict[str, Any] = {}

    def bind(self, source: Any, seed: int = 0, graph_cfg: dict[str, Any] | None = None) -> None:
        """The model source (real weights and inputs come from a real instance of it)."""
        self.source = source
        self.seed = int(seed)
        self.graph_cfg = dict(graph_cfg or {})

    # ------------------------------------------------------------------ plan -> job
    def _device(self) -> str:
        import torch

        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def _exec_graph(self, batch: int, granularity: str) -> tuple[OpGraph, ExecGraph]:
        src = self.source
        if batch != src.batch_size:
            src = copy.copy(src)
            src.batch_size = int(batch)
        opt = self.graph_cfg.get("optimizer", "sgd")
        probe = self.graph_cfg.get("batch_probe", True)
        g = src.op_graph(granularity=granularity, optimizer=opt, batch_probe=probe, keep_fx=True)
        return g, ExecGraph.from_graph(g)

    def prepare(self, graph: Any, strategy: Strategy, num_devices: int, collect: bool = False) -> Job:
        """Check that the plan can run for real and build each rank's program."""
        if self.source is None or not hasattr(self.source, "build"):
            raise RealRunError(
                "sim=realrun needs a PyTorch model source (a zoo model or model=custom); "
                + ("none was bound (harness.app.run binds it; call RealRun.bind(source) yourself otherwise)" if self.source is None
                   else f"model {getattr(self.source, 'name', '?')!r} is a {type(self.source).__name__}, which has nothing to execute")
            )
        name = getattr(self.source, "name", "?")
        what = f"model {name!r}"
        if _is_layer_graph(graph):
            inputs = np.array([k == "input" for k in graph.kinds], dtype=bool)
            keep = ~inputs
            if any(split_dims(strategy.config_of(v)).get("channel", 1) > 1 for v in np.flatnonzero(keep)):
                devs, linear, elementwise = layer_channel_split(graph, strategy, what)
                return self._dp_job(devs, num_devices, collect, "aten", int(self.source.batch_size), None, (graph, linear, elementwise))
            sub = Strategy(strategy.device[keep], strategy.order[keep], strategy.config_id[keep], strategy.configs)
            try:
                devs = _uniform_sample_config(sub, f"{what} (layer graph)", [n for n, k in zip(graph.names, keep) if k])
            except RealRunError as e:
                raise RealRunError(f"{e}. Of layer-graph (OptCNN / PaSE) strategies only data parallelism with channel-parallel "
                                   "linear (and elementwise) layers runs for real; other configs are simulated only") from None
            if devs is None:
                raise RealRunError(f"{what}: a layer-graph strategy without parallel configs cannot be executed")
            return self._dp_job(devs, num_devices, collect, "aten", int(self.source.batch_size), None)
        if not isinstance(graph, OpGraph):
            raise RealRunError(f"{what}: cannot execute a plan on a {type(graph).__name__}")
        if graph.meta.get("synthetic"):
            raise RealRunError(f"{what}: a synthetic graph has no operators to execute")
        devs = _uniform_sample_config(strategy, what, graph.names)
        gran = str(graph.meta.get("granularity", self.graph_cfg.get("granularity", "aten")))
        B = int(graph.meta.get("batch_size", self.source.batch_size))
        aten, eg, grp = self._resolve_graph(graph, gran, B, what)
        if devs is not None:
            order = strategy.order if grp is None else None
            return self._dp_job(devs, num_devices, collect, "aten" if gran == "layer" else gran, B, order)
        # operator placement
        if grp is None:
            dev, order = strategy.device.astype(np.int64), strategy.order.astype(np.int64)
        else:  # a layer-granularity node runs its aten ops, in their order, on its device
            dev = strategy.device.astype(np.int64)[grp]
            order = np.empty(aten.num_nodes, np.int64)
            key = sorted(range(aten.num_nodes), key=lambda j: (int(strategy.order[grp[j]]), j))
            order[key] = np.arange(aten.num_nodes)
        if (dev < 0).any() or (dev >= num_devices).any():
            v = int(np.flatnonzero((dev < 0) | (dev >= num_devices))[0])
            raise RealRunError(f"{what}: node {v} ({aten.names[v]}) is on device {int(dev[v])}, outside 0..{num_devices - 1}")
        home = param_home_nodes(aten)
        # NCCL runs a rank's sends and receives to one peer in order on one stream, and a posted
        # receive holds that stream until its data comes: posted up front, it would block the
        # sends its own data depends on.  gloo matches by tag and sends from the caller's thread.
        progs = placement_programs(eg, dev, order, num_devices, home, early_recv=self.early_recv and self._backend() == "gloo")
        job = self._job("placement", eg, progs, num_devices, collect, [], int(aten.meta["batch_size"]))
        job.ref_group = grp
        return job

    def _resolve_graph(self, graph: OpGraph, gran: str, batch: int, what: str) -> tuple[OpGraph, ExecGraph, np.ndarray | None]:
        """The captured aten graph (with fx) the plan's graph stands for, its ExecGraph, and for
        a layer-granularity graph the coarse node of every aten node; refuse a rewritten graph.

        A plan graph without an fx module is accepted when it is structurally the captured graph
        (same names, targets and edges: an algorithm that copied it without changing it)."""
        if graph.fx is not None:
            return graph, ExecGraph.from_graph(graph), None
        if gran == "layer":
            aten, eg = self._exec_graph(batch, "aten")
            grp = layer_runs(aten)
            starts = np.flatnonzero(np.concatenate([[True], grp[1:] != grp[:-1]])) if aten.num_nodes else np.zeros(0, np.int64)
            if len(starts) == graph.num_nodes and [aten.names[s] for s in starts] == list(graph.names):
                return aten, eg, grp
            raise RealRunError(self._rewritten(what, graph))
        aten, eg = self._exec_graph(batch, gran)
        same = (aten.num_nodes == graph.num_nodes and list(aten.names) == list(graph.names) and list(aten.targets) == list(graph.targets)
                and np.array_equal(aten.src, graph.src) and np.array_equal(aten.dst, graph.dst))
        if not same:
            raise RealRunError(self._rewritten(what, graph))
        return aten, eg, None

    @staticmethod
    def _rewritten(what: str, graph: OpGraph) -> str:
        return (f"{what}: the plan's graph ({graph.num_nodes} nodes) is not the captured graph - it was rewritten by the "
                "algorithm (FD-DPS split sub-ops, Celeritas coarse nodes) or loaded from a file, and has no executable form; "
                "it is only simulated (sim=default)")

    def _dp_job(self, devs: tuple[int, ...], num_devices: int, collect: bool, granularity: str, B: int, order: np.ndarray | None,
                channels: tuple[Any, list[int], list[int]] | None = None) -> Job:
        """Data parallelism over ``devs``; ``channels`` = (layer graph, its channel-parallel
        linear layers, its channel-parallel elementwise layers) runs those channel-parallel."""
        k = len(devs)
        if B % k:
            raise RealRunError(f"model {self.source.name!r}: data parallelism over {k} devices needs a batch divisible by {k}, got {B}")
        if any(d < 0 or d >= num_devices for d in devs):
            raise RealRunError(f"data-parallel devices {list(devs)} outside 0..{num_devices - 1}")
        full, _ = self._exec_graph(B, granularity)
        g, eg = self._exec_graph(B // k, granularity)
        if list(g.targets) != list(full.targets):
            raise RealRunError(
                f"model {self.source.name!r}: the graph at batch {B // k} (each of {k} data-parallel ranks) has other ops than at "
                f"batch {B}; use a batch of at least {2 * k}"
            )
        if order is None or len(order) != g.num_nodes:
            order = np.arange(g.num_nodes)
        chan = None
        if channels is not None:
            lg, linear, elementwise = channels
            chan = channel_plan(eg, g, lg, linear, elementwise, k, f"model {self.source.name!r}")
        prog = dp_program(eg, np.asarray(order), g.batch_role, k, chan)
        progs = []
        idle = RankProgram(0, "def step(PH, RB, W, _P=()):\n    return 0.0, {}", [], [], [], 0, 0, 0)
        for r in range(num_devices):
            p = copy.copy(prog if r in devs else idle)
            p.rank = r
            progs.append(p)
        if chan is None:
            job = self._job("data_parallel", eg, progs, num_devices, collect, list(devs), B)
            job.ref_group, job.ref_fraction = layer_runs(g), 1.0 / k
            return job
        job = self._job("channel_parallel", eg, progs, num_devices, collect, list(devs), B)
        job.param_rows = dict(chan.param_rows)
        job.gather = [f"{kind}{j}" for j in sorted(chan.param_rows) for kind in ("grad", "new")]
        return job

    def _backend(self) -> str:
        return self.backend if self.backend != "auto" else ("nccl" if self._device() == "cuda" else "gloo")

    def _job(self, mode: str, eg: ExecGraph, progs: list[RankProgram], world: int, collect: bool, dp: list[int], full_batch: int) -> Job:
        device = self._device()
        backend = self._backend()
        cores, _ = rank_cores(world, self.threads)
        return Job(world, mode, backend, device, self.threads, self.warmup, self.steps, self.seed, self.source, eg, progs, cores,
                   dp, full_batch, collect, self.timeout_s, self.rank_timeout_s, spin_idle=self.spin_idle and device == "cpu",
                   steady_malloc=self.steady_malloc and device == "cpu",
                   # a channel-parallel layer's ops are not the captured graph's: no profile of them to interleave
                   interleave_profile=self.interleave_profile and mode != "channel_parallel", trace=self.trace)

    # ------------------------------------------------------------------ run
    def check_environment(self) -> None:
        """Refuse, in one line saying what is missing, a ``sim.device=cuda`` without a GPU here and
        a ``sim.backend=nccl`` without NCCL or without GPUs for it (a prepared job, which runs on
        other hosts, is not checked)."""
        import torch
        import torch.distributed as dist

        if self.device == "cuda" and not torch.cuda.is_available():
            raise RealRunError(f"sim.device=cuda: {_no_gpu(torch)}; use sim.device=cpu (or auto), or run on a machine with GPUs")
        if self.backend != "nccl":
            return
        if not dist.is_available() or not dist.is_nccl_available():
            raise RealRunError(f"sim.backend=nccl: this PyTorch build (torch {torch.__version__}) has no NCCL "
                               "(torch.distributed.is_nccl_available() is false); use sim.backend=gloo (or auto)")
        if self._device() != "cuda":
            why = "sim.device=cpu" if self.device == "cpu" else _no_gpu(torch)
            raise RealRunError(f"sim.backend=nccl runs ranks on CUDA GPUs, and here they would be on CPU cores ({why}); "
                               "use sim.backend=gloo (or auto)")

    def execute(self, graph: Any, strategy: Strategy, num_devices: int, collect: bool = False) -> Measured:
        """Prepare, launch and read back a real run of a plan."""
        self.check_environment()
        job = self.prepare(graph, strategy, num_devices, collect)
        return launch(job, self.launcher, self.job_dir)

    def check_devices(self, job: Job, cluster: Cluster) -> None:
        """Refuse to run a GPU cluster's plan here unless each rank that has work gets a GPU of
        its own (rank r runs on GPU r mod the GPUs there are): on CPU ranks or shared GPUs the
        measured step says nothing about the cluster the step was simulated on (``sim.force``
        runs it anyway).  A cluster whose devices are CPUs (``cpu2``: its device kind is a CPU's
        profile name) runs on this machine's cores, as meant."""
        kinds = sorted({d.spec.kind for d in cluster.devices if cpu_kind_threads(d.spec.kind) is None})
        if self.force or not kinds:
            return
        import torch

        used = [p.rank for p in job.programs if p.nodes]
        gpus = torch.cuda.device_count() if job.device == "cuda" else 0
        if not used or max(used) < gpus:
            return
        here = (f"its {len(used)} busy ranks would share this machine's {gpus} GPU(s)" if gpus else
                f"this machine has no GPU (sim.device={self.device}): its {len(used)} busy ranks would run on CPU cores")
        raise RealRunError(f"cluster {cluster.name!r} is {cluster.num_devices} x {'/'.join(kinds)} but {here}, and the measured step "
                           f"would say nothing about that cluster; run on a machine with {max(used) + 1} such GPUs, use cluster=cpu2 to "
                           "measure this machine's CPU, or set sim.force=true to run it anyway")

    def __call__(self, graph: Any, strategy: Strategy, cluster: Cluster, costs: CostModel) -> SimResult:
        if self.launcher != "prepare":
            self.check_environment()
        job = self.prepare(graph, strategy, cluster.num_devices)  # refuse before spending time
        if self.launcher != "prepare":  # a prepared job runs on other hosts
            self.check_devices(job, cluster)
        res = simulate(graph, strategy, cluster, costs, self.order)
        if self.launcher == "prepare":
            key = os.environ.get(KEY_ENV) or new_key()  # the ranks started by hand get it through their environment
            d = write_job(job, self.job_dir, key)
            res.extras = {**getattr(res, "extras", {}), "realrun_job_dir": str(d), "realrun_job_key": key}
            return res
        m = launch(job, self.launcher, self.job_dir)
        extras = m.summary()
        meas = extras["measured_step_time_s"]
        extras["sim_relative_error"] = (res.step_time_s / meas - 1.0) if meas > 0 else None
        if len(m.reference_s):
            res.interleaved_costs = interleaved_costs(graph, cluster, costs, job, m.reference_s, m.reference_rank)
            t = None if res.interleaved_costs is None else simulate(graph, strategy, cluster, res.interleaved_costs, self.order).step_time_s
            extras["step_time_interleaved_s"] = t
            extras["sim_relative_error_interleaved"] = (t / meas - 1.0) if (t is not None and meas > 0) else None
        res.extras = {**getattr(res, "extras", {}), **extras}
        if self.trace:
            res.measured_timeline = {**m.timeline(), **_node_labels(graph, job)}
        return res


def _no_gpu(torch: Any) -> str:
    """Why ``torch.cuda.is_available()`` is false here, in words."""
    if torch.version.cuda is None:
        return f"this PyTorch build (torch {torch.__version__}) has no CUDA support"
    return "no CUDA GPU is visible to this machine's PyTorch (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)"


def _node_labels(graph: Any, job: Job) -> dict[str, Any]:
    """``node_name`` and ``node_phase`` of every executed node (``job.eg``'s) from the plan graph:
    the same node, or the coarse (layer-granularity) node it belongs to; for a graph they do not
    map onto, the executed graph's own targets and phase -1."""
    n = job.eg.num_nodes
    names, phase = getattr(graph, "names", None), getattr(graph, "phase", None)
    if names is not None and phase is not None:
        if len(names) == n:
            return {"node_name": list(names), "node_phase": np.asarray(phase, dtype=np.int64)}
        grp = job.ref_group
        if grp is not None and len(grp) == n and int(np.max(grp, initial=-1)) < len(names):
            return {"node_name": [names[g] for g in grp], "node_phase": np.asarray(phase, dtype=np.int64)[grp]}
    return {"node_name": [ins.target for ins in job.eg.instrs], "node_phase": np.full(n, -1, dtype=np.int64)}


def reference_outputs(source: Any, seed: int = 0, shards: int = 1, granularity: str = "aten", optimizer: str = "sgd",
                      batch_probe: bool = True, device: Any = "cpu") -> dict[str, Any]:
    """The single-process run of the captured step that a distributed run must reproduce:
    ``{"loss", "grads", "new_params"}`` of the first step from the initial state.

    ``shards=k`` gives data parallelism's semantics: the graph at batch B/k run on each k-th
    of the batch, loss, gradients and updated parameters averaged (batch statistics per
    shard, as DDP without SyncBatchNorm; for models without batch statistics this equals the
    full-batch run up to rounding).
    """
    B = int(source.batch_size)
    if B % shards:
        raise RealRunError(f"batch {B} does not split into {shards} shards")
    src = copy.copy(source)
    src.batch_size = B // shards
    g = src.op_graph(granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, keep_fx=True)
    eg = ExecGraph.from_graph(g)
    outs = []
    for k in range(shards):
        ph = initial_state(src, eg, seed, device, batch=B, shard=None if shards == 1 else (k, shards))
        outs.append(eg.run(ph, device))
    if shards == 1:
        return outs[0]

    def mean(vals: list[Any]) -> Any:
        return None if vals[0] is None else sum(vals[1:], vals[0].clone()) / len(vals)

    n = len(outs[0]["grads"])
    return {
        "loss": mean([o["loss"] for o in outs]),
        "grads": [mean([o["grads"][j] for o in outs]) for j in range(n)],
        "new_params": [mean([o["new_params"][j] for o in outs]) for j in range(n)],
    }
