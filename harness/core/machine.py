"""Which machine this is: the CPU's model, the name a profile or a measurement is filed under,
and a thread count checked against the cores this process may use.  The profiler, the
calibration, real runs and the profiled cost model (which uses a profile only on the machine
kind that measured it) share these.

A CPU device kind is :func:`cpu_kind`'s ``"<CPU model> (N thread(s))"``: ``conf/cluster/cpu2.yaml``'s
device kind is the CPU that ``python -m harness.calibrate --write`` measured its figures on, and
on any other CPU :func:`foreign_cpu` names this one instead, so that what belongs to that
machine (its profiles) is never taken for this one's.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

from harness.core.errors import ProfileError


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; no host name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_kind(threads: int) -> str:
    """This CPU's device kind at ``threads`` threads (a CPU with 1 thread and with 8 threads are
    different devices)."""
    return f"{cpu_model()} ({threads} thread{'s' if threads != 1 else ''})"


def device_name(device: str, threads: int) -> str:
    """The name a profile is filed under: the GPU's name, or :func:`cpu_kind`."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev.index or 0)
    return cpu_kind(threads)


#: a CPU device kind: :func:`cpu_kind`'s "<model> (N thread(s))"
CPU_KIND = re.compile(r"^(?P<model>.*) \((?P<threads>\d+) threads?\)$")


def cpu_kind_threads(kind: str) -> int | None:
    """The thread count of a CPU device kind (:func:`cpu_kind`), None for another kind (a GPU's)."""
    m = CPU_KIND.match(kind)
    return int(m.group("threads")) if m else None


def foreign_cpu(kind: str) -> str | None:
    """This machine's CPU kind when ``kind`` names another CPU (at the same thread count); None
    when ``kind`` is this CPU's or not a CPU's."""
    threads = cpu_kind_threads(kind)
    if threads is None:
        return None
    here = cpu_kind(threads)
    return here if here != kind else None


def cpu_kind_override(threads: int = 1, key: str = "cluster.device.kind") -> str:
    """The config override that makes a CPU cluster's devices this machine's CPU at ``threads``
    threads (``cluster=cpu2`` on a machine other than the one it was calibrated on)."""
    kind = cpu_kind(threads).replace("'", "\\'")  # Hydra's quoted value: only its quote is escaped
    return f"{key}='{kind}'"


def thread_count(value: Any, key: str) -> int:
    """``value`` as a thread count: an integer from 1 to the cores this process may use
    (:class:`ProfileError` naming ``key`` otherwise)."""
    from harness.core.checks import positive_int

    n = positive_int(value, key, ProfileError)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > cores:
        raise ProfileError(f"{key}={n} is more than the {cores} core(s) this process may use: give at most {cores}")
    return n
