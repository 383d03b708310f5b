"""The operator profiler, the profiled cost model and the CPU calibration helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from harness.core.cluster import build_cluster
from harness.core.costs import AnalyticalCostModel
from harness.core.fingerprint import graph_fingerprint
from simulators.realrun.execgraph import ExecGraph, initial_state
from harness.core.models import TorchModel
from harness.app.profile import COLUMNS, profile_model, signature
from harness.core import machine
from harness.core.errors import ProfileError
from harness.core.machine import device_name
from harness.core.profiled import PROFILE_ROOT, ProfiledCostModel, slug

REPO = Path(__file__).resolve().parents[1]


class Tiny(nn.Module):
    """conv, batch norm (mutates its buffers), two equal linear layers (a repeated signature)."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc1 = nn.Linear(width * 8 * 8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.out(torch.tanh(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(h)))))))


def tiny(batch: int = 8, width: int = 4) -> TorchModel:
    return TorchModel("tiny", {"_target_": "tests.test_profile.Tiny", "width": width}, batch, [{"shape": [3, 8, 8]}],
                      {"shape": [], "dtype": "int64", "high": 10})


KIND = device_name("cpu", 1)


def cluster(kind: str = KIND):
    return build_cluster("c", {"kind": kind, "peak_tflops": 0.05, "mem_bw_GBps": 5, "mem_GiB": 4}, gpus=2,
                         intra={"topology": "mesh", "cls": "loopback", "bw_GBps": 1.0, "lat_us": 50})


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    files = profile_model(tiny(), batch_sizes=[4, 8], warmup=1, reps=2, out_dir=out, progress=False)
    return out, files


def test_profile_file_has_a_row_per_batch_and_node(profiled):
    out, files = profiled
    assert len(files) == 1 and files[0].suffix == ".parquet" and files[0].parent == out
    df = pd.read_parquet(files[0])
    assert list(df.columns) == COLUMNS
    n = tiny().op_graph().num_nodes
    assert len(df) == 2 * n and sorted(df["batch_size"].unique()) == [4, 8]
    for b, part in df.groupby("batch_size"):
        assert part["node"].tolist() == list(range(n))
    kern = df[~df["free"]]
    assert (kern["time_s"] > 0).all() and (kern["reps"] >= 1).all()
    # environment: one device, one thread count, the CPU model, never a host name
    assert df["device_name"].nunique() == 1 and df["device_name"].iloc[0] == KIND and (df["threads"] == 1).all()
    assert df["torch_version"].iloc[0] == torch.__version__ and df["mem_kind"].iloc[0] == "cpu_output_bytes"
    assert os.uname().nodename not in " ".join(df[["device_name", "cpu_model"]].iloc[0])
    # the graph fingerprint does not depend on the batch size
    assert df["graph_fp"].nunique() == 1 and df["graph_fp"].iloc[0] == graph_fingerprint(tiny(8).op_graph())


def test_repeated_signatures_are_timed_once(profiled):
    df = pd.read_parquet(profiled[1][0])
    b8 = df[df["batch_size"] == 8].set_index("node")
    dups = b8[b8["dedup_of"] >= 0]
    assert len(dups) > 0  # fc2 and fc3 (and their backward) have one signature
    for node, row in dups.iterrows():
        first = b8.loc[row["dedup_of"]]
        assert row["signature"] == first["signature"] and row["time_s"] == first["time_s"]
    assert b8.loc[b8["dedup_of"] < 0, "signature"].is_unique


def test_mutating_ops_are_timed_on_copies():
    """BatchNorm's num_batches_tracked += 1 runs once for real, not once per repetition."""
    src = tiny(4)
    g = src.op_graph(keep_fx=True)
    eg = ExecGraph.from_graph(g)
    ph = initial_state(src, eg, 0)
    j = next(k for k, p in enumerate(eg.placeholders) if p.name.endswith("num_batches_tracked"))
    before = int(ph[j])
    from harness.app.profile import profile_graph

    profile_graph(eg, ph, torch.device("cpu"), warmup=2, reps=3, max_op_s=1.0, bar=None)
    assert int(ph[j]) == before + 1


def test_signature_names_shapes_strides_and_arguments():
    a = torch.zeros(2, 3)
    s1 = signature("aten.add.Tensor", (a, a.t().contiguous().t()), {})
    s2 = signature("aten.add.Tensor", (a, a), {"alpha": 2})
    assert "T(2, 3):float32:(3, 1)" in s1 and "(1, 2)" in s1 and "alpha=2" in s2 and s1 != s2


def test_profiled_costs_interpolate_in_batch_size(profiled):
    out, files = profiled
    df = pd.read_parquet(files[0])
    costs = ProfiledCostModel(cluster(), profiles={KIND: str(out)})
    t = {b: df[df["batch_size"] == b].sort_values("node")["time_s"].to_numpy() for b in (4, 8)}
    g8 = tiny(8).op_graph()
    np.testing.assert_allclose(costs.node_times(g8, 0), np.maximum(t[8], costs._parts_for(g8, KIND).floor))
    # half of batch 8 is batch 4; batch 6 is half-way
    np.testing.assert_allclose(costs.node_times(g8, 1, 0.5), np.maximum(t[4], costs._parts_for(g8, KIND).floor))
    g6 = tiny(6).op_graph()
    mid = np.maximum((t[4] + t[8]) / 2, costs._parts_for(g6, KIND).floor)
    np.testing.assert_allclose(costs.node_times(g6, 0), mid)
    rep = costs.report()
    assert rep["fallback_nodes"] == 0 and costs.fallback_count == 0
    assert rep["by_kind"][KIND]["by_node"] == g6.num_nodes and rep["by_kind"][KIND]["profiled_batches"] == [4, 8]
    # extrapolation below the profiled batches never goes under the floor
    assert (costs.node_times(g8, 0, 0.125) >= costs._parts_for(g8, KIND).floor - 1e-15).all()
    # transfers and all-reduce are the analytical (alpha-beta) ones
    ana = AnalyticalCostModel(costs.cluster)
    assert costs.transfer_time(1e6, 0, 1) == ana.transfer_time(1e6, 0, 1) and costs.allreduce_time(1e6, [0, 1]) == ana.allreduce_time(1e6, [0, 1])


def test_unprofiled_ops_fall_back_and_are_counted(profiled):
    out, _ = profiled
    costs = ProfiledCostModel(cluster(), profiles={KIND: str(out)})
    other = tiny(8, width=6).op_graph()  # another conv width: another fingerprint
    t = costs.node_times(other, 0)
    rep = costs.report()["by_kind"][KIND]
    assert rep["by_node"] == 0 and rep["by_key"] > 0 and rep["fallback_nodes"] > 0 and costs.fallback_count == rep["fallback_nodes"]
    assert "aten.convolution.default" in rep["fallback_targets"]
    ana = AnalyticalCostModel(costs.cluster).node_times(other, 0)
    fb = costs._parts_for(other, KIND).source == 2
    np.testing.assert_allclose(t[fb], ana[fb])
    # a device kind without profiles: everything falls back
    bare = ProfiledCostModel(cluster("NoSuchDevice"), profile_dir=str(out))
    np.testing.assert_allclose(bare.node_times(other, 0), AnalyticalCostModel(bare.cluster).node_times(other, 0))
    assert bare.fallback_count == int((~other.free).sum())


def test_free_ops_zero_and_layer_granularity(tmp_path):
    files = profile_model(tiny(), batch_sizes=[4], warmup=0, reps=1, out_dir=tmp_path, granularity="layer", progress=False)
    df = pd.read_parquet(files[0])
    g = tiny(4).op_graph(granularity="layer")
    assert len(df) == g.num_nodes and df["name"].tolist() == g.names
    costs = ProfiledCostModel(cluster(), profiles={KIND: str(tmp_path)}, free_ops="zero")
    t = costs.node_times(g, 0)
    assert costs.report()["by_kind"][KIND]["by_node"] == g.num_nodes and (t[g.free] == 0).all() and (t[~g.free] > 0).all()


def test_profiled_costs_plug_into_the_config(profiled):
    from harness.app.compose import compose
    from harness.app.run import build

    out, _ = profiled
    cfg = compose(["costs=profiled", f"costs.profile_dir={out.parent}", "cluster=cpu2", machine.cpu_kind_override(), "model=lenet5"])
    _, cl, costs, _, _ = build(cfg)
    assert isinstance(costs, ProfiledCostModel) and costs.profile_path(cl.devices[0].spec.kind) == out.parent / slug(cl.devices[0].spec.kind)


def test_a_profile_is_used_only_on_the_cpu_that_measured_it(profiled, monkeypatch):
    """A CPU device kind names the CPU its figures and profiles come from: on another CPU
    costs=profiled ends in one line that says what to run here, even with the profiles given;
    on that CPU they are read."""
    from tests.helpers import refused

    out, _ = profiled
    ok = ProfiledCostModel(cluster(), profiles={KIND: str(out)})
    assert ok.node_times(tiny(8).op_graph(), 0).sum() > 0 and ok.fallback_count == 0
    monkeypatch.setattr(machine, "cpu_model", lambda: "Some Other CPU @ 9.9GHz")
    assert machine.foreign_cpu(KIND) == "Some Other CPU @ 9.9GHz (1 thread)" and machine.foreign_cpu("V100-SXM2-16GB") is None
    for kw in ({"profiles": {KIND: str(out)}}, {"profile_dir": str(out.parent)}, {}):
        refused(lambda: ProfiledCostModel(cluster(), **kw), f"kind {KIND!r}", "another CPU than this machine's 'Some Other CPU @ 9.9GHz (1 thread)'",
                "python -m harness.calibrate --threads 1 --write", "python -m harness.profile device=cpu threads=1", kind=ProfileError)
    # this (fake) CPU, calibrated: its profiles are read
    mine = ProfiledCostModel(cluster("Some Other CPU @ 9.9GHz (1 thread)"), profiles={"Some Other CPU @ 9.9GHz (1 thread)": str(out)})
    assert mine.node_times(tiny(8).op_graph(), 0).sum() > 0 and mine.fallback_count == 0
    # the repository's profiles hold none of this CPU: say what to run rather than fall back
    refused(lambda: ProfiledCostModel(cluster("Some Other CPU @ 9.9GHz (1 thread)")), "no profile of this machine's CPU",
            str(PROFILE_ROOT / "some-other-cpu-9-9ghz-1-thread"), "python -m harness.profile device=cpu threads=1", kind=ProfileError)
    # a GPU kind is no CPU of this machine's: an explicit directory without its profiles falls back, counted
    gpu = ProfiledCostModel(cluster("V100-SXM2-16GB"), profile_dir=str(out))
    g = tiny(8).op_graph()
    gpu.node_times(g, 0)
    assert gpu.fallback_count == int((~g.free).sum())


def test_committed_profiles_are_read_on_the_cpu_that_measured_them(monkeypatch):
    """cluster=cpu2 with the repository's profiles, on the CPU cpu2 was calibrated on (faked
    here): lenet5's committed profile answers every kernel."""
    from harness.app.compose import compose
    from harness.app.run import build

    kind = build(compose(["model=lenet5", "cluster=cpu2"]))[1].devices[0].spec.kind
    if not (PROFILE_ROOT / slug(kind)).is_dir():
        pytest.skip(f"no committed profile of cpu2's CPU {kind!r}")
    monkeypatch.setattr(machine, "cpu_model", lambda: machine.CPU_KIND.match(kind).group("model"))
    cfg = compose(["model=lenet5", "cluster=cpu2", "costs=profiled"])
    source, _, costs, _, _ = build(cfg)
    g = source.op_graph(**cfg.graph)
    assert costs.node_times(g, 0).sum() > 0 and costs.report()["by_kind"][kind]["fallback_nodes"] == 0


def test_profiled_costs_on_another_cpu_are_one_line_at_the_command_line(tmp_path):
    from tests.helpers import run_harness

    r = run_harness("model=lenet5", "cluster=cpu2", "costs=profiled", "cluster.device.kind='No Such CPU (1 thread)'",
                    f"hydra.run.dir={tmp_path}")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "'No Such CPU (1 thread)', another CPU than this machine's" in err[0]
    assert "python -m harness.calibrate --threads 1 --write" in err[0] and not list(tmp_path.rglob("result.json"))


def test_profile_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness.profile", "model=lenet5", "batch_sizes=[2,4]", "reps=1", "warmup=0",
                        f"out_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    files = list(tmp_path.glob("lenet5_aten_*.parquet"))
    assert len(files) == 1 and "batch 4:" in r.stdout
    assert sorted(pd.read_parquet(files[0])["batch_size"].unique()) == [2, 4]


def test_send_after_gap_fit_recovers_a_saturating_cost():
    """``fit_send_gap``: medians per gap fitted to hot + cold (1 - exp(-gap / tau)); a flat
    sweep gives no cold part."""
    import math

    from harness.app.link_probes import SEND_GAPS, fit_send_gap

    curve = {str(g): [30e-6 + 200e-6 * (1 - math.exp(-g / 2e-3)) + d for d in (-1e-6, 0.0, 1e-6)] for g in SEND_GAPS}
    hot, cold, tau = fit_send_gap(curve)
    assert hot == pytest.approx(30e-6, rel=0.05) and cold == pytest.approx(200e-6, rel=0.05) and tau == pytest.approx(2e-3, rel=0.1)
    hot, cold, _ = fit_send_gap({str(g): [50e-6] for g in SEND_GAPS})
    assert hot == pytest.approx(50e-6) and cold == pytest.approx(0.0, abs=1e-9)


def test_calibration_yaml_builds_a_cluster():
    from hydra.utils import instantiate

    from harness.app.calibrate import cluster_yaml, device_yaml, gemm_flops

    assert gemm_flops(1, n=64, reps=2) > 0
    dev = yaml.safe_load(device_yaml(KIND, 5e10, 5e9, 4.0, 1, "today"))
    link = {"lat_s": 50e-6, "bw_Bps": 1e9, "coll_lat_s": 4e-4, "coll_bw_Bps": 2e9, "allreduce_s": {"65536": 3e-4},
            "msg_cpu_s": 8e-5, "copy_cpu_Bps": 4e9}
    clu = yaml.safe_load(cluster_yaml(link, 1, "today"))
    clu.pop("defaults")
    c = instantiate({**clu, "device": dev}, _convert_="all")
    assert c.num_devices == 2 and c.devices[0].spec.kind == KIND and abs(c.route_lat[0, 1] - 50e-6) < 1e-9
    assert c.meta["collective"] == {"lat_us": 400.0, "bw_GBps": 2.0} and c.meta["host_comm"] == {"per_message_us": 80.0, "copy_GBps": 4.0}
    # with the send-after-gap sweep: its fit goes into host_comm, its medians into the comment
    gaps = {"5e-05": [3e-5, 3.2e-5], "0.002": [1e-4], "0.02": [2.3e-4]}
    text = cluster_yaml({**link, "send_gap_s": gaps, "send_hot_s": 3e-5, "send_cold_s": 2e-4, "send_tau_s": 5e-3}, 1, "today")
    assert "0.05, 2, 20 ms of matmuls took (median) 31, 100, 230 us" in text
    assert yaml.safe_load(text)["host_comm"] == {"per_message_us": 80.0, "copy_GBps": 4.0, "send_cold_us": 200.0, "send_tau_us": 5000}
    # with the relay measurement: the recv_when: busy model's figure, the model itself left at its default
    text = cluster_yaml({**link, "recv_idle_s": 3e-5}, 1, "today")
    assert yaml.safe_load(text)["host_comm"] == {"per_message_us": 80.0, "copy_GBps": 4.0, "recv_idle_us": 30.0}
    assert "recv_when" not in yaml.safe_load(text)["host_comm"]
    assert "A receiver that waited for its message pays 30.0 us in the op after the wait" in text
    # with the receive-after-gap sweep: its fit goes into host_comm too, its medians into the comment
    text = cluster_yaml({**link, "recv_gap_s": {"5e-05": [8e-5], "0.005": [2.9e-4]}, "recv_hot_s": 8e-5, "recv_cold_s": 2.8e-4,
                         "recv_tau_s": 5e-3}, 1, "today")
    assert yaml.safe_load(text)["host_comm"] == {"per_message_us": 80.0, "copy_GBps": 4.0, "recv_cold_us": 280.0, "recv_tau_us": 5000}
    assert "computed 0.05, 5 ms of matmuls, then waited" in text and "took (median) 80, 290 us" in text
    # the per-message samples spread over the calibration: their range in the comment
    text = cluster_yaml({**link, "msg_cpu_samples_s": [5e-5, 1e-4, 8e-5]}, 1, "today")
    assert "(median of 3 samples spread over the calibration, 50-100 us)" in text
    # the committed cpu2 preset composes
    from harness.app.compose import compose

    cfg = compose(["cluster=cpu2"])
    assert instantiate(cfg.cluster, _convert_="all").num_devices == 2


def test_in_situ_mode_times_every_node_inside_whole_steps(tmp_path):
    files = profile_model(tiny(), batch_sizes=[4], warmup=1, reps=3, out_dir=tmp_path, mode="in_situ", progress=False)
    df = pd.read_parquet(files[0])
    assert (df["mode"] == "in_situ").all() and (df["reps"] == 3).all() and (df["dedup_of"] == -1).all()
    assert (df.loc[~df["free"], "time_s"] > 0).all()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_idle_spinners_run_at_idle_priority_on_their_cores_and_stop():
    from simulators.realrun.timing import IdleSpinners

    core = sorted(os.sched_getaffinity(0))[0]
    with IdleSpinners([core, core]) as sp:
        assert len(sp.procs) == 1  # one per distinct core
        proc = sp.procs[0]
        pid = proc.pid
        deadline = time.time() + 10
        while os.sched_getscheduler(pid) != os.SCHED_IDLE and time.time() < deadline:  # it lowers itself after starting
            time.sleep(0.02)
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert os.sched_getaffinity(pid) == {core}
    assert sp.procs == [] and proc.returncode is not None  # terminated and reaped on exit


_FAULTS = """
import resource, sys, torch
from simulators.realrun.timing import steady_malloc
applied = steady_malloc() if sys.argv[1] == "steady" else False
x = torch.randn(300_000)  # 1.2 MB: three of them freed together leave the heap's top above glibc's trim threshold
flt = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    a, b, c = x * 2, x + 1, x - 1; del a, b, c
f0 = flt()
for _ in range(50):
    a, b, c = x * 2, x + 1, x - 1; del a, b, c
print(applied, (flt() - f0) / 50)
"""


def _faults_per_step(how: str) -> tuple[bool, float]:
    r = subprocess.run([sys.executable, "-c", _FAULTS, how], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    applied, faults = r.stdout.split()
    return applied == "True", float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-fault counts and mallopt are glibc/Linux")
def test_steady_malloc_reuses_freed_buffers_without_page_faults():
    """glibc gives the freed buffers of a step back to the OS and faults them in again on the
    next step; after steady_malloc they stay in the process."""
    applied, steady = _faults_per_step("steady")
    if not applied:
        pytest.skip("this C library has no mallopt")
    _, default = _faults_per_step("default")
    if default < 10:
        pytest.skip(f"this C library keeps freed buffers by itself ({default} faults per step)")
    # (the heap may still grow once in a while, faulting in one buffer's pages: 6 per step at most seen)
    assert steady < 0.1 * default


def test_cpu_profiles_record_the_allocator_setting(tmp_path):
    files = profile_model(tiny(), batch_sizes=[4], warmup=1, reps=2, out_dir=tmp_path, progress=False, steady=False)
    assert (pd.read_parquet(files[0])["malloc"] == "default").all()
    files = profile_model(tiny(), batch_sizes=[4], warmup=1, reps=2, out_dir=tmp_path, progress=False)
    df = pd.read_parquet(files[0])
    from simulators.realrun.timing import steady_malloc

    assert set(df["malloc"]) == {"steady" if steady_malloc() else "default"} and "malloc" in COLUMNS
    assert set(df["batch_size"]) == {4} and df["node"].is_unique  # another environment: replaced, not merged


class _SlowRelease:
    """A node value whose release takes 30 ms."""

    def __init__(self, v: object) -> None:
        self.v = v

    def __del__(self) -> None:
        time.sleep(0.03)


def test_in_situ_cpu_times_charge_freeing_an_input_to_its_last_reader(monkeypatch):
    """A real run's rank frees a tensor right after its last reader: in situ, that reader pays it."""
    import simulators.realrun.timing as ht
    from simulators.realrun.execgraph import resolve

    src = tiny(batch=4)
    eg = ExecGraph.from_graph(src.op_graph(keep_fx=True))
    n = eg.num_nodes
    dead = ht.dead_inputs(eg)
    # a node with a single reader, which frees it (so it is not a graph output)
    reader, j = next((i, k) for i in range(n) for k in dead[i] if sum(r.index == k for c in range(n) for r in eg.refs(c) if r.kind == "n") == 1)
    real = resolve

    def unwrap(x: object) -> object:
        if isinstance(x, _SlowRelease):
            return x.v
        if isinstance(x, (list, tuple)):
            return type(x)(unwrap(v) for v in x)
        return x

    def patched(target: str):
        fn = real(target)
        return lambda *a, **k: fn(*unwrap(a), **{key: unwrap(v) for key, v in k.items()})

    orig_materialize = ht.materialize

    def materialize(x, vals, ph, device):  # hand node j's value to its reader inside a slow-to-release box
        if vals[j] is not None and not isinstance(vals[j], _SlowRelease):
            vals[j] = _SlowRelease(vals[j])
        return orig_materialize(x, vals, ph, device)

    monkeypatch.setattr(ht, "materialize", materialize)
    fns = [patched(ins.target) for ins in eg.instrs]
    ph = initial_state(src, eg, 0)
    ts = np.array([ht.in_situ_step(eg, ph, "cpu", dead, fns) for _ in range(3)])
    assert (ts[:, reader] >= 0.03).all()
    # no other op pays the release: each one's fastest step (a busy machine may stall any op once)
    others = np.delete(ts, reader, axis=1)
    assert (others.min(axis=0) < 0.03).all()


def test_drift_reports_windows_and_their_spread():
    from harness.app.calibrate import drift

    before = os.sched_getaffinity(0)
    d = drift(seconds=0.6, window_s=0.2, spin=False)
    assert 2 <= len(d["windows_s"]) <= 4 and all(t > 0 for t in d["windows_s"])
    w = d["windows_s"]
    assert d["spread"] == pytest.approx((max(w) - min(w)) / float(np.median(w))) and d["cv"] >= 0
    assert os.sched_getaffinity(0) == before  # the process is left as it was
