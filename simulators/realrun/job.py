"""What travels to the ranks of a real run: each rank's generated program (:class:`RankProgram`),
the :class:`Job` pickled to every rank, the kinds of the events a traced step records, and
:class:`RealRunError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import UserError
from simulators.realrun.execgraph import ExecGraph


#: ``sim.trace`` event kinds: an op's call (id = node), a send call (id = message tag), waiting
#: for a message (tag) or an all-reduce (id = node), the step's last wait for its sends
TRACE_OP, TRACE_SEND, TRACE_RECV, TRACE_ALLREDUCE, TRACE_DRAIN = range(5)
TRACE_KINDS = ("op", "send", "recv_wait", "allreduce_wait", "drain")


class RealRunError(UserError, RuntimeError):
    """A strategy that cannot be executed for real, or a run that failed; the message says why."""


@dataclass
class RankProgram:
    """What one rank executes: generated source of ``step`` and the tables it refers to."""

    rank: int
    code: str
    consts: list[Any]
    targets: list[str]
    recv_params: list[int]  # placeholders received every step (persistent buffers)
    nodes: int  # ops this rank runs
    sends: int
    recvs: int


@dataclass
class Job:
    """Everything a rank needs (pickled to the workers)."""

    world: int
    mode: str  # placement | data_parallel | channel_parallel
    backend: str
    device: str  # cpu | cuda
    threads: int
    warmup: int
    steps: int
    seed: int
    source: Any
    eg: ExecGraph
    programs: list[RankProgram]
    cores: list[list[int]]
    dp_devices: list[int] = field(default_factory=list)
    full_batch: int = 0
    collect: bool = False
    timeout_s: float = 600.0
    #: the launcher ends a run in which no rank made progress for this long (see :mod:`simulators.realrun.launcher`)
    rank_timeout_s: float = 120.0
    #: channel_parallel: parameter placeholder -> rows of it each rank keeps (its slice of output features)
    param_rows: dict[int, int] = field(default_factory=dict)
    #: channel_parallel: outputs (``grad<j>``, ``new<j>``) that are slices, concatenated over the ranks along dim 0
    gather: list[str] = field(default_factory=list)
    #: CPU ranks: keep each rank's cores from idling (:class:`simulators.realrun.timing.IdleSpinners`)
    spin_idle: bool = False
    #: CPU ranks: keep freed memory in the process (:func:`simulators.realrun.timing.steady_malloc`)
    steady_malloc: bool = False
    #: after every step one rank in turn runs the whole ``eg`` alone, timing each node in situ
    #: (:func:`simulators.realrun.timing.in_situ_step`): a profile taken while the run is measured
    interleave_profile: bool = False
    #: the plan graph's node of each ``eg`` node when the plan is coarser (layer granularity), else None
    ref_group: Any = None
    #: the fraction of the plan graph's work one ``eg`` node does (1/k under k-way data parallelism)
    ref_fraction: float = 1.0
    #: record every op, send and wait of the measured steps (``sim.trace``)
    trace: bool = False

