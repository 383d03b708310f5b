"""The kernel microbenchmarks of the GPU probe (:mod:`harness.app.block_probe`): a block's GEMMs
(BF16, FP8), its attention per SDPA backend and beside other kernels, AdamW, memory-bound kernels
with the bytes they must move, a GEMM loop under sustained load - and the timing helpers they and
the probe share.  Needs ``torch`` alone."""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from harness.app.probe_model import ProbeShape


SMI_FIELDS = "name,driver_version,power.limit,power.max_limit,clocks.max.sm,clocks.max.mem,memory.total"
SMI_LIVE = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def smi(fields: str) -> str:
    """One line of ``nvidia-smi --query-gpu=fields`` ('' where there is none)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def timer(device: torch.device) -> Callable[[Callable[[], Any], int, int], list[float]]:
    """``measure(fn, warmup, reps)``: seconds of each of ``reps`` calls of ``fn`` after ``warmup``."""

    def measure(fn: Callable[[], Any], warmup: int, reps: int) -> list[float]:
        for _ in range(warmup):
            fn()
        if device.type != "cuda":
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        torch.cuda.synchronize(device)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) / 1e3 for a, b in ev]

    return measure


def stats(ts: Sequence[float], per: float = 1.0) -> dict[str, float]:
    """Median and minimum of ``ts`` over ``per`` (a stack's time per block) and the count."""
    return {"median_s": statistics.median(ts) / per, "min_s": min(ts) / per, "reps": len(ts)}


def linears(s: ProbeShape) -> list[tuple[str, int, int]]:
    """(name, in, out) of every GEMM of a block and the head's logits."""
    kv = s.kv_heads * s.head_dim
    out = [("wq", s.hidden, s.hidden), ("wk", s.hidden, kv), ("wv", s.hidden, kv), ("wo", s.hidden, s.hidden), ("w1", s.hidden, s.ffn)]
    if s.family == "llama":
        out.append(("w3", s.hidden, s.ffn))
    return out + [("w2", s.ffn, s.hidden), ("logits", s.hidden, s.vocab)]


def time_gemms(s: ProbeShape, device: torch.device, dtype: torch.dtype, measure: Any, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``kernels.csv`` GEMM rows: forward ``x W^T``, input gradient ``dy W``, weight gradient
    ``dy^T x`` of every linear layer, isolated, with the operand layouts autograd uses."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows = []
    m = s.tokens
    for name, k, n in linears(s):
        x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
        w = torch.randn(n, k, device=device, dtype=dtype, generator=g)
        dy = torch.randn(m, n, device=device, dtype=dtype, generator=g)
        calls = {"forward": (lambda: F.linear(x, w), m, n, k), "bwd_input": (lambda: dy.mm(w), m, k, n),
                 "bwd_weight": (lambda: dy.t().mm(x), n, k, m)}
        for phase, (fn, mm, nn_, kk) in calls.items():
            st = stats(measure(fn, warmup, reps))
            rows.append({"shape": s.name, "kernel": "gemm", "name": name, "pass": phase, "m": mm, "n": nn_, "k": kk, "dtype": str(dtype).split(".")[-1],
                         **st, "tflops": 2.0 * mm * nn_ * kk / st["median_s"] / 1e12})
    return rows


def time_fp8_gemms(s: ProbeShape, device: torch.device, measure: Any, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``kernels.csv`` FP8 GEMM rows (``torch._scaled_mm``, BF16 output) of every linear layer, as
    torchao's Float8 training recipes call them, operands made in the layouts the kernel needs
    before timing (the casts and transposes a recipe adds are memory-bound kernels of their own):

    * ``float8``, the tensor-wise recipe (cuBLAS): E4M3 activations and weights, E5M2 output
      gradients, one scale per tensor; the forward with fast accumulation, the gradients without;
    * ``float8_rowwise``, the row-wise recipe (PyTorch's CUTLASS kernel): every operand E4M3, a
      scale per row of the left operand and per column of the right, the same accumulation;
    * ``float8_rowwise_rescaled``: the gradients' GEMMs as torchao ran the row-wise recipe's
      slow-accumulation GEMMs from late 2024 (pytorch/ao#1325): the tensor-wise cuBLAS GEMM with
      unit scales, then the row and column scales applied to its output by one multiply.

    Nothing where the GPU or build has no FP8 GEMM (a CUDA GPU below compute capability 8.9)."""
    if not hasattr(torch, "_scaled_mm") or (device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9)):
        return []
    g = torch.Generator(device=device).manual_seed(seed)
    one = torch.ones((), device=device)
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    rows = []
    m = s.tokens

    def col(t: torch.Tensor) -> torch.Tensor:  # the same matrix, column-major
        return t.t().contiguous().t()

    def rescaled(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=False) * (sa * sb)

    for name, k, n in linears(s):
        x = torch.randn(m, k, device=device, generator=g)
        w = torch.randn(n, k, device=device, generator=g)
        dy = torch.randn(m, n, device=device, generator=g)
        for dtype, dy_type in (("float8", e5), ("float8_rowwise", e4)):
            a_b = {"forward": (x.to(e4), w.to(e4).t(), True, m, n, k),
                   "bwd_input": (dy.to(dy_type), col(w).to(e4), False, m, k, n),
                   "bwd_weight": (dy.t().contiguous().to(dy_type), col(x).to(e4), False, n, k, m)}
            for phase, (a, b, fast, mm, nn_, kk) in a_b.items():
                sa, sb = (one, one) if dtype == "float8" else (torch.ones(mm, 1, device=device), torch.ones(1, nn_, device=device))
                calls = {dtype: lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)}
                if dtype == "float8_rowwise" and not fast:
                    calls["float8_rowwise_rescaled"] = lambda: rescaled(a, b, sa, sb)
                for label, fn in calls.items():
                    try:
                        st = stats(measure(fn, warmup, reps))
                    except RuntimeError as e:
                        print(f"{s.name}: {label} {name} {phase}: {str(e).splitlines()[0][:120]}", flush=True)
                        continue
                    rows.append({"shape": s.name, "kernel": "gemm", "name": name, "pass": phase, "m": mm, "n": nn_, "k": kk, "dtype": label,
                                 **st, "tflops": 2.0 * mm * nn_ * kk / st["median_s"] / 1e12})
    return rows


def attention_operands(s: ProbeShape, device: torch.device, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Seeded Q, K, V (leaves that take gradients) in the block's layout - transposed views of
    (batch, seq, heads, dim) - and an output gradient."""
    shape = (s.batch, s.seq, s.heads, s.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).transpose(1, 2).requires_grad_(True) for _ in range(3))
    return q, k, v, torch.randn(s.batch, s.heads, s.seq, s.head_dim, device=device, dtype=dtype, generator=g)


def time_attention(s: ProbeShape, device: torch.device, dtype: torch.dtype, measure: Any, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``kernels.csv`` attention rows: causal SDPA forward and forward + backward, isolated, on
    the block's layout (queries, keys and values transposed views of (batch, seq, heads, dim))."""
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = attention_operands(s, device, dtype, g)

    def fb() -> None:
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    flops = 4.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim / 2  # causal: half the scores
    rows = []
    for backend in ("default", "flash", "cudnn") if device.type == "cuda" else ("default",):
        for phase, fn, mult in (("forward", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1.0), ("forward_backward", fb, 3.5)):
            try:
                with backend_ctx(backend):
                    st = stats(measure(fn, warmup, reps))
            except RuntimeError as e:  # a backend this build or GPU lacks: say so, go on
                print(f"{s.name}: attention {backend} {phase}: {str(e).splitlines()[0][:120]}", flush=True)
                continue
            rows.append({"shape": s.name, "kernel": "attention", "name": f"sdpa_causal_{backend}", "pass": phase, "m": s.seq, "n": s.seq,
                         "k": s.head_dim, "dtype": str(dtype).split(".")[-1], **st, "tflops": mult * flops / st["median_s"] / 1e12})
    return rows


def time_attention_between(s: ProbeShape, device: torch.device, dtype: torch.dtype, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``kernels.csv`` attention rows ``flash_alone``, ``flash_after_gemm``, ``flash_after_copy``:
    the FlashAttention-2 forward and backward each timed alone (events around the attention
    only), with nothing, the block's largest GEMM or a copy of the block's activations issued
    just before each call: does a kernel run slower right after a GEMM, as inside a step?"""
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = attention_operands(s, device, dtype, g)
    x = torch.randn(s.tokens, s.hidden, device=device, dtype=dtype, generator=g)
    w = torch.randn(s.ffn, s.hidden, device=device, dtype=dtype, generator=g)
    src = torch.randn(s.tokens * s.hidden, device=device, dtype=dtype, generator=g)
    dst = torch.empty_like(src)
    before: dict[str, Callable[[], Any] | None] = {"alone": None, "after_gemm": lambda: F.linear(x, w), "after_copy": lambda: dst.copy_(src)}
    cuda = device.type == "cuda"
    rows = []
    with backend_ctx("flash" if cuda else "default"):
        for name, pre in before.items():
            for phase in ("forward", "backward"):
                spans: list[Any] = []
                for _ in range(warmup + reps):
                    out = None
                    if phase == "backward":
                        q.grad = k.grad = v.grad = None
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    if pre is not None:
                        pre()
                    a, b = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
                    t0 = time.perf_counter()
                    if a is not None:
                        a.record()
                    if out is None:
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    else:
                        out.backward(do)
                    if b is not None:
                        b.record()
                    spans.append((a, b) if cuda else time.perf_counter() - t0)
                if cuda:
                    torch.cuda.synchronize(device)
                ts = [a.elapsed_time(b) / 1e3 for a, b in spans[warmup:]] if cuda else spans[warmup:]
                rows.append({"shape": s.name, "kernel": "attention", "name": f"flash_{name}", "pass": phase, "m": s.seq, "n": s.seq,
                             "k": s.head_dim, "dtype": str(dtype).split(".")[-1], **stats(ts), "tflops": float("nan"),
                             "smi_fields": SMI_LIVE, "smi": smi(SMI_LIVE) if cuda else ""})
    return rows


def backend_ctx(backend: str) -> Any:
    """A context that restricts SDPA to ``backend`` (``default``: PyTorch's own choice)."""
    import contextlib

    if backend == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend])


def time_optimizer(s: ProbeShape, device: torch.device, measure: Any, warmup: int, reps: int) -> list[dict[str, Any]]:
    """``kernels.csv`` optimizer rows: one AdamW step over FP32 master weights shaped like one
    block's parameters (with FP32 gradients), ``foreach`` and ``fused``."""
    shapes = [(o, i) for _, i, o in linears(s)[:-1]] + [(s.hidden,), (s.hidden,)]
    params = [torch.nn.Parameter(torch.zeros(sh, device=device)) for sh in shapes]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    elements = sum(p.numel() for p in params)
    rows = []
    for impl in ("foreach", "fused"):
        if impl == "fused" and device.type == "cpu" and not hasattr(torch, "_fused_adamw_"):
            continue
        opt = torch.optim.AdamW(params, lr=1e-4, **{impl: True})
        st = stats(measure(opt.step, warmup, reps))
        rows.append({"shape": s.name, "kernel": "adamw", "name": impl, "pass": "step", "m": elements, "n": 1, "k": 1, "dtype": "float32", **st,
                     "tflops": float("nan")})
        del opt
    return rows


#: the row width of the memory kernels' row-wise ops, and the logits' width of their log-softmax:
#: the element count a memory probe takes is a multiple of the latter (which is one of the former)
ROW, MEMORY_QUANTUM = 4096, 32768


def memory_ops(n: int, device: torch.device, g: torch.Generator) -> list[tuple[str, Callable[[], Any], float]]:
    """(name, call, bytes read + written) of the memory-bound kernels a training step runs, over
    ``n`` elements: STREAM's copy / scale / add / triad in BF16 and FP32, the casts, the
    activations, the norms' pieces, a row reduction and the bias gradient's column sum, stores
    alone (``fill``) and loads alone (``sum``), the loss's log-softmax forward and backward."""
    bf, f32 = torch.bfloat16, torch.float32

    def t(dtype: torch.dtype, shape: tuple[int, ...] = (n,)) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=f32, generator=g).to(dtype)

    a16, b16, c16 = t(bf), t(bf), t(bf)
    a32, b32, c32 = t(f32), t(f32), t(f32)
    rows, h = n // ROW, ROW
    x16, x32 = a16.view(rows, h), a32.view(rows, h)
    w, bias = t(bf, (h,)), t(bf, (h,))
    vocab = MEMORY_QUANTUM
    lg = a32[: (n // vocab) * vocab].view(-1, vocab)
    ls = torch.log_softmax(lg, -1)
    B, F = 2, 4
    return [
        ("copy_bf16", lambda: b16.copy_(a16), 2 * B * n), ("copy_fp32", lambda: b32.copy_(a32), 2 * F * n),
        ("scale_bf16", lambda: torch.mul(a16, 3.0, out=b16), 2 * B * n), ("scale_fp32", lambda: torch.mul(a32, 3.0, out=b32), 2 * F * n),
        ("add_bf16", lambda: torch.add(a16, b16, out=c16), 3 * B * n), ("add_fp32", lambda: torch.add(a32, b32, out=c32), 3 * F * n),
        ("triad_bf16", lambda: torch.add(a16, b16, alpha=3.0, out=c16), 3 * B * n),
        ("triad_fp32", lambda: torch.add(a32, b32, alpha=3.0, out=c32), 3 * F * n),
        ("cast_bf16_fp32", lambda: b32.copy_(a16), (B + F) * n), ("cast_fp32_bf16", lambda: b16.copy_(a32), (B + F) * n),
        ("silu_bf16", lambda: torch.nn.functional.silu(a16), 2 * B * n), ("gelu_bf16", lambda: torch.nn.functional.gelu(a16), 2 * B * n),
        ("mul_bf16", lambda: a16 * b16, 3 * B * n), ("pow2_fp32", lambda: a32.pow(2), 2 * F * n),
        ("row_mean_fp32", lambda: x32.mean(-1, keepdim=True), F * n), ("row_scale_fp32", lambda: x32 * x32[:, :1], 2 * F * n),
        ("layer_norm_bf16", lambda: torch.nn.functional.layer_norm(x16, (h,), w, bias), 2 * B * n),
        ("col_sum_bf16", lambda: x16.sum(0), B * n), ("fill_bf16", lambda: b16.fill_(1.0), B * n), ("sum_bf16", lambda: a16.sum(), B * n),
        ("log_softmax_fp32", lambda: torch.log_softmax(lg, -1), 2 * F * lg.numel()),
        ("log_softmax_bwd_fp32", lambda: torch._log_softmax_backward_data(ls, ls, -1, f32), 3 * F * lg.numel()),
    ]


def time_memory(device: torch.device, n: int, measure: Any, warmup: int, reps: int, seed: int) -> list[dict[str, Any]]:
    """``kernels.csv`` memory rows: each of :func:`memory_ops` isolated, with the bytes it must
    move at the least (its inputs read once, its output written once) and the rate that gives."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for name, fn, nbytes in memory_ops(n, device, g):
        st = stats(measure(fn, warmup, reps))
        rows.append({"shape": f"elements_{n}", "kernel": "memory", "name": name, "pass": "isolated", "m": n, "n": 1, "k": 1,
                     "dtype": name.rsplit("_", 1)[-1], **st, "tflops": float("nan"), "bytes": nbytes, "GBps": nbytes / st["median_s"] / 1e9})
    return rows


def sustained(device: torch.device, dtype: torch.dtype, seconds: float, n: int, seed: int) -> list[dict[str, Any]]:
    """``sustained.csv``: an ``n``^3 GEMM's rate over its first 20 calls, then again after
    ``seconds`` of back-to-back calls, with ``nvidia-smi``'s live readings at each point."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    measure = timer(device)
    rows = []
    flops = 2.0 * n**3
    t0 = time.perf_counter()
    for when in ("first", "sustained"):
        if when == "sustained":
            while time.perf_counter() - t0 < seconds:
                for _ in range(20):
                    a @ b
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
        ts = measure(lambda: a @ b, 3, 20)
        rows.append({"when": when, "after_s": round(time.perf_counter() - t0, 1), "n": n, **stats(ts), "tflops": flops / statistics.median(ts) / 1e12,
                     "smi_fields": SMI_LIVE, "smi": smi(SMI_LIVE) if device.type == "cuda" else ""})
    return rows
