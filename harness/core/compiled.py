"""When a compiled (numba) twin of a Python or numpy loop pays: the one rule every module that
has one follows (the event engine, FD-DPS's scheduler, OptCNN's transfer tables, PaSE's join).

A compiled kernel is loaded once per process (from numba's cache beside its module, about
0.5 s; a first compile in a fresh checkout, seconds), and then runs many times faster than
the loop it replaces.  So it pays from a smaller problem once it is loaded (``warm_from``)
than while loading it is still part of the cost (``cold_from``); each module keeps its own two
thresholds where it documents them.  The kernel counts as loaded once its module is imported
in this process: a module that warms its kernel up (``simulators.engine.warm_up``, which a
sweep calls before its workers fork) imports it, and so does a first compiled run.
"""

from __future__ import annotations

import sys


def kernel_loaded(module: str) -> bool:
    """Whether the kernel module ``module`` (a dotted name) is imported in this process: its
    start-up is paid."""
    return module in sys.modules


def use_compiled(size: float, warm_from: float, cold_from: float | None = None, kernel: str | None = None,
                 forced: bool | None = None) -> bool:
    """Whether a problem of ``size`` (tasks, nodes, shard pairs, join entries) takes the compiled
    kernel: ``forced`` when it is not None (a caller's or a config's choice), else ``size >=
    warm_from`` once ``kernel`` is loaded (:func:`kernel_loaded`) and ``size >= cold_from``
    before (``cold_from`` None: the same threshold either way)."""
    if forced is not None:
        return bool(forced)
    warm = kernel is not None and kernel_loaded(kernel)
    return size >= (warm_from if warm or cold_from is None else cold_from)
