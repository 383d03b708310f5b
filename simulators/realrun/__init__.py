"""``sim=realrun``: execute a strategy for real with ``torch.distributed`` and time it.

The event simulator still gives ``step_time_s``; this backend adds what the hardware says,
``measured_step_time_s`` (and per-rank figures) to result.json.

How a strategy runs
-------------------
One process (*rank*) per device of the cluster: gloo on CPUs, NCCL on GPUs, started with
``torch.multiprocessing`` (``launcher: spawn``) or ``torchrun`` (``launcher: torchrun``; or
on several hosts by hand, see :func:`simulators.realrun.__main__.main`), rendezvous through ``env://`` or a file.  A
CPU rank is pinned to its own cores (``os.sched_setaffinity``) and runs
``threads_per_rank`` torch threads, so that the ranks behave as separate devices; with
``spin_idle`` (default) it keeps a ``SCHED_IDLE`` busy loop on each of its cores
(:class:`simulators.realrun.timing.IdleSpinners`), so that a rank waiting for a message does not halt
its core - waking a halted virtual CPU costs milliseconds per message.  With
``steady_malloc`` (default) a CPU rank keeps the memory it frees
(:func:`simulators.realrun.timing.steady_malloc`, as the profiler does), so that its buffers are reused
without page faults, as a GPU's caching allocator reuses them; otherwise whether glibc hands
freed buffers back to the OS differs from process to process, and so does the step time.

The captured joint forward + backward + SGD-update graph is turned into an
:class:`~simulators.realrun.execgraph.ExecGraph` and, for each rank, into straight-line Python code
(compiled once; a few hundred nanoseconds of overhead per op, like ``torch.fx``'s own code):

* **operator placement** (every node on one device): every rank walks the nodes in the
  strategy's order and runs those placed on it; a tensor produced on rank a and read on rank
  b is sent once per (producer, destination rank) - the simulator's cache - with ``isend``
  right after it is produced and received into a fresh buffer with an ``irecv`` posted
  before the step's barrier (``early_recv``, the default, on gloo; on NCCL, or with
  ``early_recv: false``, at the producer's position of the walk - NCCL runs the operations
  with one peer in order on one stream, where a receive posted up front would hold back the
  sends it depends on) and waited for just before its first use.  gloo writes a
  tensor from the sending thread at once only when the receiver's notice that its receive is
  posted has already arrived; otherwise the payload leaves from gloo's event-loop thread when
  that notice comes in, which on a one-core rank that computes on waits for the scheduler
  (``python -m harness.calibrate`` measures both; what posting late cost: results/README.md,
  Simulator accuracy).  Every rank posts its
  operations in one global order, so the exchange cannot deadlock.  Parameters live on
  their *home* rank (the rank of their update op, else of their first reader, as in the
  simulator); other ranks that read a parameter receive it at the start of the step and the
  home rank keeps the updated value.  Consumers that read only a tensor's shape
  (``ones_like``...) get a local stand-in (the graph has no edge there either);
* **data parallelism** (the same ``{sample: k}`` config on every node): each rank runs the
  graph captured at batch B/k on its k-th of the batch and all-reduces (averages) every
  partial result that feeds a replicated op - the weight gradients before their update -
  asynchronously, waiting just before the update (or at the end of the step).  Batch
  statistics (BatchNorm) stay per rank, as in DDP without SyncBatchNorm;
* **channel-parallel layers** (a layer-graph strategy - OWT, OptCNN, PaSE - whose every layer is
  ``{sample: k}`` or, for an ``nn.Linear`` or an elementwise layer, ``{channel: k}``, all on the
  same k devices): the data-parallel program above, in which the aten ops of those layers hold
  other *representations* (:class:`ChannelPlan`) and a value is converted, with a blocking
  collective over the k ranks, where its consumer needs another one.  On rank p a value is
  ``L`` (its batch shard, all features: what data parallelism computes), ``C`` (the full
  batch, its p-th slice of the features), ``W`` (its p-th slice of the rows - output features -
  of a linear layer's weight and bias, of their gradients and updated values) or ``P`` (a
  full-batch partial sum).  A channel-parallel linear layer reads its input in full (``R``:
  ``L`` -> all-gather of the batch shards, ``C`` -> all-gather of the feature slices), multiplies
  it by its weight rows (``addmm`` with the bias slice) and outputs ``C``; its input gradient is
  the output gradient in ``C`` times the weight rows, a ``P`` summed by an all-reduce (each rank
  then takes its rows, ``L``, or its features, ``C``); its weight and bias gradients are the
  products with the full input and the batch sum of the ``C`` output gradient, divided by k -
  every rank's loss is the mean over its own B/k samples, so this is the mean of the k local
  gradients, as data parallelism's all-reduce - and stay local (no gradient all-reduce), as
  does the SGD update of the slice.  A channel-parallel elementwise layer (``tanh`` / ``relu``
  after a linear layer, OWT's choice) runs its forward and backward ops on ``C``.  ``C`` -> ``L``
  and ``L`` -> ``C`` are an all-to-all: a linear layer's output read by a data-parallel layer is
  re-split by sample.  The results equal data parallelism's (``reference_outputs(shards=k)``)
  up to the order of floating-point sums; the step's reported gradients and updated parameters
  of those layers are the slices concatenated over the ranks (an all-gather after the step).
  Measured as ``mode: channel_parallel``; the conversions are not counted in the ranks' busy
  time.  Ranks keep only their slices, so a channel-parallel layer's weights are never whole;
* anything else is refused with :class:`RealRunError`: other parallel configs (channel-parallel
  convolutions or views, spatial splits, a sample x channel split, a mix of configs and
  placements, layers on different device sets) are simulated only, and the message names the
  layer; so is a linear layer outside the pattern above (called twice, a weight shared with
  another op such as a tied output projection, a non-nn.Linear product).  A graph rewritten by
  an algorithm (FD-DPS's split sub-ops, Celeritas's coarse nodes) has no executable form.  On an
  op graph only pure placements and pure data parallelism run.  Layer-granularity op graphs
  (``graph.granularity=layer``) run by expanding each coarse node into its aten ops.

Step time (Celeritas Sec. 6): ``warmup`` steps are discarded and the mean of the next
``steps`` is reported.  Each step starts at a barrier; its time is that of its longest rank,
from leaving the barrier to the end of its last operation and wait (``measured_span_s``, the
first start to the last end on one host's clock, also counts the barrier's exit skew).
``measured_rank_busy_s`` is the time each rank spent inside its ops (host time on a GPU),
``measured_rank_send_s`` inside its ``isend`` calls (on gloo the payload is written there)
and ``measured_rank_wait_s`` waiting for its receives, its all-reduces and, at the end of
the step, its sends to complete; ``measured_rank_page_faults`` counts the minor page faults
of the rank's process during a step (allocations the C library had to map afresh, see
``steady_malloc``); per step, means over the measured steps.

Profiled during the run (``interleave_profile``, off by default): after every step one rank
in turn - the others wait at a barrier it joins when done - runs the whole executed graph alone
from its own copy of the initial state and times each op in situ
(:func:`simulators.realrun.timing.in_situ_step`, the profiler's ``mode=in_situ``).  The plan is then
simulated again with each op's mean over those reference steps (summed per coarse node of a
layer-granularity plan; the B/k graph's times stand for the data-parallel shards) - means, as
the measured step is a mean and a mean step is the sum of its ops' means (per-op medians came
out short, an op now and then being slow: results/README.md):
each device's times from its own rank's reference steps, as two cores of a shared VM need not be
equally fast at a given minute: ``step_time_interleaved_s`` and ``sim_relative_error_interleaved`` beside ``step_time_s``,
``measured_reference_step_s`` the reference steps' mean length.  A profile taken minutes
before the run sees another machine when the machine's speed drifts (``python -m
harness.app.calibrate --drift``: tens of percent on a shared VM); one interleaved with the measured
steps sees the same one, so the comparison isolates the simulator's model of the step -
overlap, order, communication - from the drift.  Not for channel-parallel runs, whose layers
execute other ops than the captured graph's.

How a run ends (the progress board, stalls, interruptions, clean-up) is told in
:mod:`simulators.realrun.launcher`.

Modules
-------
* :mod:`~simulators.realrun.job` - :class:`Job` (what every rank is sent), :class:`RankProgram`,
  :class:`RealRunError`, the trace's event kinds;
* :mod:`~simulators.realrun.codegen` - each rank's generated ``step`` (placement, data parallelism);
* :mod:`~simulators.realrun.channel` - channel-parallel layers (:class:`ChannelPlan`);
* :mod:`~simulators.realrun.backend` - :class:`RealRun` (plan -> job, simulate, launch, report) and
  :func:`reference_outputs`;
* :mod:`~simulators.realrun.costs` - the interleaved profile's cost model (:class:`RunProfileCosts`);
* :mod:`~simulators.realrun.board` - the progress board, the watchdog and the stall message;
* :mod:`~simulators.realrun.worker` - a rank: set-up, compiled program, timed steps;
* :mod:`~simulators.realrun.measured` - :class:`Measured`, read back from the ranks' records;
* :mod:`~simulators.realrun.launcher` - spawn / torchrun launches (:func:`launch`, :func:`launch_many`) and
  job directories (:func:`job_directory`);
* :mod:`~simulators.realrun.sealed` - the job and the ranks' records on disk, sealed with a key per launch;
* :mod:`~simulators.realrun.__main__` - ``python -m simulators.realrun`` (a rank under torchrun, ``--summary``).
"""

from __future__ import annotations

from simulators.realrun.backend import RealRun, reference_outputs
from simulators.realrun.board import (BOARD_SLOTS, P_BARRIER, P_COLLECTIVE, P_DONE, P_DRAIN, P_FINAL, P_LOAD, P_PROFILE, P_PROFILE_WAIT,
                                      P_RECV, P_RENDEZVOUS, P_SETUP, P_START, P_STEP, WAITING, Progress, Watchdog, stall_message)
from simulators.realrun.channel import ChannelPlan, channel_plan
from simulators.realrun.codegen import dp_program, placement_programs
from simulators.realrun.costs import RunProfileCosts, interleaved_costs, interleaved_step_time
from simulators.realrun.job import (TRACE_ALLREDUCE, TRACE_DRAIN, TRACE_KINDS, TRACE_OP, TRACE_RECV, TRACE_SEND, Job, RankProgram,
                                    RealRunError)
from simulators.realrun.launcher import POLL_S, job_directory, launch, launch_many, write_job
from simulators.realrun.measured import Measured, read_results
from simulators.realrun.worker import run_rank

__all__ = [
    "BOARD_SLOTS", "P_BARRIER", "P_COLLECTIVE", "P_DONE", "P_DRAIN", "P_FINAL", "P_LOAD", "P_PROFILE", "P_PROFILE_WAIT", "P_RECV",
    "P_RENDEZVOUS", "P_SETUP", "P_START", "P_STEP", "POLL_S", "TRACE_ALLREDUCE", "TRACE_DRAIN", "TRACE_KINDS", "TRACE_OP", "TRACE_RECV",
    "TRACE_SEND", "WAITING", "ChannelPlan", "Job", "Measured", "Progress", "RankProgram", "RealRun", "RealRunError", "RunProfileCosts",
    "Watchdog", "channel_plan", "dp_program", "interleaved_costs", "interleaved_step_time", "job_directory", "launch", "launch_many",
    "placement_programs", "read_results", "reference_outputs", "run_rank", "stall_message", "write_job",
]
