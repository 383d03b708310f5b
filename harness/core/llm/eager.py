"""The memory-bound steps of a transformer block as PyTorch eager runs them (``model.kernels``).

:func:`harness.core.llm.block_work.block_work` costs a norm, RoPE, an activation and the loss
as one kernel each at its fewest bytes by default (``kernels=fused``: Megatron-LM's fused
kernels, or :mod:`torch.compile`'s fusion of a block).  Eager PyTorch runs the code as written,
one ATen kernel per operator, each reading and writing its whole tensor, several in FP32.  This
module gives those kernels for torchtitan's Llama (``torchtitan/models/llama/model.py`` and
``models/norms.py`` of December 2024, the code of its published H100 runs) and its loss
(``F.cross_entropy(pred.flatten(0, 1).float(), labels)``), which its ``train.py`` of 2024 left
out of ``torch.compile`` ("compiling loss function causes CUDA errors") and which it compiles with
the model by 2025 (``build_cross_entropy_loss``: ``kernels=compiled`` against ``compiled_blocks``):

* RMSNorm ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``: a cast
  to FP32, ``pow``, ``mean``, ``+ eps`` and ``rsqrt`` on one value per row, the product, the cast
  back, the weight; its autograd backward mirrors each operator (the weight's gradient a product
  and a row sum, the two paths into ``x`` added); it keeps the FP32 copy of its input;
* RoPE in complex FP32 (``view_as_complex(x.float())`` times the frequencies, ``type_as`` back),
  for Q and for K: three kernels each way; it keeps the FP32 complex input;
* ``repeat_kv`` (grouped-query attention): K and V copied to every query head before SDPA,
  their gradients summed back - in the eager and the compiled code alike (Inductor cannot fold
  the copy into the attention kernel);
* SwiGLU ``silu(w1 x) * (w3 x)``: two kernels forward, three backward;
* the loss over an FP32 copy of the logits: the cast, ``log_softmax`` (three reading passes and
  a write: :data:`LOG_SOFTMAX_READS`), ``nll_loss``; backward ``nll_loss``'s dense gradient,
  ``log_softmax``'s, the cast back.
  Its FP32 log-probabilities are kept (as the fused loss keeps its FP32 softmax); at the peak of
  its backward two more FP32 copies of the logits are live (the fused loss: the 16-bit logits).

A LayerNorm (``nn.LayerNorm``) and a GeLU are one ATen kernel each way, eager or not: only RMSNorm,
RoPE, the gated activation, GQA's copy, the loss and the sums of the separate projections' input
gradients (:mod:`harness.core.llm.block_work`) differ.  Bytes are per element of the tensor
the step runs over (tokens x channels; a row-wise kernel's few bytes as its share of a row), ``A``
the activation's bytes, FP32 4 (a cast up to FP32 charged over :data:`UPCAST_RATE`, the rate
an H100 measured it at); a kernel's time is then the calibrated memory-bound model's
(:meth:`harness.core.costs.CostModel.kernel_times`), its launch included.
"""

from __future__ import annotations

from dataclasses import dataclass

#: bytes of an FP32 element
F32 = 4
#: the rate PyTorch's 16-bit-to-FP32 cast (``x.float()``) moves its bytes at, as a fraction of a
#: plain FP32 copy's: 1,978 against 3,007 GB/s on an H100 SXM5 (``cast_bf16_fp32`` and
#: ``copy_fp32`` of ``harness/data/gpu/a100_h100/h100_probe_kernels.csv``; the cast back runs at
#: the copy's rate).  An up-cast is charged its bytes over this fraction; read as the kernel's
#: own property on other GPUs (no other GPU measured it).
UPCAST_RATE = 0.658
#: reading passes ``log_softmax`` makes over an FP32 row of a vocabulary's width (the maximum, the
#: sum of exponentials, the output): 3 reads and a write moved the measured time at a copy's rate
#: (``log_softmax_fp32`` over 32,768-wide rows, 0.48 of its two passes' bytes at 3,350 GB/s, and
#: 128,256-wide logits in a Llama 3 step, ``h100_probe_ops.csv``)
LOG_SOFTMAX_READS = 3


def upcast(A: int) -> float:
    """Bytes charged per element to cast an ``A``-byte element to FP32 (:data:`UPCAST_RATE`)."""
    return (A + F32) / UPCAST_RATE if A < F32 else float(A + F32)


@dataclass(frozen=True)
class EagerStep:
    """A step's kernels: bytes per element of each forward and each backward kernel, and the
    bytes per element it keeps for the backward beyond what the fused step keeps."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    saved_extra: float = 0.0


def rmsnorm(A: int, hidden: int) -> EagerStep:
    """torchtitan's eager RMSNorm over ``hidden`` channels (module docstring)."""
    row = 2 * F32 / hidden  # a kernel over one value per row (mean's result, + eps, rsqrt)
    fwd = (upcast(A), 2 * F32, F32 + row, row, row, 2 * F32 + row, F32 + A, 2 * A)
    bwd = (2 * A, 3 * A, A, upcast(A), 2 * F32 + row, 3 * F32, F32, row, row, F32 + row, 3 * F32, 3 * F32, F32 + A)
    return EagerStep(fwd, bwd, saved_extra=F32)


def rope(A: int) -> EagerStep:
    """RoPE in complex FP32 over one of Q or K (module docstring)."""
    return EagerStep((upcast(A), 2 * F32, F32 + A), (upcast(A), 2 * F32, F32 + A), saved_extra=F32)


def swiglu(A: int) -> EagerStep:
    """``silu(gate) * up`` per MLP channel element (module docstring)."""
    return EagerStep((2 * A, 3 * A), (3 * A, 3 * A, 3 * A))


def repeat_kv(A: int, group: int) -> EagerStep:
    """K or V copied to the ``group`` query heads each key/value head serves, per element of the
    copy: it reads ``1 / group`` of an element and writes one; the backward sums them back."""
    b = A * (1 + 1 / group)
    return EagerStep((b,), (b,))


def cross_entropy(A: int) -> EagerStep:
    """The loss over an FP32 copy of the logits, per logit (module docstring)."""
    return EagerStep((upcast(A), (LOG_SOFTMAX_READS + 1) * F32), (F32, 3 * F32, F32 + A))


def loss_transient(A: int, eager: bool) -> int:
    """Bytes per logit live at the loss's peak beyond the FP32 tensor it keeps for the backward:
    the eager loss's two FP32 gradients in its backward (``log_softmax``'s incoming and outgoing),
    the fused loss's 16-bit logits beside the FP32 softmax it computes in place (Megatron-LM's
    vocabulary-parallel cross-entropy)."""
    return 2 * F32 if eager else A
