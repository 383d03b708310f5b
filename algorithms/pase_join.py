"""PaSE's join-and-minimise step (Alg. 1 lines 20-25): the new factor over S of ``min over v's
configurations of the sum of the factors that mention v``.

Two paths, equal to the bit (tests/test_pase.py):

* numpy, for joins below :data:`COMPILED_FROM` entries: the join laid out v-first, built in
  slices of v's configurations with a running minimum;
* compiled (:mod:`algorithms.pase_join_kernel`, numba), from :data:`COMPILED_FROM` entries,
  without writing the join. The zoo Transformer at p = 64 joins 1.5e9 entries from factors of
  a few million: written out and read back that is bound by memory traffic. The kernel sums
  each entry in registers from the factors, which stay in cache, and writes only the
  minimum. Every factor is laid out with v's axis last and contiguous, so the inner loop over
  v's configurations reads each factor at unit stride; S is walked with the dims the
  smaller factors index least varying fastest, so their partial sum is reused. Chunks of S
  run in parallel; each output entry is written by one thread alone, so the result does not
  depend on the threads.

Both sum in one order (the factors sorted by size, the smaller ones added first, the
largest added last) and only the sums are rounded: no reassociation, no contraction.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.core.compiled import use_compiled

#: joins of at least this many entries take the compiled kernel (numba's start-up, about 0.5 s
#: per process, is worth it there); smaller ones numpy
COMPILED_FROM = 1 << 24


def min_sum(parts: list[tuple[tuple[int, ...], np.ndarray]], S: tuple[int, ...], v: int, C: list[int],
            block_entries: int, dtype: Any = np.float64, compiled: bool | None = None) -> np.ndarray:
    """Join the factors ``parts`` (each a ``(scope, array)`` that mentions v; scopes sorted) and
    minimise over v: the new factor over ``S``, as float64. ``block_entries`` bounds the join
    entries held (numpy) or taken by a thread (compiled) at a time; ``dtype`` is the
    arithmetic's (float64, or float32 for speed); ``compiled`` forces a path (None: by size)."""
    if not use_compiled(math.prod(C[x] for x in S) * C[v], COMPILED_FROM, forced=compiled):
        return _min_sum_numpy(parts, S, v, C, block_entries, dtype)
    from numba.typed import List

    from algorithms.pase_join_kernel import min_over_last

    cv = C[v]
    shape_s = [C[x] for x in S]
    pos = {x: k for k, x in enumerate(S)}
    laid = []
    for scope, arr in parts:
        # v's axis last and contiguous (a copy only where it is not); the others keep their order
        a = np.asarray(arr)
        k = scope.index(v)
        if k != a.ndim - 1 or a.dtype != dtype or not a.flags.c_contiguous:
            a = np.ascontiguousarray(np.moveaxis(a, k, -1), dtype=dtype)
        rest = [x for x in scope if x != v]
        stride = np.zeros(len(S), dtype=np.int64)
        step = cv
        for x in reversed(rest):
            stride[pos[x]] = step
            step *= C[x]
        laid.append((a.reshape(-1), stride))
    laid.sort(key=lambda t: t[0].size)  # stable: the order numpy's join summed them in
    strides = np.stack([s for _, s in laid]) if S else np.zeros((len(laid), 0), dtype=np.int64)
    # walk S with the dims the smaller factors index least varying fastest, so that their
    # partial sum is reused along the fastest dim; the output keeps S's row-major layout
    out_strides = np.ones(len(S), dtype=np.int64)
    for k in range(len(S) - 2, -1, -1):
        out_strides[k] = out_strides[k + 1] * shape_s[k + 1]
    small = (strides[:-1] != 0).sum(axis=0) if len(laid) > 1 else np.zeros(len(S), dtype=np.int64)
    walk = sorted(range(len(S)), key=lambda k: -int(small[k]))
    out = np.empty(math.prod(shape_s), dtype=dtype)
    chunk = max(1, block_entries // max(1, cv))
    arrs = List()  # one compiled specialisation per dtype, whatever the number of factors
    for a, _ in laid:
        arrs.append(a)
    min_over_last(arrs, np.ascontiguousarray(strides[:, walk]), np.asarray(shape_s, dtype=np.int64)[walk],
                   out_strides[walk], cv, chunk, out)
    return out.reshape(shape_s).astype(np.float64, copy=False)


def _min_sum_numpy(parts: list[tuple[tuple[int, ...], np.ndarray]], S: tuple[int, ...], v: int, C: list[int],
                   block_entries: int, dtype: Any) -> np.ndarray:
    """:func:`min_sum` with numpy: the join laid out v-first, ``[C_v, *C_S]``, built in slices of
    v's configurations holding at most ``block_entries`` entries, with a running minimum across
    slices; within a slice the smaller factors are summed first (broadcasting to their union
    only), so the full slice is written once and read once."""
    axes = [v] + list(S)
    pos = {x: i for i, x in enumerate(axes)}
    shape_s = [C[x] for x in S]
    aligned = []
    for scope, arr in parts:
        a = np.moveaxis(arr, scope.index(v), 0)
        shp = [1] * len(axes)
        for x in scope:
            shp[pos[x]] = C[x]
        aligned.append(a.reshape(shp).astype(dtype, copy=False))
    aligned.sort(key=lambda a: a.size)
    cv = C[v]
    blk = max(1, min(cv, block_entries // max(1, math.prod(shape_s))))
    buf = np.empty([blk] + shape_s, dtype=dtype)
    best = None
    for c0 in range(0, cv, blk):
        w = min(blk, cv - c0)
        b = buf[:w]
        if len(aligned) == 1:
            np.copyto(b, aligned[0][c0:c0 + w])
        else:
            small = aligned[0][c0:c0 + w]
            for a in aligned[1:-1]:
                small = small + a[c0:c0 + w]
            np.add(aligned[-1][c0:c0 + w], small, out=b)
        m = b[0] if w == 1 else b.min(axis=0)
        if best is None:
            best = np.array(m, dtype=dtype, copy=True)
        else:
            np.minimum(best, m, out=best)
    assert best is not None
    return best.astype(np.float64, copy=False)
