"""FLOPs of a transformer's training step: model FLOPs, hardware FLOPs, MFU and HFU.

Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", MLSys'23,
Sec. 6 and Appendix) define, for a GPT of ``l`` layers, hidden ``h``, sequence ``s``, vocabulary
``V`` and a batch of ``B`` sequences:

* model FLOPs (no recomputation): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``;
* hardware FLOPs with full recomputation: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (Narayanan
  et al., SC'21, Eq. 3: the layers' forward runs twice, the logits once);
* hardware FLOPs with selective recomputation: ``72 B s l h^2 (1 + s/(3h) + V/(12 l h))``: their
  count doubles the attention-core term (``s/(6h)`` becomes ``s/(3h)``), i.e. adds the core's
  three-pass training FLOPs once more, not one forward of it.  We keep their definition, so that
  an HFU here is theirs (their published HFU needs it: one forward more would give 42.4 % for
  the 22B row, not the published 43.7 %);
* MFU = model FLOPs / (iteration time x GPUs x peak), HFU the same with hardware FLOPs.

Generalised as Megatron-LM's ``num_floating_point_operations`` (``megatron/training/training.py``)
does, per token and layer of the forward: the Q, K, V and output projections ``2 h (2 q + 2 kv)``
(``q``, ``kv``: the query and key/value widths, so grouped-query attention counts its smaller K
and V), the attention core ``4 s q`` (``QK^T`` and ``PV``), the MLP ``2 h f x (3 gated, else 2)``
(a MoE layer: ``top_k`` routed plus the shared experts of ``expert_ffn_hidden`` each; the router
is left out, as Megatron leaves it), and once per token the logits ``2 h V``; a training step is
three forward passes' worth (forward, input gradient, weight gradient).  The attention core is
counted whole (``s x s``) by default, as Korthikanti does; newer Megatron-LM halves it for
causal masks (``causal=True`` here).  Biases, norms, softmax and the embedding lookup are not
counted (they are not matmuls).

:func:`unit_forward_flops` is a different figure: the FLOPs the kernels of one stack unit really
execute for one sequence (:mod:`harness.core.llm.work`: a causal attention kernel skips the masked
half, the router is a GEMM), the stack graph's ``flops_fwd``.
"""

from __future__ import annotations

from harness.core.llm.spec import TransformerSpec

RECOMPUTE_KINDS: tuple[str, ...] = ("none", "selective", "full", "op")


def _check(recompute: str) -> str:
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_KINDS)}, got {recompute!r}")
    return recompute


def projection_flops(spec: TransformerSpec) -> float:
    """Forward FLOPs per token of one block's Q, K, V and output projections."""
    return 2.0 * spec.hidden * (2 * spec.q_dim + 2 * spec.kv_dim)


def core_flops(spec: TransformerSpec, seq_len: int, causal: bool = False) -> float:
    """Forward FLOPs per token of one block's attention core (``QK^T`` and ``PV`` over ``seq_len`` keys)."""
    return 4.0 * seq_len * spec.q_dim * (0.5 if causal else 1.0)


def mlp_flops(spec: TransformerSpec, moe: bool) -> float:
    """Forward FLOPs per token of one block's MLP: the dense one, or a MoE layer's ``top_k``
    routed and its shared experts (router left out)."""
    per = 2.0 * spec.hidden * spec.mlp_matrices
    if not moe:
        return per * spec.ffn_hidden
    return per * spec.expert_ffn_hidden * (spec.top_k + spec.shared_experts)


def logit_flops(spec: TransformerSpec) -> float:
    """Forward FLOPs per token of the output projection (the logits)."""
    return 2.0 * spec.hidden * spec.vocab


def layers_forward_flops(spec: TransformerSpec, seq_len: int, causal: bool = False) -> float:
    """Forward FLOPs per token of all blocks."""
    per_block = projection_flops(spec) + core_flops(spec, seq_len, causal)
    dense = spec.dense_layers * (per_block + mlp_flops(spec, False))
    return dense + spec.moe_layers * (per_block + mlp_flops(spec, True))


def model_flops(spec: TransformerSpec, batch_seqs: int, seq_len: int | None = None, causal: bool = False) -> float:
    """Model FLOPs of one iteration on ``batch_seqs`` sequences, no recomputation (Korthikanti's
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` for a GPT; see the module docstring)."""
    s = spec.seq_len if seq_len is None else int(seq_len)
    return 3.0 * batch_seqs * s * (layers_forward_flops(spec, s, causal) + logit_flops(spec))


def block_matmuls(spec: TransformerSpec) -> list[tuple[str, bool]]:
    """A dense block's weight matmuls in the order its forward runs them (torchtitan's Llama:
    ``wq, wk, wv, wo``, then ``w1, w3, w2`` gated or ``fc1, fc2``), each with whether it is an
    ``aten.mm`` (no bias; a biased linear is an ``addmm``)."""
    qkv_mm = not (spec.linear_bias or spec.qkv_bias)
    mm = not spec.linear_bias
    mlp = [("w1", mm), ("w3", mm), ("w2", mm)] if spec.gated_mlp else [("fc1", mm), ("fc2", mm)]
    return [("q", qkv_mm), ("k", qkv_mm), ("v", qkv_mm), ("o", mm), *mlp]


def op_recomputed(spec: TransformerSpec) -> set[str]:
    """The matmuls of :func:`block_matmuls` that torchtitan's per-op selective checkpointing
    (``recompute=op``; torchtitan ``apply_ac``, ``selective_ac_option = "op"``) re-runs in the
    backward: it keeps the outputs of the ``aten.mm`` calls but every second one (counted in
    forward order), so every second ``mm`` and every ``addmm`` are recomputed (Llama: k, o, w3)."""
    out, count = set(), 0
    for name, is_mm in block_matmuls(spec):
        count += is_mm
        if not is_mm or count % 2 == 0:
            out.add(name)
    return out


def _matmul_flops(spec: TransformerSpec, name: str) -> float:
    """Forward FLOPs per token of one matmul of :func:`block_matmuls`."""
    h = spec.hidden
    width = {"q": spec.q_dim, "k": spec.kv_dim, "v": spec.kv_dim, "o": spec.q_dim}.get(name, spec.ffn_hidden)
    return 2.0 * h * width


def op_recompute_flops(spec: TransformerSpec, seq_len: int, causal: bool = False) -> float:
    """Forward FLOPs per token of one dense block that ``recompute=op`` re-runs: the matmuls of
    :func:`op_recomputed`, and the attention core when it is eager (its matmuls are ``bmm``s,
    not kept; a fused attention kernel's output is)."""
    core = core_flops(spec, seq_len, causal) if spec.attention == "eager" else 0.0
    return sum(_matmul_flops(spec, m) for m in op_recomputed(spec)) + core


def hardware_flops(spec: TransformerSpec, batch_seqs: int, recompute: str, seq_len: int | None = None,
                   causal: bool = False) -> float:
    """Hardware FLOPs of one iteration: model FLOPs plus the recomputation's (full:
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, the blocks' forward once more; selective:
    ``72 B s l h^2 (1 + s/(3h) + V/(12 l h))``, Korthikanti's count of the attention core; op:
    the matmuls :func:`op_recompute_flops` counts, once more per block)."""
    s = spec.seq_len if seq_len is None else int(seq_len)
    base = model_flops(spec, batch_seqs, s, causal)
    if _check(recompute) == "full":
        return base + batch_seqs * s * layers_forward_flops(spec, s, causal)
    if recompute == "selective":
        return base + 3.0 * batch_seqs * s * spec.layers * core_flops(spec, s, causal)
    if recompute == "op":
        if spec.moe_layers:
            raise ValueError("recompute=op (torchtitan's per-op policy) is modelled for dense blocks only")
        return base + batch_seqs * s * spec.layers * op_recompute_flops(spec, s, causal)
    return base


def mfu(spec: TransformerSpec, batch_seqs: int, iter_s: float, gpus: int, peak_flops: float,
        seq_len: int | None = None, causal: bool = False) -> float:
    """Model FLOPs utilisation: :func:`model_flops` / (``iter_s`` x ``gpus`` x ``peak_flops``)."""
    return model_flops(spec, batch_seqs, seq_len, causal) / _capacity(iter_s, gpus, peak_flops)


def hfu(spec: TransformerSpec, batch_seqs: int, recompute: str, iter_s: float, gpus: int, peak_flops: float,
        seq_len: int | None = None, causal: bool = False) -> float:
    """Hardware FLOPs utilisation: :func:`hardware_flops` / (``iter_s`` x ``gpus`` x ``peak_flops``)."""
    return hardware_flops(spec, batch_seqs, recompute, seq_len, causal) / _capacity(iter_s, gpus, peak_flops)


def _capacity(iter_s: float, gpus: int, peak_flops: float) -> float:
    """FLOPs the GPUs could do in an iteration at their peak (each factor > 0)."""
    if not (iter_s > 0 and gpus > 0 and peak_flops > 0):
        raise ValueError(f"iteration time, GPUs and peak must be > 0, got {iter_s!r}, {gpus!r}, {peak_flops!r}")
    return float(iter_s) * float(gpus) * float(peak_flops)


def unit_forward_flops(spec: TransformerSpec, kind: str, moe: bool, seq_len: int | None = None) -> float:
    """FLOPs the kernels of one unit run in the forward of one sequence (the stack graph's
    ``flops_fwd``): the embedding none, a block its projections, its attention core (the
    causal half for a fused kernel, which skips the masked blocks; all of it for eager attention,
    whose matmuls compute the whole score matrix), its MLP or experts and the router GEMM, the
    head its logits."""
    s = spec.seq_len if seq_len is None else int(seq_len)
    if kind == "embedding":
        return 0.0
    if kind == "head":
        return s * logit_flops(spec)
    router = 2.0 * spec.hidden * spec.experts if moe else 0.0
    return s * (projection_flops(spec) + core_flops(spec, s, causal=spec.fused_attention) + mlp_flops(spec, moe) + router)
