"""PaSE's join-and-minimise step (Alg. 1 lines 20-25), compiled: the new factor over S of
``min over v's configurations of the sum of the factors that mention v``, without writing the
join.

The join of the zoo Transformer at p = 64 reaches 1.5e9 entries from factors of a few million:
written out and read back (numpy's broadcast sum, then ``min``) it is bound by memory traffic.
Here each entry is summed in registers from the factors, which stay in cache, and only the
minimum is written. Every factor is laid out with v's axis last and contiguous, so the inner
loop over v's configurations reads each factor at unit stride. The sum keeps numpy's order
(the factors sorted by size, the smaller ones added first, the largest added last), so the
result is the same to the bit. Chunks of S run in parallel; each entry of the output is
written by one thread alone, so the result does not depend on the threads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange


# no-NaN / no-Inf / no-signed-zero facts only, so that the running minimum vectorises; no
# reassociation or contraction: the sums keep numpy's order and rounding (costs are finite)
@njit(parallel=True, cache=True, fastmath={"nnan", "ninf", "nsz"})
def _min_over_last(arrs, strides, shape_s, out_strides, cv, chunk, out):  # type: ignore[no-untyped-def]
    nf = len(arrs)
    nd = len(shape_s)
    size_s = out.size
    nchunks = (size_s + chunk - 1) // chunk
    for ch in prange(nchunks):
        tmp = np.empty(cv, dtype=out.dtype)
        base = np.zeros(nf, dtype=np.int64)
        prev = np.full(nf, -1, dtype=np.int64)
        s1 = min(size_s, (ch + 1) * chunk)
        for s in range(ch * chunk, s1):
            for f in range(nf):
                base[f] = 0
            o = 0
            rem = s
            for k in range(nd - 1, -1, -1):
                i = rem % shape_s[k]
                rem //= shape_s[k]
                o += i * out_strides[k]
                for f in range(nf):
                    base[f] += i * strides[f, k]
            big = arrs[nf - 1]
            last = base[nf - 1]
            if nf == 1:
                m = big[last]
                for c in range(1, cv):
                    m = min(m, big[last + c])
                out[o] = m
                continue
            # the smaller factors' sum, again only where one of them moved
            same = True
            for f in range(nf - 1):
                if base[f] != prev[f]:
                    same = False
                prev[f] = base[f]
            if not same:
                a0 = arrs[0]
                b0 = base[0]
                for c in range(cv):
                    tmp[c] = a0[b0 + c]
                for f in range(1, nf - 1):
                    af = arrs[f]
                    bf = base[f]
                    for c in range(cv):
                        tmp[c] += af[bf + c]
            m = big[last] + tmp[0]
            for c in range(1, cv):
                m = min(m, big[last + c] + tmp[c])
            out[o] = m


def min_sum(parts: list[tuple[tuple[int, ...], np.ndarray]], S: tuple[int, ...], v: int, C: list[int],
            block_entries: int, dtype: Any = np.float64) -> np.ndarray:
    """Join the factors ``parts`` (each a ``(scope, array)`` that mentions v) and minimise over v:
    the new factor over ``S``, as float64. ``block_entries`` bounds the join entries a thread
    takes at a time; ``dtype`` is the arithmetic's (float64, or float32 for speed)."""
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
    _min_over_last(tuple(a for a, _ in laid), np.ascontiguousarray(strides[:, walk]), np.asarray(shape_s, dtype=np.int64)[walk],
                   out_strides[walk], cv, chunk, out)
    return out.reshape(shape_s).astype(np.float64, copy=False)
