"""GPU probe: a decoder's training step and its kernels timed on a real GPU, for checking the
simulator's per-unit costs against the machine (``llm_accuracy``'s single-GPU check).

``python -m harness.block_probe --out DIR`` (a CUDA GPU; ``--device cpu --tiny`` runs the same
code at toy sizes).  Needs ``torch`` alone, so that it runs on a bare GPU machine.  For each
shape of :data:`harness.app.probe_model.SHAPES` it writes, as each part finishes:

* ``units.csv``: a block's forward and forward + backward (the median over ``reps`` runs of the
  whole ``layers``-block stack, divided by ``layers``), the head's (final norm, logits, FP32
  loss) and the embedding's - the simulator's ``UnitCost.fwd_s`` and ``bwd`` phases;
* ``ops.csv``: ``torch.profiler``'s self device time per ATen operator and input shapes over one
  forward and one forward + backward of the stack and of the head, after warm-up: each kernel
  *in situ*, between its neighbours in a step;
* ``kernels.csv``: the same GEMMs (forward, input gradient, weight gradient, as autograd calls
  them; FP8 too for ``llama``, on an FP8 GPU), the attention kernel (forward, forward + backward) and AdamW over FP32 master weights
  (``foreach`` and ``fused``), each *isolated*, repeated back to back on the same operands;
* ``kernels.csv`` attention rows ``flash_alone`` / ``flash_after_gemm`` / ``flash_after_copy`` with
  ``--attention-between SHAPE``: FlashAttention-2 timed alone, right after nothing, a GEMM or a copy;
* ``units.csv`` and ``ops.csv`` rows ``block_flash`` with ``--flash SHAPE``: the block with SDPA
  held to FlashAttention-2;
* ``units.csv`` rows ``block_compiled`` with ``--compile SHAPE``: the blocks under ``torch.compile``;
* ``kernels.csv`` memory rows with ``--memory-elements N`` (run first): memory-bound kernels over
  ``N`` elements with the bytes each must move (:func:`harness.app.probe_kernels.memory_ops`) and the rate that gives;
* ``sustained_block.csv`` with ``--sustain-block-s`` (run first, from an idle GPU): the first
  shape's block run back to back, timed per window, with the clocks: the same work at first and
  once the GPU has settled at its power limit and temperature (the parts after it then run on
  the settled GPU);
* ``sustained.csv``: an 8192^3 GEMM's rate at first and after ``--sustain-s`` seconds of
  back-to-back GEMMs, with the SM clock and power ``nvidia-smi`` reads at each end (does the
  clock drop under a step's sustained load?);
* ``env.json``: the GPU, driver, power limit, clocks, torch and CUDA versions.

Times are ``torch.cuda.Event`` pairs around each call after ``warmup`` calls (``perf_counter``
on the CPU), reported as median and minimum.  Operands are seeded normal values (random inputs:
a GEMM on zeros runs faster, see ``harness/data/gpu/a100_h100/README.md``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from harness.app.probe_kernels import (MEMORY_QUANTUM, SMI_FIELDS, SMI_LIVE, backend_ctx, smi, stats, sustained, time_attention, time_attention_between,
                                       time_fp8_gemms, time_gemms, time_memory, time_optimizer, timer)
from harness.app.probe_model import SHAPES, TINY, Embed, Head, ProbeShape, Stack, init_, rope_table

def env_info(device: torch.device) -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {"date": _dt.date.today().isoformat(), "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, sm_count=p.multi_processor_count, mem_GiB=round(p.total_memory / 2**30, 2),
                    capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    nvidia_smi={"fields": SMI_FIELDS, "values": smi(SMI_FIELDS)})
    return info


class Writer:
    """CSV files under ``out``, each rewritten whole as rows arrive (nothing measured is lost)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, name: str, rows: Iterable[dict[str, Any]]) -> None:
        rs = self.rows.setdefault(name, [])
        rs.extend(rows)
        keys: list[str] = []
        for r in rs:
            keys += [k for k in r if k not in keys]
        with open(self.out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rs)


def _parts(s: ProbeShape, device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """The stack, head and embedding in ``dtype`` on ``device`` with seeded inputs."""
    with torch.device(device):
        stack, head, embed = Stack(s), Head(s), Embed(s)
    for i, m in enumerate((stack, head, embed)):
        init_(m, seed + 1000 * i).to(dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(s.batch, s.seq, s.hidden, device=device, dtype=dtype, generator=g).requires_grad_(True)
    gy = torch.randn(s.batch, s.seq, s.hidden, device=device, dtype=dtype, generator=g)
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), device=device, generator=g)
    table = rope_table(s.seq, s.head_dim, device) if s.family == "llama" else None
    return {"stack": stack, "head": head, "embed": embed, "x": x, "gy": gy, "ids": ids, "table": table}


def _steps(s: ProbeShape, p: dict[str, Any]) -> dict[tuple[str, str], Callable[[], Any]]:
    """Per (unit, pass) a callable running it once; grads set to None first (no accumulation)."""
    stack, head, embed, x, gy, ids, table = (p[k] for k in ("stack", "head", "embed", "x", "gy", "ids", "table"))

    def stack_fb() -> None:
        stack.zero_grad(set_to_none=True)
        x.grad = None
        stack(x, table).backward(gy)

    def head_fb() -> None:
        head.zero_grad(set_to_none=True)
        x.grad = None
        head(x, ids).backward()

    def embed_fb() -> None:
        embed.zero_grad(set_to_none=True)
        embed(ids).backward(gy)

    return {("block", "forward"): lambda: stack(x, table), ("block", "forward_backward"): stack_fb,
            ("head", "forward"): lambda: head(x, ids), ("head", "forward_backward"): head_fb,
            ("embedding", "forward"): lambda: embed(ids), ("embedding", "forward_backward"): embed_fb}


def time_units(s: ProbeShape, steps: dict[tuple[str, str], Callable[[], Any]], device: torch.device, measure: Any, warmup: int,
               reps: int) -> list[dict[str, Any]]:
    """``units.csv`` rows: each (unit, pass) per block (the stack over ``layers``) or per call,
    with its memory (:func:`memory`) and the clocks and power just after."""
    rows = []
    for (unit, phase), fn in steps.items():
        per = s.layers if unit == "block" else 1
        st = stats(measure(fn, warmup, reps), per)
        rows.append({"shape": s.name, "unit": unit, "pass": phase, **st, **memory(fn, device, per),
                     "smi_fields": SMI_LIVE, "smi": smi(SMI_LIVE) if device.type == "cuda" else ""})
    return rows


def memory(fn: Callable[[], Any], device: torch.device, per: int) -> dict[str, float]:
    """Bytes one call of ``fn`` leaves allocated (a forward: what it keeps for the backward) and
    its peak above what was allocated before, per block (``per``); NaN off CUDA."""
    if device.type != "cuda":
        return {"kept_bytes": float("nan"), "peak_bytes": float("nan")}
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    res = fn()
    torch.cuda.synchronize(device)
    kept = torch.cuda.memory_allocated(device) - before
    peak = torch.cuda.max_memory_allocated(device) - before
    del res
    return {"kept_bytes": kept / per, "peak_bytes": peak / per}


def profile_ops(s: ProbeShape, steps: dict[tuple[str, str], Callable[[], Any]], device: torch.device) -> list[dict[str, Any]]:
    """``ops.csv`` rows: self device (CPU: self CPU) time per operator and input shapes over one
    call of the block and head passes (warmed up by :func:`time_units`)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    rows = []
    for (unit, phase), fn in steps.items():
        if unit == "embedding":
            continue
        fn()
        with profile(activities=acts, record_shapes=True) as prof:
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        for e in prof.key_averages(group_by_input_shape=True):
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0.0)
            self_us = float(dev) if device.type == "cuda" else float(e.self_cpu_time_total)
            if self_us <= 0:
                continue
            rows.append({"shape": s.name, "unit": unit, "pass": phase, "layers": s.layers if unit == "block" else 1, "op": e.key,
                         "input_shapes": json.dumps(e.input_shapes), "calls": e.count, "self_us": self_us})
    return rows


def time_flash(s: ProbeShape, device: torch.device, dtype: torch.dtype, measure: Any, warmup: int, reps: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``units.csv`` and ``ops.csv`` rows of unit ``block_flash``: the block with SDPA held to its
    FlashAttention-2 backend (PyTorch's default on Hopper before cuDNN's became it)."""
    p = _parts(s, device, dtype, seed)
    steps = _steps(s, p)
    block = {k: v for k, v in steps.items() if k[0] == "block"}
    with backend_ctx("flash" if device.type == "cuda" else "default"):
        units = [dict(r, unit="block_flash") for r in time_units(s, block, device, measure, warmup, reps)]
        ops = [dict(r, unit="block_flash") for r in profile_ops(s, block, device)]
    return units, ops


def time_compiled(s: ProbeShape, device: torch.device, dtype: torch.dtype, measure: Any, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``units.csv`` rows of unit ``block_compiled``: the stack with each block under
    ``torch.compile`` (one graph per block, the loss and the head left eager), the compile
    itself in the warm-up."""
    p = _parts(s, device, dtype, seed)
    stack, x, gy, table = p["stack"], p["x"], p["gy"], p["table"]
    t0 = time.perf_counter()
    for i, blk in enumerate(stack.blocks):
        stack.blocks[i] = torch.compile(blk)

    def fb() -> None:
        stack.zero_grad(set_to_none=True)
        x.grad = None
        stack(x, table).backward(gy)

    fb()
    compile_s = time.perf_counter() - t0
    rows = []
    for phase, fn in (("forward", lambda: stack(x, table)), ("forward_backward", fb)):
        rows.append({"shape": s.name, "unit": "block_compiled", "pass": phase, **stats(measure(fn, warmup, reps), s.layers),
                     **memory(fn, device, s.layers), "smi_fields": SMI_LIVE, "smi": smi(SMI_LIVE) if device.type == "cuda" else "",
                     "compile_s": compile_s})
    return rows


def sustained_block(s: ProbeShape, device: torch.device, seconds: float, window_s: float, seed: int, w: "Writer") -> None:
    """``sustained_block.csv``: the block's forward + backward run back to back for ``seconds``,
    one row per ``window_s`` window (the median call over ``layers``, the clocks, power and
    temperature at its end), written as each window closes: how much slower the same work runs
    once the GPU has settled at its power limit and temperature."""
    p = _parts(s, device, torch.bfloat16, seed)
    fb = _steps(s, p)[("block", "forward_backward")]
    measure = timer(device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ts: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < window_s:
            ts += measure(fb, 0, 5)
        w.add("sustained_block.csv", [{"shape": s.name, "after_s": round(time.perf_counter() - t0, 1), **stats(ts, s.layers),
                                       "smi_fields": SMI_LIVE, "smi": smi(SMI_LIVE) if device.type == "cuda" else ""}])


def release(device: torch.device) -> None:
    """Hand the caching allocator's free blocks back between parts (each part sizes its own tensors)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def probe(shapes: Sequence[ProbeShape], out: Path, device: torch.device, warmup: int, reps: int, sustain_s: float, seed: int = 0,
          compiled: Sequence[ProbeShape] = (), sustain_block_s: float = 0.0, memory_elements: int = 0, flash: Sequence[ProbeShape] = (),
          between: Sequence[ProbeShape] = (),
          log: Callable[[str], None] = print) -> Path:
    """Run every part for every shape into ``out`` (module docstring); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    (out / "env.json").write_text(json.dumps(env_info(device), indent=1))
    w = Writer(out)
    measure = timer(device)
    if memory_elements > 0:
        w.add("kernels.csv", time_memory(device, memory_elements, measure, warmup, reps, seed))
        log(f"memory-bound kernels: {len(w.rows['kernels.csv'])} rows")
        release(device)
    if sustain_block_s > 0:
        s = shapes[0]
        sustained_block(s, device, sustain_block_s, max(sustain_block_s / 30, 0.1), seed, w)
        r = w.rows["sustained_block.csv"]
        log(f"{s.name}: block forward + backward {r[0]['median_s'] * 1e3:.2f} ms at first, {r[-1]['median_s'] * 1e3:.2f} ms after {r[-1]['after_s']} s")
        release(device)
    for s in shapes:
        t0 = time.perf_counter()
        parts = _parts(s, device, dtype, seed)
        steps = _steps(s, parts)
        w.add("units.csv", time_units(s, steps, device, measure, warmup, reps))
        log(f"{s.name}: units {time.perf_counter() - t0:.1f} s")
        w.add("ops.csv", profile_ops(s, steps, device))
        del parts, steps
        release(device)
        w.add("kernels.csv", time_gemms(s, device, dtype, measure, warmup, reps, seed))
        if s.family == "llama":
            w.add("kernels.csv", time_fp8_gemms(s, device, measure, warmup, reps, seed))
        w.add("kernels.csv", time_attention(s, device, dtype, measure, warmup, reps, seed))
        w.add("kernels.csv", time_optimizer(s, device, measure, warmup, reps))
        log(f"{s.name}: done {time.perf_counter() - t0:.1f} s")
        release(device)
    for s in between:
        t0 = time.perf_counter()
        w.add("kernels.csv", time_attention(s, device, dtype, measure, warmup, reps, seed))
        w.add("kernels.csv", time_attention_between(s, device, dtype, warmup, reps, seed))
        log(f"{s.name}: attention alone and between kernels {time.perf_counter() - t0:.1f} s")
    for s in flash:
        t0 = time.perf_counter()
        units, ops = time_flash(s, device, dtype, measure, warmup, reps, seed)
        w.add("units.csv", units)
        w.add("ops.csv", ops)
        log(f"{s.name}: FlashAttention-2 block {time.perf_counter() - t0:.1f} s")
        release(device)
    for s in compiled:
        t0 = time.perf_counter()
        w.add("units.csv", time_compiled(s, device, dtype, measure, warmup, reps, seed))
        log(f"{s.name}: compiled {time.perf_counter() - t0:.1f} s")
        release(device)
    if sustain_s > 0:
        w.add("sustained.csv", sustained(device, dtype, sustain_s, 8192 if device.type == "cuda" else 256, seed))
        log(f"sustained: {w.rows['sustained.csv'][-1]['tflops']:.0f} TFLOP/s after {sustain_s:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.block_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the CSV files")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--shapes", nargs="*", default=None, help=f"which shapes (default: all of {', '.join(SHAPES)})")
    ap.add_argument("--tiny", action="store_true", help=f"toy shapes ({', '.join(TINY)}) instead, for a CPU")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sustain-s", type=float, default=20.0, help="seconds of back-to-back GEMMs before the sustained reading (0: none)")
    ap.add_argument("--sustain-block-s", type=float, default=0.0, help="seconds of the first shape's block run back to back, timed in windows (0: none)")
    ap.add_argument("--memory-elements", type=int, default=0, help="also time memory-bound kernels over this many elements (first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flash", nargs="*", default=[], help="shapes whose blocks are also timed with SDPA held to FlashAttention-2")
    ap.add_argument("--attention-between", nargs="*", default=[], metavar="SHAPE",
                    help="shapes whose attention is also timed alone and right after a GEMM or a copy")
    ap.add_argument("--compile", nargs="*", default=[], help="shapes whose blocks are also timed under torch.compile (after the rest)")
    a = ap.parse_args(argv)
    table = TINY if a.tiny else SHAPES
    unknown = [n for n in [*(a.shapes or []), *a.compile, *a.flash, *a.attention_between] if n not in table]
    if unknown:
        print(f"error: unknown shape {unknown[0]!r}: use one of {', '.join(table)}", file=sys.stderr)
        return 1
    try:
        device = torch.device(a.device)
    except RuntimeError:
        print(f"error: --device {a.device!r} is not a device torch knows: use cuda, cuda:N or cpu", file=sys.stderr)
        return 1
    seconds = (a.sustain_s, a.sustain_block_s)
    problems = [
        (device.type == "cuda" and not torch.cuda.is_available(),
         "--device cuda but torch sees no CUDA GPU: run it on a GPU machine, or --device cpu --tiny"),
        (device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) >= torch.cuda.device_count(),
         f"--device {a.device} but torch sees {torch.cuda.device_count() if torch.cuda.is_available() else 0} GPU(s): use cuda:0 to cuda:N-1"),
        (a.reps < 1 or a.warmup < 0, "--reps must be >= 1 and --warmup >= 0"),
        (not all(math.isfinite(x) and x >= 0 for x in seconds), f"--sustain-s and --sustain-block-s take seconds >= 0 (0: none), got {seconds}"),
        (a.memory_elements < 0 or a.memory_elements % MEMORY_QUANTUM,
         f"--memory-elements must be a multiple of {MEMORY_QUANTUM} (0: none), got {a.memory_elements}"),
    ]
    for bad, message in problems:
        if bad:
            print(f"error: {message}", file=sys.stderr)
            return 1
    probe([table[n] for n in (a.shapes or table)], Path(a.out), device, a.warmup, a.reps, a.sustain_s, a.seed,
          compiled=[table[n] for n in a.compile], sustain_block_s=a.sustain_block_s,
          memory_elements=a.memory_elements, flash=[table[n] for n in a.flash],
          between=[table[n] for n in a.attention_between], log=lambda m: print(m, flush=True))
    return 0
