"""Hostile inputs to real runs (issue 32): every ``sim=realrun`` key checked in one line naming
it, a machine that lacks what ``sim.device`` / ``sim.backend`` ask for said in one line, a
``sim.job_dir`` of the user's never cleared of files a run did not write, and nothing read back
from a job directory (the job, the ranks' records) that a planted file could make run code.

The runs here are lenet5 on ``cpu2`` (2 gloo ranks, no warm-up, one step): a few seconds each.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.app.compose import compose
from harness.app.run import build
from simulators.realrun import Job, RealRun, RealRunError, launch, launch_many, read_results, write_job
from simulators.realrun.launcher import MARKER, job_directory
from simulators.realrun.sealed import JOB_FILE, RECORD_FILE, new_key, plain_unpickle, read_sealed, seal, write_sealed
from tests.helpers import refused, run_harness

LENET = ["model=lenet5", "model.batch_size=8", "algo=round_robin", "cluster=cpu2", "sim=realrun", "sim.warmup=0", "sim.steps=1",
         "output.gantt=false", "output.worth=false"]
GPU = torch.cuda.is_available()


def planned(*extra: str) -> tuple[Any, RealRun, Any, Any]:
    """The plan of lenet5 / round_robin on cpu2, its RealRun (bound to the model), cluster and cost model."""
    src, cluster, costs, algo, sim = build(compose([*LENET, *extra]))
    sim.bind(src, 0, {"granularity": "aten"})
    return algo.plan(src.op_graph(keep_fx=True), cluster, costs), sim, cluster, costs


def job_of(*extra: str) -> Job:
    plan, sim, cluster, _ = planned(*extra)
    return sim.prepare(plan.graph, plan.strategy, cluster.num_devices)


class Payload:
    """A pickle that, when loaded, creates the file it names: the proof that loading ran code."""

    def __init__(self, proof: Path) -> None:
        self.proof = proof

    def __reduce__(self) -> Any:
        return (Path.touch, (self.proof,))


# ---------------------------------------------------------------------------- the keys of conf/sim/realrun.yaml
@pytest.mark.parametrize("override,fragments", [
    ("sim.launcher=mpi", ("sim.launcher must be one of spawn, torchrun, prepare; got 'mpi'",)),
    ("sim.steps=0", ("sim.steps must be an integer >= 1, got 0",)),
    ("sim.steps=2.5", ("sim.steps must be an integer >= 1, got 2.5",)),
    ("sim.warmup=-1", ("sim.warmup must be an integer >= 0, got -1",)),
    ("sim.threads_per_rank=0", ("sim.threads_per_rank must be an integer >= 1, got 0",)),
    ("sim.backend=mpi", ("sim.backend must be one of auto, gloo, nccl; got 'mpi'",)),
    ("sim.device=tpu", ("sim.device must be one of auto, cpu, cuda; got 'tpu'",)),
    ("sim.order=fifo", ("sim.order must be one of strict, priority, ready; got 'fifo'",)),
    ("sim.timeout_s=nan", ("sim.timeout_s must be a finite number > 0",)),
    ("sim.timeout_s=-5", ("sim.timeout_s must be > 0, got -5",)),
    ("sim.rank_timeout_s=inf", ("sim.rank_timeout_s must be > 0 and below sim.timeout_s",)),
    ("sim.spin_idle=maybe", ("sim.spin_idle must be true or false, got 'maybe'",)),
    ("sim.trace=1", ("sim.trace must be true or false, got 1",)),
    ("sim.force=yes", ("sim.force must be true or false, got 'yes'",)),
    ("sim.job_dir=''", ("sim.job_dir must be a directory's path or null",)),
])
def test_a_bad_value_is_one_line_naming_its_key(override: str, fragments: tuple[str, ...]) -> None:
    refused(lambda: build(compose([*LENET, override])), *fragments, kind=RealRunError)


def test_an_unknown_key_is_one_line_naming_the_nearest() -> None:
    refused(lambda: RealRun(stepz=3), "sim.stepz is not a key of sim", "did you mean sim.steps?", kind=RealRunError)


def test_an_unknown_launcher_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    r = run_harness(*LENET, "sim.launcher=mpi", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == ["error: sim.launcher must be one of spawn, torchrun, prepare; got 'mpi'"]
    assert not (tmp_path / "result.json").exists()


def test_launch_refuses_a_launcher_that_does_not_launch() -> None:
    refused(lambda: launch_many([job_of()], "prepare"), "sim.launcher=prepare cannot launch a run here", kind=RealRunError)


# ---------------------------------------------------------------------------- what this machine lacks
@pytest.mark.skipif(GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_what_is_missing(tmp_path: Path) -> None:
    r = run_harness(*LENET, "sim.device=cuda", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sim.device=cuda: "), r.stderr
    assert "use sim.device=cpu (or auto), or run on a machine with GPUs" in lines[0]
    # a prepared job runs on other hosts: this one need not have their GPUs
    plan, sim, cluster, costs = planned("sim.device=cuda", "sim.launcher=prepare", f"sim.job_dir={tmp_path / 'job'}")
    assert (Path(sim(plan.graph, plan.strategy, cluster, costs).extras["realrun_job_dir"]) / JOB_FILE).is_file()


@pytest.mark.skipif(GPU, reason="this machine has a GPU")
def test_nccl_without_nccl_or_gpus_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    sim = RealRun(backend="nccl")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    refused(sim.check_environment, "sim.backend=nccl: this PyTorch build", "has no NCCL", "use sim.backend=gloo (or auto)",
            kind=RealRunError)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    refused(sim.check_environment, "sim.backend=nccl runs ranks on CUDA GPUs, and here they would be on CPU cores",
            "use sim.backend=gloo (or auto)", kind=RealRunError)
    refused(RealRun(backend="nccl", device="cpu").check_environment, "(sim.device=cpu)", kind=RealRunError)
    plan, sim, cluster, costs = planned("sim.backend=nccl")
    refused(lambda: sim(plan.graph, plan.strategy, cluster, costs), "sim.backend=nccl runs ranks on CUDA GPUs", kind=RealRunError)


# ---------------------------------------------------------------------------- sim.job_dir
def test_a_folder_of_the_users_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """The folder holds files named like a run's (rank0.pt, rank1.error...): none is touched."""
    mine = tmp_path / "mine"
    mine.mkdir()
    files = {"rank0.pt": b"my data", "rank1.error": b"my notes", "notes.md": b"# mine", "progress": b"my progress"}
    for name, data in files.items():
        (mine / name).write_bytes(data)
    plan, sim, cluster, costs = planned("sim.launcher=prepare", f"sim.job_dir={mine}")
    msg = str(refused(lambda: sim(plan.graph, plan.strategy, cluster, costs), f"sim.job_dir={mine} is not empty",
                      "is no real run's job directory", "leave sim.job_dir out", kind=RealRunError))
    assert "notes.md" in msg
    refused(lambda: launch(job_of(), job_dir=str(mine)), f"sim.job_dir={mine} is not empty", kind=RealRunError)
    assert {f.name: f.read_bytes() for f in mine.iterdir()} == files


def test_a_job_directory_is_reused_clearing_only_what_runs_wrote(tmp_path: Path) -> None:
    d = tmp_path / "new" / "job"
    assert job_directory(str(d)) == d and (d / MARKER).is_file()  # made, and marked
    (d / "rank0.sealed").write_bytes(b"an earlier run's record")
    (d / "rank3.error").write_text("an earlier run's failure")
    (d / "job1").mkdir()
    (d / "job1" / MARKER).write_text("")
    (d / "job1" / "rank0.sealed").write_bytes(b"")
    (d / "mine.txt").write_text("the user's")
    (d / "rank0.txt").write_text("the user's too")
    job_directory(str(d))
    assert sorted(f.name for f in d.iterdir()) == sorted([MARKER, "mine.txt", "rank0.txt"])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert job_directory(str(empty)) == empty and (empty / MARKER).is_file()
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused(lambda: job_directory(str(blocked / "job")), f"sim.job_dir={blocked / 'job'}: cannot use it", kind=RealRunError)


def test_a_run_in_a_named_job_directory_keeps_its_records_and_runs_again(tmp_path: Path) -> None:
    d = tmp_path / "job"
    job = job_of()
    for _ in range(2):
        m = launch(job, job_dir=str(d))
        assert m.step_time_s > 0 and len(m.step_s) == 1
        assert sorted(f.name for f in d.iterdir()) == sorted([MARKER, JOB_FILE, "rank0.sealed", "rank1.sealed"])


# ---------------------------------------------------------------------------- nothing read back runs code
def test_a_planted_job_is_refused_unread(tmp_path: Path) -> None:
    proof = tmp_path / "ran"
    key = new_key()
    planted = tmp_path / "planted"
    planted.write_bytes(pickle.dumps(Payload(proof)))  # a plain pickle
    refused(lambda: read_sealed(planted, key), "is not a sealed real-run file", "a pickle can run code", kind=RealRunError)
    planted.write_bytes(seal(Payload(proof), new_key()))  # sealed, but with another key
    refused(lambda: read_sealed(planted, key), "does not carry this run's seal", kind=RealRunError)
    blob = bytearray(seal({"rank": 0}, key))  # sealed with the key, then altered
    blob[-2] ^= 1
    planted.write_bytes(bytes(blob))
    refused(lambda: read_sealed(planted, key), "does not carry this run's seal", kind=RealRunError)
    assert not proof.exists()
    write_sealed(planted, {"rank": 0, "start": [1.0]}, key)
    assert read_sealed(planted, key) == {"rank": 0, "start": [1.0]}


def test_a_prepared_job_is_sealed_with_the_key_it_reports(tmp_path: Path) -> None:
    plan, sim, cluster, costs = planned("sim.launcher=prepare", f"sim.job_dir={tmp_path / 'job'}")
    extras = sim(plan.graph, plan.strategy, cluster, costs).extras
    job = read_sealed(tmp_path / "job" / JOB_FILE, extras["realrun_job_key"])
    assert isinstance(job, Job) and job.world == 2
    refused(lambda: read_sealed(tmp_path / "job" / JOB_FILE, new_key()), "does not carry this run's seal", kind=RealRunError)


def test_a_planted_rank_record_is_refused_unread(tmp_path: Path) -> None:
    proof = tmp_path / "ran"
    job = job_of()
    key = new_key()
    d = write_job(job, str(tmp_path / "job"), key)
    for r in range(job.world):
        (d / RECORD_FILE.format(rank=r)).write_bytes(seal(Payload(proof), new_key()))
    refused(lambda: read_results(job, d, "spawn", key), f"{d / 'rank0.sealed'} does not carry this run's seal", kind=RealRunError)
    assert not proof.exists()


def test_torch_error_files_are_read_as_plain_data(tmp_path: Path) -> None:
    """torch.multiprocessing's error files hold a pickled traceback string: read as plain data,
    a pickle that names a class or function is refused."""
    assert plain_unpickle(pickle.dumps("Traceback (most recent call last): ...")) == "Traceback (most recent call last): ..."
    proof = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError):
        plain_unpickle(pickle.dumps(Payload(proof)))
    assert not proof.exists()
