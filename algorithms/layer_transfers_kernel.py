"""The compiled t_X table of one edge (numba), for :class:`algorithms.layer_transfers.TransferCosts`;
imported only when the tables to build are large enough to pay for numba's start-up.

It computes what the numpy path computes, shard pair by shard pair instead of as dense arrays:
the overlap of a producer shard's output box with a consumer shard's input box, the replica
rule of :func:`harness.core.layer_shards.resident_rule`, and each moved byte on the links of its
forward route and of the backward route of its gradient.  A pair whose boxes miss each other on
one axis costs one comparison, and only the links a config pair loaded are read back for the
maximum, so a table costs its shard pairs, not shard pairs times links.  Producer configs run on
numba's threads (each row of the table is one thread's, so the result does not depend on their
number).  The sums run in another order than the numpy path's matrix product: the tables agree
to a few ulps (tests/test_optcnn.py checks both paths against a direct loop).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)  # one row of the table per thread: no shared writes
def edge_table(plo, phi, qlo, qhi, dev_u, valid_u, group, first, dev_v, valid_v, item,  # type: ignore[no-untyped-def]
               route_links, route_len, inv_bw, lat, t, nb):
    """Fill ``t[cu, cv]`` (t_X: most loaded link forward + backward, plus the slowest latency of
    each direction among the routes used) and ``nb[cu, cv]`` (forward bytes) of one edge.

    Boxes ``plo/phi [Cu, Su, A]``, ``qlo/qhi [Cv, Sv, A]``; shards ``dev_*``, ``valid_*``, the
    producer's replica ``group`` and ``first`` ``[C, S]``; the cluster's routes
    (:class:`harness.core.cluster.Cluster`: ``route_links [D, D, K]``, padded, and
    ``route_len [D, D]``), ``inv_bw`` per link and ``lat [D, D]``.
    """
    Cu, Su, A = plo.shape
    Cv, Sv = qlo.shape[0], qlo.shape[1]
    L = inv_bw.shape[0]
    for cu in prange(Cu):
        loads = np.zeros(2 * L)  # forward links, then backward
        touched = np.empty(2 * L, dtype=np.int64)
        is_touched = np.zeros(2 * L, dtype=np.bool_)
        local_group = np.zeros(Su, dtype=np.bool_)
        replicas = False
        for su in range(Su):
            if valid_u[cu, su] and not first[cu, su]:
                replicas = True
        for cv in range(Cv):
            nt = 0
            lat_f = 0.0
            lat_b = 0.0
            total = 0.0
            for sv in range(Sv):
                if not valid_v[cv, sv]:
                    continue
                dv = dev_v[cv, sv]
                if replicas:  # a consumer with a local replica of a part reads it from nobody
                    for g in range(Su):
                        local_group[g] = False
                    for su in range(Su):
                        if valid_u[cu, su] and dev_u[cu, su] == dv:
                            local_group[group[cu, su]] = True
                for su in range(Su):
                    if not valid_u[cu, su]:
                        continue
                    du = dev_u[cu, su]
                    if du == dv:
                        continue
                    if replicas and (not first[cu, su] or local_group[group[cu, su]]):
                        continue
                    ov = 1.0
                    for a in range(A):
                        x = min(phi[cu, su, a], qhi[cv, sv, a]) - max(plo[cu, su, a], qlo[cv, sv, a])
                        if x <= 0:
                            ov = 0.0
                            break
                        ov *= x
                    if ov == 0.0:
                        continue
                    b = ov * item
                    total += b
                    for k in range(route_len[du, dv]):
                        link = route_links[du, dv, k]
                        if not is_touched[link]:
                            is_touched[link] = True
                            touched[nt] = link
                            nt += 1
                        loads[link] += b * inv_bw[link]
                    for k in range(route_len[dv, du]):
                        link = route_links[dv, du, k]
                        if not is_touched[L + link]:
                            is_touched[L + link] = True
                            touched[nt] = L + link
                            nt += 1
                        loads[L + link] += b * inv_bw[link]
                    if lat[du, dv] > lat_f:
                        lat_f = lat[du, dv]
                    if lat[dv, du] > lat_b:
                        lat_b = lat[dv, du]
            most_f = 0.0
            most_b = 0.0
            for i in range(nt):
                link = touched[i]
                if link < L:
                    most_f = max(most_f, loads[link])
                else:
                    most_b = max(most_b, loads[link])
                loads[link] = 0.0
                is_touched[link] = False
            t[cu, cv] = most_f + most_b + lat_f + lat_b
            nb[cu, cv] = total
