"""The scheduling toolkit every list scheduler and placer of ``algorithms/`` is built from.

* :mod:`~algorithms.sched.levels`: static costs w_i / c_ij, top and bottom levels, cpath and
  the CCR of Celeritas Eq. 1 (Kwok and Ahmad 1999; HEFT; Celeritas Eqs. 1-3).
* :mod:`~algorithms.sched.orders`: topological orders (BFS as TensorFlow's placer and
  Baechi's m-TOPO, DFS-TOPO, CPD-TOPO) and schedule orders from start times.
* :mod:`~algorithms.sched.timeline`: device timelines with insertion slots (HEFT Sec. 4.1)
  and the block index of idle gaps for schedulers whose placed tasks never move.
* :mod:`~algorithms.sched.constraints`: what a placement must respect: co-location pinning
  ("co-location groups follow their first member"), static memory with its filter, the
  sequential fill with its best-effort fall-back, buffer liveness, parameter ownership.
* :mod:`~algorithms.sched.schedgraph`: the array view of a DAG a list scheduler works on.
* :mod:`~algorithms.sched.engine`: the ready-list engine (ready counting, data-ready times,
  the priority list scheduler with insertion, replay of a placement in a given order).
* :mod:`~algorithms.sched.etf`: Baechi's memory-constrained ETF / SCT engine.
"""
