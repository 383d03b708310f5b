"""The FP8 recipe of a transformer's linear layers (``precision=amp_fp8``), for
:mod:`harness.core.llm.block_work`.

FP8 training as torchtitan runs it (torchao's ``Float8Linear``, its default ``tensorwise``
recipe: every FP8 row of the published LLM runs), which computes the GEMMs of Transformer
Engine's recipe (Megatron-LM, NeMo) with Transformer Engine's per-tensor *current* scaling: every
GEMM of a linear layer inside a transformer block (QKV, the attention's output projection, the
MLP's or each expert's two projections) takes FP8 operands - E4M3 activations and weights
forward, E5M2 output gradients backward: the ``HYBRID`` format - and writes BF16; the router,
the attention core, the norms, the embedding and the output head stay BF16 (torchtitan's float8
converter skips ``output``; Megatron-LM's output layer is not a Transformer Engine module).

Each operand is quantized by memory-bound kernels: an amax reduction that reads the BF16
tensor, then a cast that reads it again and writes FP8 (:func:`quantize_bytes`).  For
``Y = X W^T``, per micro-batch:

* forward: quantize ``X`` and ``W``; the FP8 GEMM;
* backward, input gradient: quantize ``dY`` - one cast that writes it row-wise for ``dX = dY W``
  and transposed for the weight gradient (Hopper's FP8 GEMMs take only the "TN" layout) - and
  quantize ``W`` again (torchao keeps the BF16 weight, ``save_for_backward(input_hp,
  weight_hp_t)``, and casts it anew); the FP8 GEMM;
* backward, weight gradient: quantize ``X`` again (from its saved BF16 copy); ``dW = dY^T X``.

Stored activations are the BF16 step's: the layer keeps its BF16 input, not an FP8 copy.  With
sequence parallelism a column-parallel layer's input is quantized on its shard and all-gathered
in FP8 (torchao's ``Float8ColwiseParallel``, Transformer Engine's FP8 all-gather); the other
tensor-parallel collectives carry BF16.

Not modelled: the casts ``torch.compile`` (every torchtitan FP8 run) fuses into the kernel that
produced the tensor, which save a read each - the casts here are an upper bound; Transformer
Engine's differences: it keeps its inputs' FP8 copies for the weight gradient instead of the
BF16 inputs (less activation memory) and the weight's transposed FP8 copy from the forward (no
re-quantization backward), and its default *delayed* scaling takes the scale from an amax
history, fusing the amax into the cast; torchao's ``rowwise`` recipe (a scale per row, slower
GEMMs).
"""

from __future__ import annotations

from harness.core.kernels import GEMM, MEM
from harness.core.precision import FP8

#: bytes per element of an FP8 tensor (E4M3 or E5M2)
FP8_BYTES = 1
#: the GEMMs of a linear layer by phase: (phase, dims order from (m, n, k), batch column)
GEMM_PHASES: tuple[tuple[str, tuple[int, int, int], int], ...] = (("fwd", (0, 1, 2), 1), ("bwd_input", (0, 2, 1), 1),
                                                                   ("bwd_weight", (2, 1, 0), 3))

#: a kernel row (phase, kind, dims, batch column, math)
Row = tuple[str, int, tuple[int, ...], int, int]


def quantize_bytes(elements: int, src_bytes: int, transposed: bool) -> tuple[int, int]:
    """(bytes of the amax pass, bytes of the cast) that quantize a tensor of ``elements``
    ``src_bytes``-byte elements to FP8 under current scaling: the amax reads it; the cast reads
    it again and writes one FP8 copy, two with the transposed one."""
    e = int(elements)
    return e * src_bytes, e * src_bytes + e * FP8_BYTES * (2 if transposed else 1)


def quantize_rows(phase: str, elements: int, src_bytes: int, transposed: bool, batched: bool) -> list[Row]:
    """The two memory-bound kernels of :func:`quantize_bytes` (an activation's bytes grow with
    the batch, a weight's do not)."""
    bdim = 0 if batched else -1
    return [(phase, MEM, (nb,), bdim, FP8) for nb in quantize_bytes(elements, src_bytes, transposed) if nb > 0]


def fp8_linear_rows(m: int, n: int, k: int, batch: int, act_bytes: int, input_elements: int | None = None) -> list[Row]:
    """Every kernel of one linear layer ``(m x k)(k x n)`` (``batch`` of them: a MoE layer's local
    experts) under the recipe (see the module docstring): the quantization of its input
    (``input_elements`` of it forward: all ``batch * m * k`` by default, the sequence-parallel
    shard when the input is quantized before an FP8 all-gather), of its weight, of its output
    gradient (with its transposed copy), the input and the weight again backward, and its three
    FP8 GEMMs."""
    x, w, dy = batch * m * k, batch * n * k, batch * m * n
    rows = quantize_rows("fwd", x if input_elements is None else input_elements, act_bytes, False, True)
    rows += quantize_rows("fwd", w, act_bytes, False, False)
    rows += quantize_rows("bwd_input", dy, act_bytes, True, True)
    rows += quantize_rows("bwd_input", w, act_bytes, False, False)
    rows += quantize_rows("bwd_weight", x, act_bytes, False, True)
    mnk = (m, n, k)
    by_phase: dict[str, list[Row]] = {}
    for phase, order, bdim in GEMM_PHASES:
        by_phase[phase] = [(phase, GEMM, (batch, *(mnk[i] for i in order)), bdim, FP8)]
    # each phase's quantize kernels run before its GEMM
    return [r for phase in ("fwd", "bwd_input", "bwd_weight") for r in [*(q for q in rows if q[0] == phase), *by_phase[phase]]]
