"""Operator profiler: measure every distinct op of a training step on a real device.

``python -m harness.profile model=resnet50 device=cuda:0 batch_sizes=[8,16,32,64]``

For each batch size the step is captured (``keep_fx=True``) and executed once for real, node
by node in node order, on a real instance of the model (seeded weights, a seeded batch whose
integer inputs are valid class / token ids).  Each node is timed *in isolation* on the very
tensors the step gives it (so index inputs of embeddings, losses, pooling backward and
gathers are always valid): warm-up calls, then repetitions, each timed on its own -
``torch.cuda.Event`` pairs and ``synchronize`` on a GPU, ``time.perf_counter`` on the CPU
with ``torch.set_num_threads(threads)`` and the process pinned to ``threads`` cores.  Nodes
are deduplicated by *signature* (target, shapes, dtypes and strides of the tensor arguments,
the other arguments): a repeated signature reuses the first measurement (``dedup_of``).
Ops that mutate an argument are timed on clones of their arguments.  ``mode=in_situ`` times
instead every node's single call inside ``reps`` whole steps run in node order (after
``warmup`` steps), the median per node: the caches and allocator state of a real step, what
a single-device real run sees (an option beside the issue's isolated timing; compare both
with ``python -m experiments sim_accuracy --profile-mode``).  On CPU an in-situ node's time
also holds the release of the inputs it was the last to read, which a real run's rank does
right after the op.

Memory: on a GPU the increase of ``torch.cuda.max_memory_allocated`` over one call (output
plus workspace); on the CPU the bytes of the output storages that do not alias an input
(the allocator does not expose a peak), column ``mem_kind`` says which.

Output: one Parquet file per (model, granularity, graph fingerprint) under
``results/profiles/<device-name>/`` with a row per (batch size, node) and the environment
(torch version, device name, threads, CPU model - no host name).  At ``layer`` granularity
the aten nodes are profiled and each coarse node's row holds the sum over its members.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harness.core.errors import ProfileError
from harness.core.fingerprint import graph_fingerprint, layer_runs, node_keys
from simulators.realrun.execgraph import ExecGraph, initial_state, materialize, resolve
from harness.core.fx_graph import tensors_of
from harness.core.graph import BATCH_ROLES, PHASES
from harness.core.profiled import profile_dir_for
from harness.core.sources import TorchSource
from harness.core.machine import cpu_model, device_name, thread_count
from simulators.realrun.timing import IdleSpinners, dead_inputs, in_situ_step, pinned, steady_malloc

log = logging.getLogger("harness.app.profile")


# ---------------------------------------------------------------------------- timing
def signature(target: str, args: Any, kwargs: Any) -> str:
    """Target plus shapes, dtypes and strides of tensor arguments plus the other arguments."""
    import torch

    def enc(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"T{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}:{tuple(x.stride())}"
        if isinstance(x, (list, tuple)):
            inner = ",".join(enc(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ",".join(f"{k}={enc(v)}" for k, v in sorted(x.items())) + "}"
        return repr(x)

    return f"{target}{enc(tuple(args))}{enc(kwargs)}"


def _clone_tree(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone_tree(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    return x


def time_call(fn: Any, args: Any, kwargs: Any, device: Any, warmup: int, reps: int, max_op_s: float, mutates: bool = False) -> list[float]:
    """Seconds of each of up to ``reps`` timed calls of ``fn(*args, **kwargs)`` after ``warmup``
    calls; stops early (but after at least 3 timed calls) once ``max_op_s`` seconds are spent."""
    import torch

    cuda = torch.device(device).type == "cuda"

    def prep() -> tuple[Any, Any]:
        return (_clone_tree(args), _clone_tree(kwargs)) if mutates else (args, kwargs)

    spent = 0.0
    for _ in range(warmup):
        a, k = prep()
        t0 = time.perf_counter()
        fn(*a, **k)
        if cuda:
            torch.cuda.synchronize(device)
        spent += time.perf_counter() - t0
        if spent > max_op_s:
            break
    times: list[float] = []
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(max(1, reps)):
        a, k = prep()
        if cuda:
            start.record()
            fn(*a, **k)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*a, **k)
            times.append(time.perf_counter() - t0)
        if len(times) >= 3 and sum(times) > max_op_s:
            break
    return times


def _own_bytes(out: Any, inputs: Sequence[Any]) -> int:
    """Bytes of the output storages that are not storages of an input."""
    seen = {t.untyped_storage().data_ptr() for t in inputs}
    total = 0
    for t in tensors_of(out):
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def with_batch(source: Any, batch: int) -> Any:
    """A copy of a graph source with another batch size."""
    s = copy.copy(source)
    s.batch_size = int(batch)
    return s




def _in_situ(eg: ExecGraph, ph: list[Any], device: Any, warmup: int, reps: int, dead: list[list[int]]) -> np.ndarray:
    """Seconds of every node inside ``warmup + reps`` whole steps (:func:`in_situ_step`), the
    warm-up steps dropped: [reps, nodes]."""
    fns = [resolve(ins.target) for ins in eg.instrs]
    out = np.zeros((max(1, reps), eg.num_nodes))
    for s in range(warmup + max(1, reps)):
        t = in_situ_step(eg, ph, device, dead, fns)
        if s >= warmup:
            out[s - warmup] = t
    return out


def profile_graph(eg: ExecGraph, ph: list[Any], device: Any, warmup: int, reps: int, max_op_s: float, bar: Any,
                   mode: str = "isolated") -> list[dict[str, Any]]:
    """Run the step node by node and time each new signature (``isolated``), or time every
    node inside repeated whole steps (``in_situ``); one dict per node."""
    import torch

    n = eg.num_nodes
    cuda = torch.device(device).type == "cuda"
    dead = dead_inputs(eg)
    vals: list[Any] = [None] * n
    seen: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    for i, ins in enumerate(eg.instrs):
        fn = resolve(ins.target)
        args = materialize(ins.args, vals, ph, device)
        kwargs = materialize(ins.kwargs, vals, ph, device)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            m0 = torch.cuda.memory_allocated(device)
        out = fn(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize(device)
            mem = int(torch.cuda.max_memory_allocated(device) - m0)
        else:
            mem = _own_bytes(out, tensors_of((args, kwargs)))
        vals[i] = out
        sig = signature(ins.target, args, kwargs)
        if mode == "in_situ":
            rows.append({"node": i, "signature": sig, "dedup_of": -1, "mem_bytes": mem})
        elif sig in seen:
            j = seen[sig]
            rows.append({**rows[j], "node": i, "dedup_of": j, "mem_bytes": mem})
        else:
            seen[sig] = i
            ts = time_call(fn, args, kwargs, device, warmup, reps, max_op_s, mutates=ins.mutates)
            rows.append({
                "node": i, "signature": sig, "dedup_of": -1, "time_s": float(statistics.median(ts)),
                "time_mean_s": float(statistics.fmean(ts)), "time_min_s": float(min(ts)),
                "time_std_s": float(statistics.pstdev(ts)) if len(ts) > 1 else 0.0, "reps": len(ts), "mem_bytes": mem,
            })
        del args, kwargs, out
        for j in dead[i]:  # free what no later node reads
            vals[j] = None
        if bar is not None:
            bar.update(1)
    if mode == "in_situ":
        ts = _in_situ(eg, ph, device, warmup, reps, dead)
        for i, row in enumerate(rows):
            col = ts[:, i]
            row.update({"time_s": float(np.median(col)), "time_mean_s": float(col.mean()), "time_min_s": float(col.min()),
                        "time_std_s": float(col.std()), "reps": len(col)})
    return rows


def profile_model(
    source: Any,
    device: str = "cpu",
    batch_sizes: Sequence[int] | None = None,
    threads: int = 1,
    warmup: int = 3,
    reps: int = 10,
    max_op_s: float = 0.5,
    granularity: str = "aten",
    optimizer: str = "sgd",
    batch_probe: bool = True,
    seed: int = 0,
    out_dir: str | Path | None = None,
    name: str | None = None,
    pin: bool = True,
    progress: bool = True,
    mode: str = "isolated",
    spin_idle: bool = True,
    steady: bool = True,
) -> list[Path]:
    """Profile a :class:`~harness.core.models.TorchModel` at each batch size; returns the files written.

    The calling process is pinned to ``threads`` cores with ``threads`` torch threads while it
    runs (CPU), and restored afterwards; with ``spin_idle`` those cores carry the idle spinners
    a CPU rank of ``sim=realrun`` runs with (:class:`IdleSpinners`), so that ops are timed on
    a core in the same state as the real run's.  With ``steady`` (CPU) the process keeps the
    memory it frees (:func:`steady_malloc`, as ``sim=realrun``'s ranks do): process-wide, and
    left so afterwards."""
    import torch

    if not isinstance(source, TorchSource):
        raise ProfileError(f"model {getattr(source, 'name', source)!r} is not a PyTorch model source: only TorchModel sources can be profiled")
    if granularity not in ("aten", "core_aten", "layer"):
        raise ProfileError(f"unknown granularity {granularity!r}: use aten, core_aten or layer")
    if mode not in ("isolated", "in_situ"):
        raise ProfileError(f"unknown profile mode {mode!r}: use isolated or in_situ")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device {device!r} requested but CUDA is not available on this machine")
    threads = int(threads)
    with pinned(threads, pin and dev.type == "cpu") as cores, IdleSpinners(cores if spin_idle else []):
        malloc = "steady" if (dev.type == "cpu" and steady and steady_malloc()) else "default"
        return _profile_batches(source, dev, threads, warmup, reps, max_op_s, granularity, optimizer, batch_probe, seed, out_dir, name,
                                progress, cores, batch_sizes, mode, malloc)


def _profile_batches(source: Any, dev: Any, threads: int, warmup: int, reps: int, max_op_s: float, granularity: str, optimizer: str,
                     batch_probe: bool, seed: int, out_dir: Any, name: str | None, progress: bool, cores: list[int],
                     batch_sizes: Sequence[int] | None, mode: str = "isolated", malloc: str = "default") -> list[Path]:
    import pandas as pd
    import torch
    from tqdm import tqdm

    from harness.core.graph_rewrites import coarsen_runs

    device = str(dev)
    dname = name or device_name(device, threads)
    out = Path(out_dir) if out_dir else profile_dir_for(dname)
    batches = sorted({int(b) for b in (batch_sizes or [max(1, source.batch_size // 2), source.batch_size])})
    env = {
        "model": source.name, "granularity": granularity, "optimizer": optimizer, "device": str(dev),
        "device_name": dname, "torch_version": torch.__version__, "threads": threads, "cpu_model": cpu_model(),
        "cuda_version": torch.version.cuda or "", "mem_kind": "cuda_peak_delta" if dev.type == "cuda" else "cpu_output_bytes",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "mode": mode, "malloc": malloc,
    }
    log.info("profiling %s on %s (%s), batches %s, cores %s", source.name, dname, dev, batches, cores)
    frames = []
    for b in batches:
        src = with_batch(source, b)
        g = src.op_graph(granularity="aten" if granularity == "layer" else granularity, optimizer=optimizer, batch_probe=batch_probe, keep_fx=True)
        eg = ExecGraph.from_graph(g)
        torch.manual_seed(seed)
        ph = initial_state(src, eg, seed, dev)
        bar = tqdm(total=eg.num_nodes, desc=f"{source.name} b={b}", unit="op", disable=not progress, leave=False)
        try:
            rows = profile_graph(eg, ph, dev, warmup, reps, max_op_s, bar, mode)
        finally:
            bar.close()
        df = pd.DataFrame(rows)
        target_graph = g
        if granularity == "layer":
            target_graph = coarsen_runs(g)
            target_graph.meta.update({"granularity": "layer", "optimizer": optimizer})
            grp = layer_runs(g)
            agg = pd.DataFrame({"run": grp, "time_s": df["time_s"], "time_mean_s": df["time_mean_s"], "time_min_s": df["time_min_s"],
                                "mem_bytes": df["mem_bytes"], "reps": df["reps"]})
            df = agg.groupby("run", sort=True).agg(time_s=("time_s", "sum"), time_mean_s=("time_mean_s", "sum"), time_min_s=("time_min_s", "sum"),
                                                    mem_bytes=("mem_bytes", "sum"), reps=("reps", "min")).reset_index(names="node")
            df["signature"] = [f"layer-run of {c} aten ops" for c in np.bincount(grp)]
            df["dedup_of"] = -1
            df["time_std_s"] = np.nan
        tg = target_graph
        df["name"] = tg.names
        df["target"] = tg.targets
        df["key"] = node_keys(tg)
        df["role"] = [BATCH_ROLES[r] for r in tg.batch_role]
        df["phase"] = [PHASES[p] for p in tg.phase]
        df["free"] = tg.free
        df["flops"] = tg.flops
        df["work_bytes"] = tg.work_bytes
        df["out_bytes"] = tg.out_bytes
        df["batch_size"] = b
        df["graph_fp"] = graph_fingerprint(tg)
        df["dtype"] = str(tg.meta.get("dtype", "float32"))
        for k, v in env.items():
            df[k] = v
        frames.append(df)
        del ph, eg
    return write_profile(pd.concat(frames, ignore_index=True), out)


COLUMNS = ["model", "granularity", "optimizer", "batch_size", "node", "name", "target", "signature", "key", "role", "phase", "free",
           "time_s", "time_mean_s", "time_min_s", "time_std_s", "reps", "dedup_of", "mem_bytes", "mem_kind", "flops", "work_bytes",
           "out_bytes", "graph_fp", "dtype", "device", "device_name", "torch_version", "threads", "cpu_model", "cuda_version", "created", "mode", "malloc"]


def write_profile(df: Any, out: Path) -> list[Path]:
    """Write one Parquet per (model, granularity, fingerprint) into ``out``; rows of batch
    sizes already in an existing file of the same environment are replaced, others kept."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    files = []
    for (model, gran, fp), part in df.groupby(["model", "granularity", "graph_fp"], sort=True):
        path = out / f"{model}_{gran}_{fp[:10]}.parquet"
        part = part[COLUMNS]
        if path.exists():
            old = pd.read_parquet(path)
            env = ["device_name", "torch_version", "threads", "mode", "malloc"]
            same_env = set(COLUMNS) <= set(old.columns) and \
                {tuple(x) for x in old[env].drop_duplicates().itertuples(index=False)} == {tuple(x) for x in part[env].drop_duplicates().itertuples(index=False)}
            if same_env:
                old = old[~old["batch_size"].isin(part["batch_size"].unique())]
                part = pd.concat([old[COLUMNS], part], ignore_index=True)
        part = part.sort_values(["batch_size", "node"], kind="stable").reset_index(drop=True)
        part.to_parquet(path, index=False)
        files.append(path)
        log.info("wrote %s (%d rows)", path, len(part))
    return files


def summarize(files: Sequence[Path]) -> str:
    """One line per file and batch: ops, distinct signatures, total time of a step's ops."""
    import pandas as pd

    lines = []
    for f in files:
        df = pd.read_parquet(f)
        for b, part in df.groupby("batch_size"):
            lines.append(f"{f.name}  batch {b}: {len(part)} nodes, {(part['dedup_of'] < 0).sum()} distinct, "
                         f"sum of op times {part['time_s'].sum() * 1e3:.3f} ms ({part['device_name'].iloc[0]}, {part['threads'].iloc[0]} threads)")
    return "\n".join(lines)


def main() -> None:
    import hydra
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    from harness.app.compose import CONF

    @hydra.main(version_base="1.3", config_path=str(CONF), config_name="profile")
    def main(cfg: DictConfig) -> None:
        source = instantiate(cfg.model, _recursive_=False)
        g = OmegaConf.to_container(cfg.graph, resolve=True) or {}
        files = profile_model(
            source, device=str(cfg.device), batch_sizes=list(cfg.batch_sizes) if cfg.batch_sizes else None,
            threads=thread_count(cfg.threads, "threads"), warmup=int(cfg.warmup), reps=int(cfg.reps), max_op_s=float(cfg.max_op_s),
            granularity=str(g.get("granularity", "aten")), optimizer=str(g.get("optimizer", "sgd")),
            batch_probe=bool(g.get("batch_probe", True)), seed=int(cfg.seed), out_dir=cfg.out_dir, name=cfg.device_name,
            pin=bool(cfg.pin), progress=bool(cfg.progress), mode=str(cfg.mode), spin_idle=bool(cfg.get("spin_idle", True)),
            steady=bool(cfg.get("steady_malloc", True)),
        )
        print(summarize(files))

    main()


if __name__ == "__main__":
    main()
