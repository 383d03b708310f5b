"""The compiled kernel of :func:`algorithms.pase_join.min_sum` (numba; imported only when a join
is large enough to pay for numba's start-up)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange


# no-NaN / no-Inf / no-signed-zero facts only, so that the running minimum vectorises; no
# reassociation or contraction: the sums keep numpy's order and rounding (costs are finite)
@njit(parallel=True, cache=True, fastmath={"nnan", "ninf", "nsz"})
def min_over_last(arrs, strides, shape_s, out_strides, cv, chunk, out):  # type: ignore[no-untyped-def]
    """``out[o(s)] = min over c < cv of the sum over f of arrs[f][base_f(s) + c]``, for every point
    s of the grid ``shape_s`` (walked row-major), ``base_f`` and ``o`` its offsets by ``strides[f]``
    and ``out_strides``: the factors summed in order, the last added to the sum of the others."""
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
