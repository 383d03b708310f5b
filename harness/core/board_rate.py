"""Measured rates against a family's fits: a board's own tensor-core rate (GEMMs timed on one board of
a family), and another attention kernel's rate against FlashAttention-2's fit.

A family's kernel fits (:mod:`harness.app.kernel_fit`) rest on the boards its measurements
came from; another board of the family with a lower power limit runs the same kernels at lower
sustained clocks, which its datasheet peak does not say.  Where such a board has GEMMs of its
own (``harness/data/gpu/a100_h100/board_gemm.csv``: Meta's 500 W H100s, FBGEMM's benchmark of
them), its *rate* is the median over those GEMMs of the fit's time on the board (its configured
peaks and bandwidth, as every other kernel is costed) over the measured time: below 1 where the
board is slower than the fit makes it.  :class:`harness.core.calibrated.CalibratedCostModel`
divides every tensor-core kernel the board runs in that precision by it (GEMMs and attention:
the power limit lowers the clock every tensor-core kernel runs at; memory-bound kernels keep
the measured bandwidth).  A precision the board has no GEMMs of takes its BF16 rate.

Attention kernels other than FlashAttention-2 (``model.attention=flash_triton``: llm-foundry's
Triton FlashAttention, timed beside FlashAttention-2 in FlashAttention's own benchmark) take, per
row, the median rate of that kernel's rows of the same causality nearest in head size: the
FlashAttention-2 fit's time of the measured row (its forward, and its backward where the row times
both) over the measured time (:func:`attention_rates`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.kernel_model import KernelModel, attention_features, attention_flops
from harness.core.kernels import ATTN_BWD_FACTOR

#: the precision whose rate a board's other precisions take where it has no GEMMs of theirs
TRANSFER_PRECISION = "bf16"


def rows_for(rows: Sequence[Mapping[str, Any]], precision: str) -> tuple[list[Mapping[str, Any]], str]:
    """The board GEMMs that set the rate of fit precision ``precision``: its own, else the
    :data:`TRANSFER_PRECISION` ones; and the precision they are of ("" where neither exists)."""
    for p in (precision, TRANSFER_PRECISION):
        own = [r for r in rows if r["precision"] == p]
        if own:
            return own, p
    return [], ""


def board_rate(rows: Sequence[Mapping[str, Any]], model: KernelModel, peak: float, kappa: float) -> float:
    """The median over ``rows`` (each ``m``, ``n``, ``k``, ``seconds``) of ``model``'s time at
    ``peak`` with dims scaled by ``kappa`` (as :class:`~harness.core.calibrated.CalibratedCostModel`
    costs a GEMM) over the measured ``seconds``: the board's rate relative to the fit (1 for no
    rows)."""
    if not rows:
        return 1.0
    dims = np.array([[r["m"], r["n"], r["k"]] for r in rows], dtype=np.float64)
    flops = 2.0 * dims.prod(axis=1)
    modelled = model.time(dims / kappa, flops, peak)
    return float(np.median(modelled / np.array([r["seconds"] for r in rows], dtype=np.float64)))


def attention_rates(rows: Sequence[Mapping[str, Any]], model: KernelModel, peak: float) -> list[float]:
    """Per measured row of another attention kernel (``pass``, ``causal``, ``head_dim``, ``seqlen``,
    ``bh``, ``seconds``), the FlashAttention-2 fit ``model``'s time at ``peak`` over the measured
    time: the forward's, plus the backward's where the row times ``fwd+bwd``."""
    s = np.array([r["seqlen"] for r in rows], dtype=np.float64)
    d = np.array([r["head_dim"] for r in rows], dtype=np.float64)
    c = np.array([r["causal"] for r in rows], dtype=np.float64)
    both = np.array([r["pass"] == "fwd+bwd" for r in rows])
    flops = attention_flops([r["bh"] for r in rows], s, d, c > 0)
    dims, flags = attention_features(s, s, d, c, np.zeros(len(rows)))
    t = model.time(dims, flops, peak, flags)
    bdims, bflags = attention_features(s, s, d, c, np.ones(len(rows)))
    t = t + np.where(both, model.time(bdims, ATTN_BWD_FACTOR * flops, peak, bflags), 0.0)
    return (t / np.array([r["seconds"] for r in rows], dtype=np.float64)).tolist()


def impl_rate(rows: Sequence[Mapping[str, Any]], rates: Sequence[float], causal: bool, head_dim: int) -> float:
    """The rate of a kernel run causal or not at ``head_dim``: the median of :func:`attention_rates`
    over the measured rows of the same causality whose head size is nearest ``head_dim``."""
    same = [(abs(r["head_dim"] - head_dim), x) for r, x in zip(rows, rates) if bool(r["causal"]) == bool(causal)]
    if not same:
        same = [(abs(r["head_dim"] - head_dim), x) for r, x in zip(rows, rates)]
    near = min(g for g, _ in same)
    return float(np.median([x for g, x in same if g == near]))
