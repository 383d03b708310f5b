"""Real runs end cleanly (issue 19): a stalled rank is named within ``sim.rank_timeout_s``,
SIGINT / SIGTERM end every rank, the launcher's temporary job directory goes, a job run
by hand without torchrun is told how to start it, and a GPU cluster's plan is not measured on
ranks that lack its GPUs.

A rank stalls here without any hook in the product: the tiny model of :func:`make_model` holds
a custom op (``realrun_clean::gate``) that, inside a real run, blocks forever on the rank and
call it was built for (or the model's constructor blocks), so the captured graph executes it
like any other op; a rank that never reaches the rendezvous is frozen with SIGSTOP as soon as
its process exists; a message that never comes is a receive added to a generated program.
Every run is 2 gloo ranks on cpu2 with a step or two, and every test checks that the processes
it started (ranks, their idle spinners) are gone afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from torch import nn

from harness.app.compose import compose
from simulators.realrun.execgraph import TensorMeta
from harness.app.run import build
from simulators.realrun import (BOARD_SLOTS, P_BARRIER, P_COLLECTIVE, P_DONE, P_RECV, P_RENDEZVOUS, P_SETUP, P_START, P_STEP, Job,
                                RealRun, RealRunError, launch, stall_message)
from simulators.realrun.sealed import JOB_FILE, KEY_ENV, new_key

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
#: seconds without progress before the launcher ends a run, in these tests
STALL_S = 2.0

# ---------------------------------------------------------------------------- a model that stalls on purpose
#: set by :func:`make_model` in every process that builds the model: the rank that stalls and on
#: which call of the gate (-1: none)
STALL = {"rank": -1, "call": -1}
CALLS = [0]


def _stalling_rank() -> bool:
    """Whether this process is the rank of a real run that the model was built to stall."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_rank() == STALL["rank"]


@torch.library.custom_op("realrun_clean::gate", mutates_args=())
def gate(x: torch.Tensor) -> torch.Tensor:
    """``x`` copied; on the stalling rank's stalling call, never returns."""
    CALLS[0] += 1
    if CALLS[0] == STALL["call"] and _stalling_rank():
        threading.Event().wait()
    return x.clone()


@gate.register_fake
def _gate_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Gated(nn.Module):
    """Two linear layers behind the gate (8 -> 16 -> 4 features)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(gate(x))))


def make_model(stall_rank: int = -1, stall_call: int = -1, stall_build: bool = False) -> nn.Module:
    """The gated model; inside a real run, rank ``stall_rank`` blocks in the ``stall_call``-th
    call of the gate (counted over the steps), or here, while building it, with ``stall_build``."""
    STALL.update(rank=stall_rank, call=stall_call)
    if stall_build and _stalling_rank():
        threading.Event().wait()
    return Gated()


def gated(*extra: str, steps: int = 2) -> list[str]:
    """Overrides of a real run of the gated model on cpu2 (2 ranks, one warm-up step and ``steps`` measured)."""
    return ["model=custom", f"model.module._target_={__name__}.make_model", "model.batch_size=4", "model.inputs=[{shape:[8],dtype:float32}]",
            "model.target.high=4", "cluster=cpu2", "sim=realrun", "sim.warmup=1", f"sim.steps={steps}", "output.gantt=false", *extra]


def planned(overrides: list[str]) -> tuple[Any, Any, Any, Any]:
    """The plan of a composed config, its RealRun (bound to the model), cluster and cost model."""
    src, cluster, costs, algo, sim = build(compose(overrides))
    sim.bind(src, 0, {"granularity": "aten"})
    return algo.plan(src.op_graph(keep_fx=True), cluster, costs), sim, cluster, costs


def prepared(overrides: list[str]) -> tuple[Job, Any, Any]:
    """The job of a composed config's plan with ``sim.rank_timeout_s`` = :data:`STALL_S`, its RealRun and cluster."""
    plan, sim, cluster, _ = planned([*overrides, f"sim.rank_timeout_s={STALL_S}"])
    return sim.prepare(plan.graph, plan.strategy, cluster.num_devices), sim, cluster


# ---------------------------------------------------------------------------- processes
def _table() -> dict[int, tuple[int, str, str]]:
    """Every process: pid -> (parent pid, state letter, command line)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(d.name)] = (int(fields[1]), fields[0], cmd)
    return out


def _descendants(root: int) -> dict[int, str]:
    """The processes below ``root`` (pid -> command line), but multiprocessing's resource tracker."""
    table = _table()
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, cmd) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = cmd
                todo.append(pid)
    return {pid: cmd for pid, cmd in found.items() if "resource_tracker" not in cmd}


def _alive(pids: Any) -> set[int]:
    table = _table()
    return {p for p in pids if p in table and table[p][1] not in "ZX"}


def is_rank(cmd: str) -> bool:
    return "spawn_main" in cmd


class Watcher:
    """Records, every 20 ms until stopped, every process below ``root`` with its latest command
    line (a child has its parent's until it calls exec, a zombie none); ``on_new(pid, cmd)`` is
    called for each command line a process is seen with."""

    def __init__(self, root: int, on_new: Callable[[int, str], None] | None = None) -> None:
        self.root, self.on_new = root, on_new
        self.seen: dict[int, str] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            for pid, cmd in _descendants(self.root).items():
                if cmd and self.seen.get(pid) != cmd:  # a zombie's is empty
                    self.seen[pid] = cmd
                    if self.on_new is not None:
                        self.on_new(pid, cmd)
            time.sleep(0.02)

    def __enter__(self) -> "Watcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()

    def ranks(self) -> list[int]:
        return sorted(p for p, cmd in self.seen.items() if is_rank(cmd))

    def spinners(self) -> list[int]:
        return sorted(p for p, cmd in self.seen.items() if "SCHED_IDLE" in cmd)


def assert_gone(pids: Any, within_s: float = 5.0) -> None:
    """Every process of ``pids`` ends within ``within_s``."""
    end = time.monotonic() + within_s
    while _alive(pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pids), f"still running: {[_table()[p][2][:80] for p in _alive(pids)]}"


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of its own for the launcher's job directories."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    yield d


def leftovers(d: Path) -> list[str]:
    """What a launch left in the temporary directory ``d``: job directories, torch's error files."""
    return sorted(f.name for f in d.iterdir() if f.name.startswith(("realrun-", "pytorch-errorfile")))


def one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text


def expect_stall(job: Job, scratch: Path, *must: str) -> str:
    """Launch a job that stalls: the error's one line, which names ``must``, within a bounded time; nothing left behind."""
    t0 = time.monotonic()
    with Watcher(os.getpid()) as w, pytest.raises(RealRunError) as e:
        launch(job)
    msg = one_line(str(e.value))
    for m in must:
        assert m in msg, msg
    assert msg.endswith("all 2 ranks were ended (raise sim.rank_timeout_s if a step of this plan takes longer)")
    assert time.monotonic() - t0 < 60  # startup, the stall, 2 s without progress: far below the 600 s of torch.distributed
    assert len(w.ranks()) == 2
    assert_gone(w.seen)
    assert leftovers(scratch) == []
    return msg


# ---------------------------------------------------------------------------- stalls
def test_a_finished_run_leaves_nothing_behind(scratch):
    job, _, _ = prepared(gated("algo=data_parallel"))
    with Watcher(os.getpid()) as w:
        m = launch(job)
    assert m.step_time_s > 0 and len(m.step_s) == 2
    assert len(w.ranks()) == 2 and len(w.spinners()) == 2  # each rank kept an idle spinner on its core ...
    assert_gone(w.seen, 0.5)  # ... and both ended with it
    assert leftovers(scratch) == []  # the job directory (its board, rendezvous file...), torch's error files


def test_a_rank_stuck_in_an_op_is_named(scratch):
    """Round-robin placement (the gate on rank 0), rank 0 blocked in the gate in step 1: rank 1
    waits for a message from it."""
    job, _, _ = prepared(gated("algo=round_robin", "+model.module.stall_rank=0", "+model.module.stall_call=2"))
    assert "F0(ph4)" in job.programs[0].code and job.eg.instrs[0].target == "realrun_clean.gate.default"
    expect_stall(job, scratch, "real run stalled: rank 0 stopped responding (no rank made progress for 2 s, sim.rank_timeout_s): "
                 "rank 0 was running its ops in step 1; rank 1 was waiting for a message from rank 0 (tag ")


@pytest.mark.slow
def test_a_rank_stuck_before_its_first_barrier_is_named(scratch):
    """Rank 1 hangs building its model (after the rendezvous): rank 0 waits at the first barrier."""
    job, _, _ = prepared(gated("algo=data_parallel", "+model.module.stall_rank=1", "+model.module.stall_build=true"))
    expect_stall(job, scratch, "rank 1 stopped responding", "rank 1 was building its model, state and program; "
                 "rank 0 was waiting at the barrier before step 0 (warm-up)")


def test_a_rank_that_never_reaches_the_rendezvous_is_named(scratch):
    """Rank 1 frozen (SIGSTOP) as soon as its process exists, long before it joins the rendezvous."""
    job, _, _ = prepared(gated("algo=data_parallel"))
    spawned: list[int] = []

    def freeze_rank_1(pid: int, cmd: str) -> None:
        if is_rank(cmd) and pid not in spawned:
            spawned.append(pid)
            if len(spawned) == 2:
                os.kill(pid, signal.SIGSTOP)

    with Watcher(os.getpid(), freeze_rank_1) as w, pytest.raises(RealRunError) as e:
        launch(job)
    assert len(spawned) == 2 and spawned == w.ranks()
    assert one_line(str(e.value)).startswith(
        "real run stalled: rank 1 stopped responding (no rank made progress for 2 s, sim.rank_timeout_s): "
        "rank 1 had not started (never heard from, and no CPU time used, since its launch); rank 0 was waiting at the rendezvous (init_process_group); ")
    assert_gone(w.seen)
    assert leftovers(scratch) == []


@pytest.mark.slow
def test_a_message_that_never_comes_is_named(scratch):
    """Rank 1 waits, in its first step, for a message that rank 0 never sends: rank 0 goes on to
    the next step's barrier."""
    job, _, _ = prepared(gated("algo=single_device"))
    prog = job.programs[1]
    assert prog.nodes == 0  # every op on rank 0
    prog.consts = [TensorMeta((4,), "float32", (1,))]
    prog.code = "def step(PH, RB, W, _P=()):\n    _irecv(_empty(K[0]), 0, 999).wait()\n    return 0.0, {}"
    expect_stall(job, scratch, "rank 1 stopped responding", "rank 1 was waiting for a message from rank 0 (tag 999) in step 0 (warm-up); "
                 "rank 0 was waiting at the barrier before step 1;")


def _row(phase: int, job: int = 0, step: int = 0, detail: int = 0) -> list[int]:
    return [phase, job, step, detail]


def test_the_stall_report_names_the_ranks_that_stopped_the_run():
    """Of the least advanced ranks, those not waiting for the others; every one when all wait."""
    job = Job(4, "placement", "gloo", "cpu", 1, 1, 2, 0, None, None, [], [])
    assert BOARD_SLOTS == 4

    def stuck(*rows: list[int]) -> str:
        msg = stall_message(np.array(rows, dtype=np.int64), [job], 120)
        return re.match(r"real run stalled: (.*?) stopped responding", msg).group(1)

    # a rank in its ops while the others wait for it in the same step, or are a step ahead
    assert stuck(_row(P_COLLECTIVE, step=2, detail=5), _row(P_STEP, step=2), _row(P_BARRIER, step=3), _row(P_DONE)) == "rank 1"
    # one behind: still building its state, or never started
    assert stuck(_row(P_BARRIER), _row(P_BARRIER), _row(P_SETUP), _row(P_BARRIER)) == "rank 2"
    assert stuck(_row(P_RENDEZVOUS), _row(P_START), _row(P_START), _row(P_RENDEZVOUS)) == "ranks 1 and 2"
    # a deadlock: each waits for a message from the other
    assert stuck(_row(P_RECV, step=1, detail=1 << 32 | 7), _row(P_RECV, step=1, detail=0 << 32 | 9), _row(P_BARRIER, step=2),
                 _row(P_BARRIER, step=2)) == "ranks 0 and 1"
    # what each rank did, the stuck ones first, ranks that did the same together
    msg = stall_message(np.array([_row(P_RECV, step=1, detail=1 << 32 | 7), _row(P_STEP, step=1), _row(P_BARRIER, step=2),
                                  _row(P_BARRIER, step=2)]), [job], 120)
    assert msg == ("real run stalled: rank 1 stopped responding (no rank made progress for 120 s, sim.rank_timeout_s): rank 1 was "
                   "running its ops in step 1; rank 0 was waiting for a message from rank 1 (tag 7) in step 1; ranks 2 and 3 were "
                   "waiting at the barrier before step 2; all 4 ranks were ended (raise sim.rank_timeout_s if a step of this plan "
                   "takes longer)")


def test_rank_timeout_must_be_below_the_torch_distributed_timeout():
    RealRun(rank_timeout_s=30, timeout_s=60)
    for bad in (0, 60, 900):
        with pytest.raises(RealRunError, match=r"^sim.rank_timeout_s must be > 0 and below sim.timeout_s \(60\)"):
            RealRun(rank_timeout_s=bad, timeout_s=60)


# ---------------------------------------------------------------------------- signals
def _driver_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), "TMPDIR": str(tmp)}


def _as_a_shell_starts_it() -> None:
    """In the child, before exec: SIGINT and SIGQUIT at their default action, as a shell starts a
    foreground command. A pytest started in the background by a script (``pytest &``) ignores
    both, its children inherit that, and a Ctrl-C to the command would be ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """A process's blocked, ignored and caught signal masks and the kernel function it sleeps in
    (what a hung process was doing with the signal it was sent)."""
    try:
        status = {k: v.strip() for k, v in (line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)}
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return "(gone)"
    return f"[blk {status.get('SigBlk')} ign {status.get('SigIgn')} cgt {status.get('SigCgt')} wchan {wchan}]"


def _interrupt_when_running(cmd: list[str], tmp: Path, sig: int, group: bool) -> tuple[subprocess.CompletedProcess, Watcher]:
    """Start ``cmd``, wait until both ranks have their idle spinners (past the rendezvous), send
    ``sig`` to it (``group``: to its whole process group, as a terminal's Ctrl-C does); its exit."""
    p = subprocess.Popen(cmd, cwd=REPO, env=_driver_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_as_a_shell_starts_it)
    try:
        with Watcher(p.pid) as w:
            end = time.monotonic() + 120
            while len(w.spinners()) < 2 and p.poll() is None and time.monotonic() < end:
                time.sleep(0.05)
            assert len(w.spinners()) == 2, p.communicate(timeout=5) if p.poll() is not None else "no ranks after 120 s"
            time.sleep(0.5)
            (os.killpg if group else os.kill)(p.pid, sig)
            # what is pinned is that every rank ends and nothing is left, not how fast (alone it
            # exits within 7 s); a hang fails it, saying what was still running and what it wrote
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                table = _table()
                left = [f"{pid} {table[pid][1]} {_signal_state(pid)} {table[pid][2][:100]}" for pid in sorted(_alive(set(w.seen) | {p.pid}))]
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate(timeout=30)
                pytest.fail(f"no exit within 120 s of {signal.Signals(sig).name}; still running: {left}; "
                            f"its stderr ends:\n{err[-4000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), w


DRIVER = """
import sys
from harness.app.compose import compose
from harness.app.run import run
if __name__ == "__main__":
    run(compose(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_a_signal_to_the_launching_process_ends_every_rank(tmp_path, sig):
    """SIGTERM: one line and status 1; SIGINT: a KeyboardInterrupt saying what was ended (Python's
    Ctrl-C); either way no rank, spinner or job directory is left (rank 1 is stuck building its
    model, rank 0 waits for it)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    overrides = gated("algo=data_parallel", "+model.module.stall_rank=1", "+model.module.stall_build=true", "sim.rank_timeout_s=100")
    r, w = _interrupt_when_running([sys.executable, str(script), *overrides], tmp_path, getattr(signal, sig), group=False)
    assert r.returncode != 0
    if sig == "SIGTERM":
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == "error: real run terminated (SIGTERM): its 2 ranks were ended"
        assert "Traceback" not in r.stderr
    else:
        assert r.stderr.strip().splitlines()[-1] == "KeyboardInterrupt: real run interrupted (SIGINT): its 2 ranks were ended"
    assert len(w.ranks()) == 2
    assert_gone(w.seen)
    assert leftovers(tmp_path) == []


OWN_HANDLER_DRIVER = """
import multiprocessing
import signal
import sys
from pathlib import Path
from harness.app.compose import compose
from harness.app.run import run

def own(signum, frame):
    Path(sys.argv[1]).write_text(f"ranks alive: {len(multiprocessing.active_children())}")
    raise SystemExit(3)

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, own)
    run(compose(sys.argv[2:]))
"""


def test_sigterm_goes_on_to_the_process_s_own_handler_once_every_rank_is_ended(tmp_path):
    """A process with a SIGTERM handler of its own: the launcher still ends every rank first,
    then hands the signal to that handler (which finds no rank alive and exits 3)."""
    script, proof = tmp_path / "driver.py", tmp_path / "handled"
    script.write_text(OWN_HANDLER_DRIVER)
    overrides = gated("algo=data_parallel", "+model.module.stall_rank=1", "+model.module.stall_build=true", "sim.rank_timeout_s=100")
    r, w = _interrupt_when_running([sys.executable, str(script), str(proof), *overrides], tmp_path, signal.SIGTERM, group=False)
    assert r.returncode == 3, r.stderr[-3000:]
    assert proof.read_text() == "ranks alive: 0"
    assert len(w.ranks()) == 2
    assert_gone(w.seen)
    assert leftovers(tmp_path) == []


def test_sigterm_to_the_command_ends_every_rank(tmp_path):
    """SIGTERM to ``python -m harness`` itself (not its group) in the middle of the steps: the
    job's runner gets it, its launcher ends every rank, error.json says so."""
    cmd = [sys.executable, "-m", "harness", *gated("algo=data_parallel", steps=1000000), f"hydra.run.dir={tmp_path / 'out'}"]
    r, w = _interrupt_when_running(cmd, tmp_path, signal.SIGTERM, group=False)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert len(w.ranks()) == 2
    assert_gone(w.seen)
    assert leftovers(tmp_path) == []
    assert "real run terminated (SIGTERM): its 2 ranks were ended" in (tmp_path / "out" / "error.json").read_text()


def test_ctrl_c_on_the_command_line_ends_every_rank(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the command's process group) in the middle of the steps.

    The command starts with SIGINT at its default action, as from a shell
    (:func:`_as_a_shell_starts_it`): run from a pytest started in the background it inherited
    an ignored SIGINT and never saw the signal."""
    cmd = [sys.executable, "-m", "harness", *gated("algo=data_parallel", steps=1000000), f"hydra.run.dir={tmp_path / 'out'}"]
    r, w = _interrupt_when_running(cmd, tmp_path, signal.SIGINT, group=True)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert len(w.ranks()) == 2
    assert_gone(w.seen)
    assert leftovers(tmp_path) == []
    assert "real run interrupted (SIGINT): its 2 ranks were ended" in (tmp_path / "out" / "error.json").read_text()


# ---------------------------------------------------------------------------- job directories, torchrun, devices
def test_a_prepared_job_directory_stays(tmp_path, scratch):
    plan, sim, cluster, costs = planned(gated("algo=data_parallel", "sim.launcher=prepare", f"sim.job_dir={tmp_path / 'job'}"))
    res = sim(plan.graph, plan.strategy, cluster, costs)
    assert res.extras["realrun_job_dir"] == str(tmp_path / "job") and (tmp_path / "job" / JOB_FILE).is_file()
    sim.job_dir = None  # prepared in a directory of its own: that one stays too, it is the result
    d = Path(sim(plan.graph, plan.strategy, cluster, costs).extras["realrun_job_dir"])
    assert d.parent == scratch and (d / JOB_FILE).is_file()


def test_running_a_rank_without_torchrun_says_how_to_start_it(tmp_path):
    """``python -m simulators.realrun [JOB_DIR]`` outside torchrun, or without the job's key: one line, status 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", KEY_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
    plan, sim, cluster, costs = planned(gated("algo=data_parallel", "sim.launcher=prepare", f"sim.job_dir={tmp_path / 'job'}"))
    key = sim(plan.graph, plan.strategy, cluster, costs).extras["realrun_job_key"]
    for args, extra, want in (([], {}, "torchrun --nproc-per-node N -m simulators.realrun JOB_DIR"),
                              ([str(tmp_path / "job")], {KEY_ENV: key},
                               f"torchrun --nproc-per-node 2 -m simulators.realrun {tmp_path / 'job'}"),
                              ([str(tmp_path / "job")], {}, f"{KEY_ENV} must carry (it is not set)"),
                              ([str(tmp_path / "job")], {KEY_ENV: new_key()}, "does not carry this run's seal"),
                              ([str(tmp_path)], {}, f"no job in {tmp_path}")):
        r = subprocess.run([sys.executable, "-m", "simulators.realrun", *args], cwd=REPO, env={**env, **extra}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == "", (args, r.stderr)
        assert r.stderr.startswith("error: ") and want in one_line(r.stderr), r.stderr


def test_a_gpu_cluster_is_not_measured_without_its_gpus(monkeypatch):
    """p100x4's plan on this machine: refused, naming the device and the ways out; forced, it runs."""
    if torch.cuda.device_count() >= 4:
        pytest.skip("this machine has the cluster's GPUs")
    from harness.app.run import run

    cfg = compose(["model=lenet5", "model.batch_size=8", "algo=round_robin", "cluster=p100x4", "sim=realrun", "output.gantt=false"])
    with pytest.raises(RealRunError) as e:
        run(cfg)
    msg = one_line(str(e.value))
    assert msg.startswith("cluster 'p100x4' is 4 x P100-SXM2-16GB but this machine has no GPU")
    assert msg.endswith("use cluster=cpu2 to measure this machine's CPU, or set sim.force=true to run it anyway")

    class Launched(Exception):
        pass

    def launched(*args: Any, **kwargs: Any) -> None:
        raise Launched

    monkeypatch.setattr("simulators.realrun.backend.launch", launched)
    with pytest.raises(Launched):
        run(compose(["model=lenet5", "model.batch_size=8", "algo=round_robin", "cluster=p100x4", "sim=realrun", "sim.force=true",
                     "output.gantt=false"]))
    # a cluster of CPUs runs on this machine's cores, as meant
    job, sim, cluster = prepared(["model=lenet5", "model.batch_size=8", "algo=round_robin", "cluster=cpu2", "sim=realrun"])
    sim.check_devices(job, cluster)


def test_a_rank_that_computes_is_not_stalled_and_one_that_sleeps_is(tmp_path):
    """Without a word on the board, a rank that is busy on its core (a long op, a slow first
    step) is working; one blocked in an op uses no CPU and stalls the run."""
    from simulators.realrun import Watchdog

    job = Job(1, "placement", "gloo", "cpu", 1, 1, 2, 0, None, None, [], [], rank_timeout_s=0.6)
    for code, stalls in (("while True: pass", False), ("import time; time.sleep(60)", True)):
        wd = Watchdog(tmp_path / "board", [job])
        (tmp_path / "board").write_bytes(np.array([_row(P_STEP)], dtype=np.int64).tobytes())
        p = subprocess.Popen([sys.executable, "-c", code])
        try:
            end, raised = time.monotonic() + 2.0, None
            while time.monotonic() < end and raised is None:
                try:
                    wd.check([p.pid])
                except RealRunError as e:
                    raised = str(e)
                time.sleep(0.1)
        finally:
            p.kill()
            p.wait()
        assert (raised is not None) == stalls, raised
        if stalls:
            assert raised.startswith("real run stalled: rank 0 stopped responding") and "rank 0 was running its ops in step 0" in raised
