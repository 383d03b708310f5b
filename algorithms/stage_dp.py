"""Uneven pipeline stages: the contiguous partition of a chain of units into ``C`` stages whose
heaviest stage is as light as can be, under a per-stage memory limit (the inter-operator pass of
Alpa, Zheng et al. OSDI'22, Sec. 5.1, on a chain; Aceso, Liu et al. EuroSys'24, balances the
same stage times).

What it optimises, exactly: over every cut of the units ``0..n-1`` into ``C`` contiguous,
non-empty pieces (piece ``s`` runs on pipeline stage ``s``) for which ``fits(s, b, e)`` holds for
each piece ``[b, e)``, the largest piece weight ``max_s sum(w[b_s:e_s])``.  With ``w`` a unit's
seconds on its stage's GPU per micro-batch (forward, backward, recomputation and the
collectives that occupy the GPU), that is the pipeline's bottleneck: Alpa's latency of a
1F1B pipeline, ``sum_s t_s + (m - 1) max_s t_s``, has a first term that every partition shares,
so minimising it is minimising the bottleneck.  Among the partitions that reach the optimum the
one returned is packed from the last unit backwards (every piece starts as early as it can,
last piece first): the first stage, which holds the most micro-batches in flight under 1F1B,
is the lightest, as :func:`harness.core.llm.plan.balanced_stages` chooses.

Whether the simulator confirms it: where the head (or the embedding) weighs more than a block
it does, the DP gives its stage fewer blocks and the simulated step is shorter (Llama 3 8B on 32
H100, 1F1B: 8 % at TP 1 / PP 4, 11 % at TP 2 / PP 8 with SP; ``tests/test_hybrid_search.py``
holds it on a 128k-vocabulary toy).  Where the blocks dominate (Llama 3 405B, GPT-3 175B, BLOOM
on their published degrees) it returns Megatron-LM's even partition.  The bottleneck is Alpa's
estimate, not the simulated step (which also counts the fill and drain and the communication):
``algo=hybrid_search`` simulates both partitions and keeps the faster.

Algorithm (exact): the optimum is one of the contiguous sums.  For a limit ``L`` the greedy
from the back gives each piece, last first, the earliest start ``b >= s`` (room for one unit on
each stage before it) at which ``[b, e)`` weighs at most ``L`` and fits; that greedy covers the
chain whenever any partition does, provided ``fits`` is monotone (a piece that fits still fits
with units removed from its front: true of memory, which only grows with units), because by
induction over ``s`` from the back its piece ``s`` starts no later than that of any feasible
partition.  Bisection over the sorted contiguous sums finds the least feasible ``L``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Sequence

import numpy as np

#: relative tolerance of a piece against the limit: a piece whose weight equals the limit must not be
#: refused because ``prefix[e] - limit`` rounds above ``prefix[b]``
SLACK = 1e-12
#: ``fits(stage, start, end)``: whether units ``start..end-1`` may form pipeline stage ``stage``
Fits = Callable[[int, int, int], bool]


def greedy_from_back(prefix: Sequence[float], chunks: int, limit: float, fits: Fits | None = None) -> tuple[int, ...] | None:
    """The pieces (units per stage) of the greedy from the back under ``limit`` (module
    docstring), or ``None`` when it cannot cover the chain with ``chunks`` pieces."""
    n = len(prefix) - 1
    end = n
    starts = [0] * chunks
    for s in range(chunks - 1, -1, -1):
        lo = max(s, bisect_left(prefix, prefix[end] - limit * (1 + SLACK), 0, end))  # the earliest start the limit allows
        if lo >= end:
            return None
        if fits is not None and not fits(s, lo, end):
            hi = end - 1  # fits is monotone in the start: the earliest start that fits, by bisection
            if not fits(s, hi, end):
                return None
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(s, mid, end):
                    hi = mid
                else:
                    lo = mid
            lo = hi
        if s == 0 and lo > 0:
            return None
        starts[s] = lo
        end = lo
    bounds = [*starts, n]
    return tuple(bounds[i + 1] - bounds[i] for i in range(chunks))


def min_bottleneck_stages(weights: Sequence[float] | np.ndarray, chunks: int, fits: Fits | None = None) -> tuple[int, ...] | None:
    """The partition of the units into ``chunks`` contiguous pieces that minimises the heaviest
    piece subject to ``fits`` (module docstring), as units per piece; ``None`` when no partition
    fits (or there are fewer units than pieces).  ``weights``: one finite non-negative figure
    per unit."""
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"min_bottleneck_stages needs finite non-negative unit weights, got {w!r:.80}")
    if chunks < 1 or chunks > n:
        return None
    prefix_arr = np.concatenate([[0.0], np.cumsum(w)])
    prefix = prefix_arr.tolist()
    # the optimum is at least the heaviest unit and the average piece; without ``fits`` at most that
    # plus the heaviest unit (a greedy under that limit fills every piece but the last beyond the average)
    lo_bound = max(float(w.max(initial=0.0)), prefix[-1] / chunks)
    hi_bound = lo_bound + float(w.max(initial=0.0))
    if fits is not None and greedy_from_back(prefix, chunks, np.inf, fits) is None:
        return None  # no partition fits, whatever its bottleneck
    windowed = greedy_from_back(prefix, chunks, hi_bound, fits) is not None
    cand = contiguous_sums(prefix_arr, lo_bound, hi_bound if windowed else np.inf)
    if not windowed and greedy_from_back(prefix, chunks, float(cand[-1]), fits) is None:
        return None
    lo, hi = 0, len(cand) - 1  # the last candidate is feasible (it is at least the optimum, a contiguous sum in range)
    while lo < hi:
        mid = (lo + hi) // 2
        if greedy_from_back(prefix, chunks, float(cand[mid]), fits) is None:
            lo = mid + 1
        else:
            hi = mid
    return greedy_from_back(prefix, chunks, float(cand[lo]), fits)


def contiguous_sums(prefix: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The distinct sums ``prefix[e] - prefix[b]`` (``b < e``) within ``[lo, hi]`` (a relative
    :data:`SLACK` either side), ascending."""
    n = len(prefix) - 1
    b = np.arange(n)
    first = np.maximum(np.searchsorted(prefix, prefix[:-1] + lo * (1 - SLACK), "left"), b + 1)
    last = np.searchsorted(prefix, prefix[:-1] + hi * (1 + SLACK), "right") if np.isfinite(hi) else np.full(n, n + 1)
    counts = np.maximum(last - first, 0)
    starts = np.repeat(b, counts)
    ends = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    return np.unique(prefix[ends] - prefix[starts])
