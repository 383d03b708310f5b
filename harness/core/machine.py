"""Which machine this is: the CPU's model, the name a profile or a measurement is filed under,
and a thread count checked against the cores this process may use.  The profiler, the
calibration, real runs and the profiled cost model (which uses a profile only on the machine
kind that measured it) share these."""

from __future__ import annotations

import os
import platform
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


def device_name(device: str, threads: int) -> str:
    """The name a profile is filed under: the GPU's name, or the CPU model with the thread
    count (a CPU with 1 thread and with 8 threads are different devices)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev.index or 0)
    return f"{cpu_model()} ({threads} thread{'s' if threads != 1 else ''})"



def thread_count(value: Any, key: str) -> int:
    """``value`` as a thread count: an integer from 1 to the cores this process may use
    (:class:`ProfileError` naming ``key`` otherwise)."""
    from harness.core.checks import positive_int

    n = positive_int(value, key, ProfileError)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > cores:
        raise ProfileError(f"{key}={n} is more than the {cores} core(s) this process may use: give at most {cores}")
    return n
