"""A transformer unit's work on one GPU (the Megatron-LM decomposition), for
:func:`harness.core.llm.work.unit_work`.

Sizes on one GPU for a micro-batch of ``b`` sequences of ``s`` tokens under a :class:`Shard`
(``t`` = tp, ``c`` = cp): ``T = b * ceil(s/c)`` tokens go through the tensor-parallel GEMMs,
``n = ceil(T/t)`` with sequence parallelism (else ``T``) through the norms, dropouts and
residuals; ``ceil(heads/t)`` query heads, ``ceil(kv_heads/t)`` key/value heads (one, replicated,
when ``t > kv_heads``, as Megatron-LM replicates them), ``ceil(ffn/t)`` MLP channels,
``ceil(vocab/t)`` vocabulary rows (Megatron pads the vocabulary to a multiple of ``t``: the
largest shard), ``ceil(experts/ep)`` experts.  Uneven splits cost their largest shard.

Kernels (:class:`harness.core.kernels.KernelTable`, one node per phase), forward:

* block: norm; QKV column-parallel GEMM; RoPE; the attention core, one fused ``ATTN`` kernel
  (``flash``; causal, over ``s/c`` queries and all ``s`` keys: ring attention) or, ``eager``,
  ``QK^T`` (ALiBi's bias first copied into the scores and read back), softmax (+ dropout),
  ``PV``; the row-parallel output projection; residual
  (+ dropout); norm; the MLP column then row parallel (gated: gate and up in one GEMM) with its
  activation, or a MoE layer: router GEMM and top-k, permutation, each local expert's GEMMs
  over its share ``T * top_k / local experts`` of the routed tokens (balanced routing), the
  shared experts as a dense MLP, un-permutation;
* embedding: the vocabulary-parallel lookup (+ positions, + norm, + dropout);
* head: final norm, the column-parallel logits GEMM and the vocabulary-parallel cross-entropy.

Under ``precision=amp_fp8`` the block's linear layers (QKV, output projection, the MLP's or the
experts' projections; not the router) run the FP8 recipe of :mod:`harness.core.llm.fp8`: FP8
GEMMs plus the kernels that quantize their operands, an FP8 all-gather of a column-parallel
input under sequence parallelism; the attention core, the norms, the embedding and the head
stay BF16, and the stored activations are the BF16 step's.

The memory-bound steps (norms, RoPE, the activation, the loss) are one kernel each at their
fewest bytes under ``spec.kernels == "fused"``; ``eager`` runs torchtitan's Llama code as PyTorch
eager's ATen kernels, ``compiled`` that code with its blocks and loss fused but GQA's ``repeat_kv``
copy and the final norm eager, ``compiled_blocks`` with its loss eager too
(:mod:`harness.core.llm.eager`).

Backward: each GEMM's input gradient (``bwd_input``) and weight gradient (``bwd_weight``, the
zero-bubble schedules' W; with biases, each bias's gradient too, a column sum of the output
gradient as Megatron-LM's and PyTorch's linear backward compute it), the attention backward
(2.5x its forward, input side), the memory-bound rows' gradients, and the sums autograd adds
where a tensor feeds two consumers: the residual stream's gradient at each residual (through
the skip and through the branch) and, in eager mode, torchtitan's separate Q / K / V and gate /
up projections' input gradients (kernel counts a profiled H100 step shows:
``harness/data/gpu/a100_h100/h100_probe_ops.csv``).

Recompute: selective re-runs the attention core forward, full the whole forward (collectives included), ``op`` (torchtitan's per-op selective checkpointing, dense
blocks) every memory-bound kernel, every second ``mm`` of :func:`harness.core.llm.flops.op_recomputed`
and the forward collectives but the reduce-scatters, keeping the block's input, the other
matmuls' outputs, the fused attention's output and statistics and the reduce-scatters' outputs.

Collectives (Korthikanti Sec. 4): without sequence parallelism an all-reduce of ``T h`` after
attention and after the MLP forward and one before each backward (4 per block); with it an
all-gather before and a reduce-scatter after each, mirrored backward (8 of the same volume);
a MoE layer adds its all-to-alls (dispatch and combine, forward and backward) over ``ep``, with
a tensor-parallel all-gather / reduce-scatter of the routed tokens around the experts (Megatron's
alltoall dispatcher); context parallelism passes K and V round the ring (``c - 1`` steps forward,
``2(c - 1)`` backward: K, V and their gradients), hidden behind the attention (``overlapped``).

Stored activations (bytes for one micro-batch) generalise Korthikanti Table 2 term by term: per
block, ``A`` bytes per element and 1 per dropout mask, ``n h`` for each of the two norm inputs,
the QKV and MLP inputs (and the dropout masks), ``T`` times the local Q, K, V, attention output
and MLP activations, and the attention core's ``b (a/t) (s/c) s`` scores (``eager``: softmax
output, dropout mask and output) or its FP32 softmax statistics (``flash``); with ``A`` = 2 and
GPT's shape that is ``s b h (34 + 5 a s / h)`` without parallelism, ``s b h (10 + 24/t + 5 a s/(h t))``
with TP, ``(s b h / t)(34 + 5 a s / h)`` with TP + SP, ``34 s b h / t`` with TP + SP + selective and
``2 s b h`` (``/t`` with SP: the checkpoint is the SP-sharded input) with full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np

from harness.core.kernels import ATTN, ATTN_IMPLS, GEMM, MEM, NCOLS, KernelTable
from harness.core.errors import OptionError
from harness.core.llm import eager as ek
from harness.core.llm.eager import EagerStep
from harness.core.llm.flops import op_recomputed
from harness.core.llm.fp8 import FP8_BYTES, fp8_linear_rows
from harness.core.llm.shard import CollectiveCall, Shard, UnitWork
from harness.core.llm.spec import TransformerSpec
from harness.core.precision import Precision, math_of

#: bytes of a token id (int64) and of a dropout mask element
ID_BYTES, MASK_BYTES = 8, 1


@dataclass(frozen=True)
class Local:
    """A unit's sizes on one GPU (see the module docstring)."""

    b: int          # sequences per micro-batch
    s: int          # the whole sequence (keys of the attention)
    sq: int         # tokens of the sequence on this GPU (ceil(s / cp))
    T: int          # tokens through the tensor-parallel GEMMs
    n: int          # tokens through the norms, dropouts and residuals
    t: int
    hl: int         # local query heads
    kvl: int        # local key/value heads
    d: int          # head size
    ql: int         # local query width
    kvdl: int       # local key/value width
    fl: int         # local dense MLP channels
    fel: int        # local channels of one expert
    fsl: int        # local channels of one shared expert
    le: int         # local experts
    vl: int         # local vocabulary rows
    A: int          # bytes per activation element
    math: int       # the GEMMs' math mode
    fp8: bool = False  # the block's linear layers run the FP8 recipe (precision amp_fp8)


def local_sizes(spec: TransformerSpec, seq_len: int, precision: str, shard: Shard) -> Local:
    """:class:`Local` of a shard (see the module docstring)."""
    prec = Precision(precision)
    dtype = prec.compute_dtype
    t, s = shard.tp, int(seq_len)
    sq = ceil(s / shard.cp)
    T = shard.micro_batch * sq
    hl = ceil(spec.heads / t)
    kvl = ceil(spec.kv_heads / t) if spec.kv_heads >= t else 1
    d = spec.head_size
    return Local(b=shard.micro_batch, s=s, sq=sq, T=T, n=ceil(T / t) if shard.sp else T, t=t, hl=hl, kvl=kvl, d=d,
                 ql=hl * d, kvdl=kvl * d, fl=ceil(spec.ffn_hidden / t),
                 fel=ceil(spec.expert_ffn_hidden / t) if spec.is_moe else 0, fsl=ceil(spec.expert_ffn_hidden / t) if spec.is_moe else 0,
                 le=ceil(spec.experts / shard.ep) if spec.is_moe else 0, vl=ceil(spec.vocab / t),
                 A=2 if dtype in ("float16", "bfloat16") else 4, math=math_of(dtype, False, prec), fp8=prec.fp8_linears)


class Phases:
    """The kernel rows of a unit's forward, input-gradient, weight-gradient and recompute phases;
    a row runs in ``math`` unless it says otherwise (an FP8 GEMM or cast)."""

    def __init__(self, math: int, fp8: bool = False, act_bytes: int = 2) -> None:
        self.math = math
        self.fp8 = fp8
        self.act_bytes = act_bytes
        self.rows: dict[str, list[tuple[int, tuple[int, ...], int, int]]] = {"fwd": [], "bwd_input": [], "bwd_weight": [], "recompute": []}

    def add(self, phase: str, kind: int, dims: tuple[int, ...], bdim: int, math: int | None = None) -> None:
        self.rows[phase].append((kind, tuple(int(x) for x in dims), bdim, self.math if math is None else int(math)))

    def linear(self, m: int, n: int, k: int, batch: int = 1) -> None:
        """A weight GEMM ``(m x k)(k x n)``: forward, input gradient ``(m x n)(n x k)``, weight gradient ``(k x m)(m x n)``."""
        self.add("fwd", GEMM, (batch, m, n, k), 1)
        self.add("bwd_input", GEMM, (batch, m, k, n), 1)
        self.add("bwd_weight", GEMM, (batch, k, n, m), 3)

    def block_linear(self, m: int, n: int, k: int, batch: int = 1, input_elements: int | None = None) -> None:
        """A linear layer of a transformer block: :meth:`linear`, or under the FP8 recipe its FP8
        GEMMs and quantize kernels (:func:`harness.core.llm.fp8.fp8_linear_rows`; ``input_elements``:
        what it quantizes of its input, all of it by default)."""
        if not self.fp8:
            self.linear(m, n, k, batch)
            return
        for phase, kind, dims, bdim, math in fp8_linear_rows(m, n, k, batch, self.act_bytes, input_elements):
            self.add(phase, kind, dims, bdim, math)

    def matmul(self, batch: int, m: int, n: int, k: int) -> None:
        """An activation-activation matmul (eager attention): both gradients are input gradients."""
        self.add("fwd", GEMM, (batch, m, n, k), 0)
        self.add("bwd_input", GEMM, (batch, m, k, n), 0)
        self.add("bwd_input", GEMM, (batch, k, n, m), 0)

    def mem(self, fwd_bytes: float, bwd_bytes: float) -> None:
        """A memory-bound kernel forward and its gradient (0 bytes: no kernel)."""
        if fwd_bytes > 0:
            self.add("fwd", MEM, (int(fwd_bytes),), 0)
        if bwd_bytes > 0:
            self.add("bwd_input", MEM, (int(bwd_bytes),), 0)

    def eager(self, step: EagerStep, elements: int) -> None:
        """An eager step's kernels (:mod:`harness.core.llm.eager`) over ``elements`` elements."""
        for phase, per in (("fwd", step.fwd), ("bwd_input", step.bwd)):
            for b in per:
                self.add(phase, MEM, (max(int(b * elements), 1),), 0)

    def table(self, phase: str) -> KernelTable:
        rows = self.rows[phase]
        if not rows:
            return KernelTable.empty()
        dims = np.array([d + (0,) * (NCOLS - len(d)) for _, d, _, _ in rows], dtype=np.int64)
        k = len(rows)
        return KernelTable(np.zeros(k), [r[0] for r in rows], dims, [r[2] for r in rows], [r[3] for r in rows], np.zeros(k, bool))


def mirrored(forward: list[tuple[str, str, int, int]]) -> list[tuple[str, str, int]]:
    """The backward's collectives mirroring forward ones ``(op, group, forward bytes, backward
    bytes)``: an all-gather's is a reduce-scatter and the reverse, a forward all-reduce (after a
    row-parallel layer) has its conjugate before the column-parallel one, an all-to-all is an
    all-to-all; each carries the backward bytes (a gradient in the activations' dtype where an
    FP8 all-gather gathered a quantized input)."""
    mirror = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_reduce": "all_reduce", "all_to_all": "all_to_all"}
    return [(mirror[op], group, back) for op, group, _, back in reversed(forward)]


def block_work(spec: TransformerSpec, seq_len: int, precision: str, shard: Shard, moe: bool) -> UnitWork:
    """One transformer block's :class:`UnitWork` (see the module docstring)."""
    if shard.recompute == "op" and moe:
        raise OptionError("algo.recompute=op: torchtitan's per-op policy is modelled for dense blocks; a MoE model takes "
                          "none, selective or full")
    L = local_sizes(spec, seq_len, precision, shard)
    h, A, T, n = spec.hidden, L.A, L.T, L.n
    tp, sp = L.t > 1, shard.sp and L.t > 1
    ph = Phases(L.math, L.fp8, A)
    linear_rows: set[int] = set()   # forward rows of the weight matmuls (recompute=op re-runs its own choice of them)

    def block_linear(m: int, n_out: int, k: int, input_elements: int | None = None, bias: bool = False) -> None:
        start = len(ph.rows["fwd"])
        ph.block_linear(m, n_out, k, input_elements=input_elements)
        linear_rows.update(range(start, len(ph.rows["fwd"])))
        if bias:   # the bias gradient: a column sum of the output gradient (its forward add rides the GEMM or the next kernel)
            ph.add("bwd_weight", MEM, (m * n_out * A,), 0)
    Q = FP8_BYTES if L.fp8 else A        # bytes of a column-parallel layer's input element as it is all-gathered
    fwd_coll: list[tuple[str, str, int, int]] = []   # (op, group, forward bytes, backward bytes) in forward order
    drop = MASK_BYTES if spec.dropout else 0

    def tp_in() -> None:   # entering a tensor-parallel region (f / all-gather; FP8 under the recipe)
        if sp:
            fwd_coll.append(("all_gather", "tp", T * h * Q, T * h * A))

    def tp_out() -> None:  # leaving it (g / reduce-scatter)
        if tp:
            fwd_coll.append(("reduce_scatter" if sp else "all_reduce", "tp", T * h * A, T * h * A))

    def coll(op: str, group: str, nbytes: int) -> None:
        fwd_coll.append((op, group, nbytes, nbytes))

    eager = spec.kernels == "eager"          # the block's norms, RoPE and activation as eager ATen kernels
    titan = spec.kernels != "fused"          # torchtitan's code, eager or compiled: GQA's repeat_kv copy

    def norm() -> None:
        if eager and spec.norm == "rmsnorm":
            ph.eager(ek.rmsnorm(A, h), n * h)
        else:
            ph.mem(3 * n * h * A, 4 * n * h * A)

    def residual() -> None:
        ph.mem(3 * n * h * A + drop * n * h, (2 * n * h * A + n * h) if drop else 0)
        ph.mem(0, 3 * n * h * A)   # the stream's gradient summed: through the skip and through the branch's norm

    def shared_input(users: int) -> None:  # eager: separate projections of one input, their input gradients summed
        for _ in range(users - 1 if eager else 0):
            ph.mem(0, 3 * T * h * A)

    # --- attention
    norm()
    tp_in()
    block_linear(T, L.ql + 2 * L.kvdl, h, input_elements=n * h, bias=spec.linear_bias or spec.qkv_bias)
    shared_input(3)
    if spec.position == "rope" and eager:
        ph.eager(ek.rope(A), T * L.ql)
        ph.eager(ek.rope(A), T * L.kvdl)
    elif spec.position == "rope":
        ph.mem(2 * T * (L.ql + L.kvdl) * A, 2 * T * (L.ql + L.kvdl) * A)
    if titan and L.kvl < L.hl:
        for _ in "kv":
            ph.eager(ek.repeat_kv(A, L.hl // L.kvl), T * L.ql)
    core_start = {p: len(r) for p, r in ph.rows.items()}
    S = L.b * L.hl * L.sq * L.s  # attention scores on this GPU
    if spec.fused_attention:
        group, impl = max(L.hl // L.kvl, 1), ATTN_IMPLS.index(spec.attention)
        ph.add("fwd", ATTN, (L.b * L.hl, L.sq, L.s, L.d, 1, 0, group, impl), 0)
        ph.add("bwd_input", ATTN, (L.b * L.hl, L.sq, L.s, L.d, 1, 1, group, impl), 0)
    else:
        if spec.position == "alibi":
            # the bias broadcast over the queries is copied into the score buffer and read back by
            # the GEMM (Megatron-DeepSpeed: torch.baddbmm(alibi, q, k^T, beta=1) expands its input
            # into the output before cuBLAS accumulates onto it)
            ph.mem(2 * S * A, 0)
        ph.matmul(L.b * L.hl, L.sq, L.s, L.d)
        ph.mem(3 * S * A, 3 * S * A)
        if drop:
            ph.mem(2 * S * A + S, 2 * S * A + S)
        ph.matmul(L.b * L.hl, L.sq, L.d, L.s)
    core_fwd = ph.rows["fwd"][core_start["fwd"]:]
    core_rows = set(range(core_start["fwd"], len(ph.rows["fwd"])))
    block_linear(T, h, L.ql, bias=spec.linear_bias)
    tp_out()
    residual()
    # --- MLP or experts
    norm()
    mats = spec.mlp_matrices
    act_fwd, act_bwd = (3, 5) if spec.gated_mlp else (2, 3)
    if not moe:
        tp_in()
        block_linear(T, L.fl * (mats - 1), h, input_elements=n * h, bias=spec.linear_bias)
        shared_input(mats - 1)
        if eager and spec.gated_mlp:
            ph.eager(ek.swiglu(A), T * L.fl)
        else:
            ph.mem(act_fwd * T * L.fl * A, act_bwd * T * L.fl * A)
        block_linear(T, h, L.fl, bias=spec.linear_bias)
        tp_out()
        Te = 0
    else:
        k, E = spec.top_k, spec.experts
        ph.linear(n, E, h)                                   # router (replicated over TP)
        ph.mem(3 * n * E * 4, 3 * n * E * 4)                 # softmax and top-k in FP32
        ph.mem(2 * n * k * h * A, 2 * n * k * h * A)         # permute
        if shard.ep > 1:
            coll("all_to_all", "ep", n * k * h * A)
        Te = T * k                                           # routed tokens this GPU's experts take
        if sp:
            coll("all_gather", "tp", Te * h * A)
        me = ceil(Te / L.le)
        ph.block_linear(me, L.fel * (mats - 1), h, batch=L.le)
        ph.mem(act_fwd * Te * L.fel * A, act_bwd * Te * L.fel * A)
        ph.block_linear(me, h, L.fel, batch=L.le)
        if sp:
            coll("reduce_scatter", "tp", Te * h * A)
        if shard.ep > 1:
            coll("all_to_all", "ep", n * k * h * A)
        if spec.shared_experts:
            tp_in()
            fs = L.fsl * spec.shared_experts
            ph.block_linear(T, fs * (mats - 1), h, input_elements=n * h)
            ph.mem(act_fwd * T * fs * A, act_bwd * T * fs * A)
            ph.block_linear(T, h, fs)
            if sp:
                coll("reduce_scatter", "tp", T * h * A)
        ph.mem(n * k * h * A + n * h * A, 2 * n * k * h * A + n * h * A)   # un-permute: the weighted sum
        if tp and not sp:
            coll("all_reduce", "tp", T * h * A)
    residual()

    # --- recompute (op: torchtitan's policy re-runs the matmuls of ``redo``, keeps the others' outputs)
    redo = op_recomputed(spec) if shard.recompute == "op" else set()
    matmuls = _local_matmuls(spec, L) if shard.recompute == "op" else {}
    if shard.recompute == "selective":
        for kind, dims, bdim, math in core_fwd:
            ph.add("recompute", kind, dims, bdim, math)
    elif shard.recompute == "full":
        for kind, dims, bdim, math in ph.rows["fwd"]:
            ph.add("recompute", kind, dims, bdim, math)
    elif shard.recompute == "op":
        kept_core = core_rows if spec.fused_attention else set()
        for i, (kind, dims, bdim, math) in enumerate(ph.rows["fwd"]):
            if i not in linear_rows and i not in kept_core:
                ph.add("recompute", kind, dims, bdim, math)
        for name, (n_out, k) in matmuls.items():
            if name in redo:
                scratch = Phases(L.math, L.fp8, A)
                scratch.block_linear(T, n_out, k, input_elements=n * h if k == h else None)
                for kind, dims, bdim, math in scratch.rows["fwd"]:
                    ph.add("recompute", kind, dims, bdim, math)

    # --- collectives
    calls = [CollectiveCall(op, g, nb, "forward") for op, g, nb, _ in fwd_coll]
    calls += [CollectiveCall(op, g, nb, "backward") for op, g, nb in mirrored(fwd_coll)]
    if shard.recompute == "full":
        calls += [CollectiveCall(op, g, nb, "recompute") for op, g, nb, _ in fwd_coll]
    elif shard.recompute == "op":  # the reduce-scatters' outputs are kept (torchtitan's save list), the rest re-run
        calls += [CollectiveCall(op, g, nb, "recompute") for op, g, nb, _ in fwd_coll if op != "reduce_scatter"]
    core_again = shard.recompute in ("selective", "full") or (shard.recompute == "op" and spec.attention == "eager")
    if shard.cp > 1:
        kv = 2 * L.b * L.sq * L.kvdl * A
        calls.append(CollectiveCall("send_recv", "cp", kv, "forward", overlapped=True, count=shard.cp - 1))
        calls.append(CollectiveCall("send_recv", "cp", kv, "backward", overlapped=True, count=2 * (shard.cp - 1)))
        if core_again:
            calls.append(CollectiveCall("send_recv", "cp", kv, "recompute", overlapped=True, count=shard.cp - 1))

    # --- memory (the FP8 recipe keeps the BF16 inputs: harness.core.llm.fp8)
    unsplit = n * h * (4 * A + 2 * drop)                              # 2 norm inputs, QKV and MLP inputs, 2 dropout masks
    qkvo = T * A * (2 * L.ql + 2 * L.kvdl)                            # Q, K, V and the attention output
    core = S * (A + (MASK_BYTES + A if drop else 0)) if spec.attention == "eager" else 4 * L.b * L.hl * L.sq
    act_mult = 3 if spec.gated_mlp else 2                             # (gate and up,) activation output
    if not moe:
        mlp = T * L.fl * A * act_mult
        grad = A * max(T * (L.ql + 2 * L.kvdl), T * L.fl * (mats - 1))
    else:
        fs = L.fsl * spec.shared_experts
        mlp = 4 * n * spec.experts + A * Te * h + A * Te * L.fel * act_mult + A * T * fs * act_mult
        grad = A * max(T * (L.ql + 2 * L.kvdl), Te * L.fel * (mats - 1), T * fs * (mats - 1))
    kept_fp32 = 0   # eager: the FP32 copies its RMSNorms and RoPE keep (recomputed under full and op)
    if eager:
        kept_fp32 = (2 * n * h * int(ek.rmsnorm(A, h).saved_extra) if spec.norm == "rmsnorm" else 0) + \
            (T * (L.ql + L.kvdl) * int(ek.rope(A).saved_extra) if spec.position == "rope" else 0)
    full = unsplit + qkvo + core + mlp + kept_fp32
    stored = {"none": full, "selective": full - core, "full": n * h * A}.get(shard.recompute, 0)
    if shard.recompute == "op":   # the block's input, the kept matmuls' outputs, the fused attention's, the reduce-scatters'
        stored = n * h * A + sum(T * n_out * A for name, (n_out, _) in matmuls.items() if name not in redo)
        stored += (T * L.ql * A + core) if spec.fused_attention else 0
        stored += 2 * n * h * A if sp else 0
    transient = (full - stored) + grad + (S * A if spec.attention == "eager" else 0)
    params = block_params_local(spec, L, moe)
    return UnitWork(ph.table("fwd"), ph.table("bwd_input"), ph.table("bwd_weight"), ph.table("recompute"), calls,
                    int(stored), int(transient), int(n * h * A), params,
                    notes={"unsplit": unsplit, "qkvo": qkvo, "core": core, "mlp": mlp, "tokens": T, "tokens_unsplit": n})


def _local_matmuls(spec: TransformerSpec, L: Local) -> dict[str, tuple[int, int]]:
    """A dense block's weight matmuls on one GPU (:func:`harness.core.llm.flops.block_matmuls`'
    names): (output width, reduction width) of each, its rows being the ``T`` tokens."""
    h = spec.hidden
    mlp = {"w1": (L.fl, h), "w3": (L.fl, h), "w2": (h, L.fl)} if spec.gated_mlp else {"fc1": (L.fl, h), "fc2": (h, L.fl)}
    return {"q": (L.ql, h), "k": (L.kvdl, h), "v": (L.kvdl, h), "o": (h, L.ql), **mlp}


def block_params_local(spec: TransformerSpec, L: Local, moe: bool) -> int:
    """A block's parameter elements on one GPU: the column- and row-parallel weights (and the
    column-parallel biases) split, norms, row-parallel biases and the router replicated, the
    experts split by EP and (their channels) by TP."""
    h, mats = spec.hidden, spec.mlp_matrices
    qkv_b = (L.ql + 2 * L.kvdl) if spec.linear_bias or spec.qkv_bias else 0
    attention = h * (L.ql + 2 * L.kvdl) + L.ql * h + qkv_b + (h if spec.linear_bias else 0)

    def mlp(f: int) -> int:
        return mats * h * f + ((f * (mats - 1) + h) if spec.linear_bias else 0)

    base = attention + 2 * spec.norm_params()
    if not moe:
        return base + mlp(L.fl)
    return base + h * spec.experts + spec.shared_experts * mlp(L.fsl) + L.le * mlp(L.fel)


def embedding_work(spec: TransformerSpec, seq_len: int, precision: str, shard: Shard) -> UnitWork:
    """The embedding: the vocabulary-parallel lookup (an all-reduce of its output over TP, a
    reduce-scatter with SP), learned positions, the embedding norm, dropout."""
    L = local_sizes(spec, seq_len, precision, shard)
    h, A, T, n = spec.hidden, L.A, L.T, L.n
    ph = Phases(L.math)
    ph.add("fwd", MEM, (T * h * A + T * ID_BYTES,), 0)                 # gather the rows of the local vocabulary shard
    ph.add("bwd_weight", MEM, (3 * T * h * A + T * ID_BYTES,), 0)      # scatter-add the gradient into the table
    calls = []
    if L.t > 1:
        op = "reduce_scatter" if shard.sp else "all_reduce"
        calls.append(CollectiveCall(op, "tp", T * h * A, "forward"))
        if shard.sp:
            calls.append(CollectiveCall("all_gather", "tp", T * h * A, "backward"))
    if spec.position == "learned":
        ph.mem(3 * n * h * A, 2 * n * h * A)
    stored = T * ID_BYTES
    if spec.embedding_norm:
        ph.mem(3 * n * h * A, 4 * n * h * A)
        stored += n * h * A
    if spec.dropout:
        ph.mem(2 * n * h * A + n * h, 2 * n * h * A + n * h)
        stored += n * h * MASK_BYTES
    pos = spec.seq_len * h if spec.position == "learned" else 0
    params = L.vl * h + pos + (spec.norm_params() if spec.embedding_norm else 0)
    return UnitWork(ph.table("fwd"), ph.table("bwd_input"), ph.table("bwd_weight"), ph.table("recompute"), calls,
                    int(stored), int(T * h * A), int(n * h * A), int(params))


def head_work(spec: TransformerSpec, seq_len: int, precision: str, shard: Shard) -> UnitWork:
    """The head: final norm, the logits GEMM over the local vocabulary (column parallel: an
    all-gather of its input with SP, an all-reduce of its input gradient without), the
    vocabulary-parallel cross-entropy (three all-reduces of one FP32 value per token: max, sum,
    target logit) in FP32; it keeps the FP32 softmax for its backward.  torchtitan's code
    (``kernels`` other than fused) runs its final norm as eager ATen kernels, and its loss too
    unless the loss is compiled (``eager``, ``compiled_blocks``: :mod:`harness.core.llm.eager`)."""
    L = local_sizes(spec, seq_len, precision, shard)
    h, A, T, n = spec.hidden, L.A, L.T, L.n
    ph = Phases(L.math)
    titan = spec.kernels != "fused"    # torchtitan compiles its blocks (and its loss): the final norm runs eager
    eager_loss = spec.kernels in ("eager", "compiled_blocks")
    if titan and spec.norm == "rmsnorm":
        ph.eager(ek.rmsnorm(A, h), n * h)
    else:
        ph.mem(3 * n * h * A, 4 * n * h * A)
    ph.linear(T, L.vl, h)
    if eager_loss:
        ph.eager(ek.cross_entropy(A), T * L.vl)
    else:
        ph.mem(T * L.vl * (A + 3 * 4), T * L.vl * (4 + A))
    calls = []
    if L.t > 1:
        if shard.sp:
            calls += [CollectiveCall("all_gather", "tp", T * h * A, "forward"), CollectiveCall("reduce_scatter", "tp", T * h * A, "backward")]
        else:
            calls.append(CollectiveCall("all_reduce", "tp", T * h * A, "backward"))
        calls.append(CollectiveCall("all_reduce", "tp", T * 4, "forward", count=3))
    stored = 2 * n * h * A + 4 * T * L.vl
    params = spec.norm_params() + (0 if spec.tied_embeddings else L.vl * h)
    return UnitWork(ph.table("fwd"), ph.table("bwd_input"), ph.table("bwd_weight"), ph.table("recompute"), calls,
                    int(stored), int(T * L.vl * ek.loss_transient(A, eager_loss)), 0, int(params), tied_params_local=L.vl * h if spec.tied_embeddings else 0)
