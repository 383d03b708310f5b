"""A board's own tensor-core rate: GEMMs timed on one board of a family set against the family's fit.

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
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.kernel_model import KernelModel

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
