"""What one GPU does for one stack unit, as data: the shard it runs (:class:`Shard`), the
collectives inside the unit (:class:`CollectiveCall`), its kernels and memory
(:class:`UnitWork`) and their times under a cost model (:class:`UnitTimes`).
:mod:`harness.core.llm.work` fills them in; these names are re-exported there."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.core.checks import boolean, one_of, positive_int
from harness.core.errors import OptionError
from harness.core.kernels import KernelTable

#: recomputation modes: none; selective (Korthikanti: the attention core); full (the whole block from
#: its input); op (torchtitan's per-op selective checkpointing: every second matmul and the
#: memory-bound ops re-run, the other matmuls' and the fused attention's outputs kept)
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full", "op")
#: the collectives a unit calls (NCCL's names; ``send_recv``: one ring step of context parallelism)
COLLECTIVE_OPS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
#: the groups a unit's collectives run in (DP / ZeRO and PP traffic is the simulator's, from the plan)
UNIT_GROUPS: tuple[str, ...] = ("tp", "cp", "ep")
PHASES: tuple[str, ...] = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class Shard:
    """How one GPU's share of a unit is cut: tensor-parallel degree ``tp`` (with sequence
    parallelism ``sp``: the norms, dropouts and residuals split by sequence too, Korthikanti
    Sec. 4.2.2), context-parallel degree ``cp`` (the sequence split, ring attention), expert
    parallelism ``ep`` (the experts of a MoE layer split), the sequences of one micro-batch on
    one data-parallel replica, and the recomputation (``none``, ``selective``: the attention core,
    ``full``: the whole block from its input, ``op``: torchtitan's per-op policy, :data:`RECOMPUTE`).  Each value is checked, naming ``algo.<key>``."""

    tp: int = 1
    sp: bool = False           # sequence parallelism (needs tp > 1 to mean anything)
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1       # sequences per micro-batch on one DP replica
    recompute: str = "none"

    def __post_init__(self) -> None:
        for key in ("tp", "cp", "ep", "micro_batch"):
            object.__setattr__(self, key, positive_int(getattr(self, key), f"algo.{key}", OptionError))
        object.__setattr__(self, "sp", boolean(self.sp, "algo.sequence_parallel", OptionError))
        one_of(self.recompute, "algo.recompute", RECOMPUTE, OptionError)


@dataclass(frozen=True)
class CollectiveCall:
    """A collective inside a unit, as NCCL is called (``count`` times, each of ``nbytes`` per GPU:
    an all-reduce's buffer, a reduce-scatter's full input, an all-gather's full output, an
    all-to-all's send buffer, one ring step's send)."""

    op: str       # "all_reduce" | "reduce_scatter" | "all_gather" | "all_to_all" | "send_recv"
    group: str    # "tp" | "cp" | "ep"  (inside a unit; DP/ZeRO/PP traffic is the simulator's, from the plan)
    nbytes: int   # the message size per GPU as NCCL is called with it (an all-reduce's buffer, a reduce-scatter's input)
    phase: str    # "forward" | "backward" | "recompute"
    overlapped: bool = False   # True where the real system hides it behind compute (ring attention's KV exchange)
    count: int = 1             # how many such calls (ring attention: cp - 1 steps; the loss's three small all-reduces)

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVE_OPS or self.group not in UNIT_GROUPS or self.phase not in PHASES:
            raise ValueError(f"CollectiveCall({self.op!r}, {self.group!r}, phase {self.phase!r}): op, group or phase unknown")


@dataclass(eq=False)
class UnitWork:
    """The kernels, collectives and memory of one unit on one GPU for one micro-batch."""

    fwd: KernelTable          # kernels of the unit's forward on one GPU (node 0)
    bwd_input: KernelTable    # the backward's input-gradient kernels (ZB-H1's B)
    bwd_weight: KernelTable   # the backward's weight-gradient kernels (ZB-H1's W)
    recompute: KernelTable    # kernels re-run before the backward (empty for "none")
    collectives: list[CollectiveCall]
    stored_bytes: int         # activation bytes kept from forward to backward for one micro-batch (after recompute/SP/CP)
    transient_bytes: int      # peak working memory inside the unit beyond the stored bytes (e.g. the logits and their gradient in the head)
    boundary_bytes: int       # the activation handed to the next unit for one micro-batch on one GPU (a pipeline send), after SP/CP
    params_local: int         # parameter elements on one GPU after TP and EP (before ZeRO)
    #: a tied head's share of the embedding matrix: the head's GPU holds a copy of it when the
    #: head is on another pipeline stage than the embedding (Megatron-LM keeps one on the last stage
    #: and all-reduces its gradient with the first), else it is the embedding's own
    tied_params_local: int = 0
    notes: dict[str, float] = field(default_factory=dict)   # figures behind the bytes (for tests and docs)


@dataclass(frozen=True)
class UnitTimes:
    """:class:`UnitWork`'s kernels in seconds under a cost model (one micro-batch, one GPU)."""

    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    recompute_s: float
    collectives: tuple[CollectiveCall, ...]
    stored_bytes: int
    transient_bytes: int
    boundary_bytes: int
    params_local: int
    tied_params_local: int = 0

    @property
    def bwd_s(self) -> float:
        """The whole backward: recomputation, input and weight gradients."""
        return self.recompute_s + self.bwd_input_s + self.bwd_weight_s
