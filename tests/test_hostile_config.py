"""Issue 32, the config: every key declared, at every level, and every value of the right type
and in a range the simulator can represent - a misspelt, wrong-typed or impossible key is one
line naming it (with the nearest key it could have meant), before any work; names that become
directory names never leave the output root.

Mostly in-process (compose, check_config, build_cluster, the error line of ``describe``); a few
cases through ``python -m harness`` as a user runs it.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from harness.app.compose import compose
from harness.app.config_checks import check_config
from harness.app.jobs import describe, path_safe
from harness.core.cluster import ClusterError, build_cluster, device_spec
from harness.core.errors import ConfigError
from harness.core.models import ModelConfigError, SyntheticGraph
from harness.app.run import build
from tests.helpers import DEVICE, refused, run_harness

TINY = ("model=synthetic", "model.nodes=50", "algo=single_device", "output.gantt=false", "output.trace=false", "output.quiet=true")
SWITCH = {"topology": "switch", "cls": "nvlink", "bw_GBps": 10.0, "lat_us": 5.0}


# ---------------------------------------------------------------------------- 1. the top-level config
def test_the_default_config_and_its_documented_values_pass():
    check_config(compose([]))
    check_config(compose(["seed=7", "precision=amp_bf16", "resume=false", "graph.granularity=core_aten", "graph.optimizer=none",
                          "graph.batch_probe=false", "output.trace_max_tasks=null", "output.worth=false"]))


@pytest.mark.parametrize("overrides, fragment", [
    (["+foo=bar"], "foo is not a key of the config: the config takes model, cluster, algo, costs, sim, seed"),
    (["+modle.name=x"], "modle is not a key of the config: did you mean model?"),
    (["+foo/bar=baz"], "foo/bar is not a config group: the groups are algo, cluster, cluster/device, costs"),
    (["+cluster/devic=p100_sxm2"], "cluster/devic is not a config group: did you mean cluster/device?"),
    (["+graph.fuse=true"], "graph.fuse is not a key of graph: graph takes granularity, optimizer"),
    (["+graph.probe=false"], "graph.probe is not a key of graph: did you mean graph.batch_probe?"),
    (["+output.trace_max=-5"], "output.trace_max is not a key of output: did you mean output.trace_max_tasks?"),
    (["seed=1.5"], "seed must be an integer >= 0, got 1.5"),
    (["seed=abc"], "seed must be an integer >= 0, got 'abc'"),
    (["seed=-1"], "seed must be an integer >= 0, got -1"),
    (["seed=true"], "seed must be an integer >= 0, got True"),
    (["precision=fp8"], "precision must be one of fp32, tf32"),
    (["resume=maybe"], "resume must be true or false, got 'maybe'"),
    (["debug=1"], "debug must be true or false, got 1"),
    (["graph.batch_probe=maybe"], "graph.batch_probe must be true or false, got 'maybe'"),
    (["graph.batch_probe=1"], "graph.batch_probe must be true or false, got 1"),
    (["graph.granularity=fine"], "graph.granularity must be one of aten, core_aten, layer"),
    (["graph.optimizer=adam"], "graph.optimizer must be one of sgd, none"),
    (["graph.cache=yes"], "graph.cache must be true or false"),
    (["output.trace_max_tasks=-5"], "output.trace_max_tasks must be an integer >= 1, got -5"),
    (["output.trace_max_tasks=0"], "output.trace_max_tasks must be an integer >= 1, got 0"),
    (["output.trace_max_tasks=2.5"], "output.trace_max_tasks must be an integer >= 1, got 2.5"),
    (["output.gantt=sometimes"], "output.gantt must be true or false"),
    (["graph=5"], "graph must be a block of granularity"),
])
def test_a_top_level_key_is_declared_and_checked(overrides: list[str], fragment: str) -> None:
    refused(lambda: check_config(compose(overrides)), fragment, kind=ConfigError)


def test_a_group_must_be_a_block():
    cfg = compose([])
    cfg_dict: dict[str, Any] = {**{k: v for k, v in cfg.items()}, "sim": "fast"}
    refused(lambda: check_config(cfg_dict), "sim must be a config block (sim=NAME picks a file of conf/sim/), got 'fast'", kind=ConfigError)


def test_run_checks_the_config_before_any_work():
    """harness.app.run refuses the config before it builds anything (no model is captured)."""
    from harness.app.run import run

    refused(lambda: run(compose(["model=lenet5", "+graph.fuse=true"])), "graph.fuse is not a key of graph", kind=ConfigError)


def _hydra_error(*overrides: str) -> str:
    with pytest.raises(Exception) as info:
        compose(list(overrides))
    line, mistake = describe(info.value)
    assert mistake, line
    return line


@pytest.mark.parametrize("override, wanted, plus", [
    ("model.batchsize=4", "model.batchsize is not a key of model: did you mean model.batch_size?", "+model.batchsize=4"),
    ("cluster.intra.bandwith=3", "cluster.intra.bandwith is not a key of cluster.intra:", "+cluster.intra.bandwith=3"),
    ("graph.fuse=true", "graph.fuse is not a key of graph: graph takes granularity", None),
    ("modle=lenet5", "modle is not a key of the config: did you mean model?", None),
    ("cluster/devic=p100_sxm2", "cluster/devic is not a config group: did you mean cluster/device?", None),
])
def test_hydra_refusal_of_a_key_says_which_key_was_meant(override: str, wanted: str, plus: str | None) -> None:
    """Hydra's "Key 'batchsize' is not in struct" becomes one line with the nearest key; a
    component's block (which may take keys its file does not set) also says how to add one,
    the harness's own blocks do not (they take no other key)."""
    line = _hydra_error(override)
    assert line.startswith(wanted) and "\n" not in line, line
    assert (plus in line) if plus else ("+" not in line), line


# ---------------------------------------------------------------------------- 2. cluster keys at every level
@pytest.mark.parametrize("kw, fragment", [
    ({"intra": {**SWITCH, "bandwith": 3}}, "cluster.intra.bandwith is not a key of cluster.intra: did you mean cluster.intra.bw_GBps?"),
    ({"intra": {**SWITCH, "latency": 3}}, "did you mean cluster.intra.lat_us?"),
    ({"intra": {**SWITCH, "gpus_per_switch": 2}}, "cluster.intra.gpus_per_switch is not a key of cluster.intra"),
    ({"intra": {"topology": "pcie_tree", "bw_GBps": 16, "uplink": {"bw_GBps": 16, "lat_us": 1}}},
     "cluster.intra.uplink.lat_us is not a key of cluster.intra.uplink"),
    ({"intra": {"topology": "pcie_tree", "bw_GBps": 16, "sockets": 2, "gpus_per_switch": 1, "qpi": {"bw": 9}}},
     "cluster.intra.qpi.bw is not a key of cluster.intra.qpi: did you mean cluster.intra.qpi.bw_GBps?"),
    ({"intra": {"topology": "nvlink_mesh", "link_GBps": 25, "pairs": [[0, 1, 1]], "bw_GBps": 3}},
     "cluster.intra.bw_GBps is not a key of cluster.intra"),
    ({"intra": {"topology": "nvlink_mesh", "link_GBps": 25, "pairs": [[0, 1, 1]], "fallback": {**SWITCH, "lat": 1}}},
     "cluster.intra.fallback.lat is not a key of cluster.intra.fallback: did you mean cluster.intra.fallback.lat_us?"),
    ({"intra": "fast"}, "cluster.intra must be a mapping"),
    ({"nodes": 2, "inter": {"bw_gbps": 100, "nics": 2}}, "cluster.inter.nics is not a key of cluster.inter: did you mean cluster.inter.nics_per_node?"),
    ({"nodes": 2, "inter": {"bw_gbps": 100}, "host_link": {"bw_GBps": 16, "lat_usec": 1}},
     "cluster.host_link.lat_usec is not a key of cluster.host_link: did you mean cluster.host_link.lat_us?"),
    ({"nodes": 2, "inter": 100}, "cluster.inter must be a mapping"),
    ({"collective": {"lat_us": 1, "bw_GBps": 1, "bw": 2}}, "cluster.collective.bw is not a key of cluster.collective: did you mean"),
    ({"host_comm": {"copy_GBps": 1, "per_msg_us": 1}},
     "cluster.host_comm.per_msg_us is not a key of cluster.host_comm: did you mean cluster.host_comm.per_message_us?"),
    ({"colective": {"lat_us": 1, "bw_GBps": 1}}, "cluster.colective is not a cluster key: did you mean cluster.collective?"),
    ({"gpu": 4}, "cluster.gpu is not a cluster key: did you mean cluster.gpus?"),
])
def test_every_cluster_block_refuses_an_unknown_key_naming_it(kw: dict[str, Any], fragment: str) -> None:
    args = {"gpus": 2, "intra": SWITCH, **kw}
    refused(lambda: build_cluster("x", DEVICE, **args), fragment, kind=ClusterError)


@pytest.mark.parametrize("spec, fragment", [
    ({**DEVICE, "mem_gib": 16}, "cluster.device.mem_gib is not a device key: did you mean cluster.device.mem_GiB?"),
    ({**DEVICE, "peak": 10}, "cluster.device.peak is not a device key: did you mean cluster.device.peak_tflops?"),
    ({**DEVICE, "peak_tflops": {"float32": 10, "fp16": 20}}, "cluster.device.peak_tflops.fp16 is not a math mode"),
    ({**DEVICE, "peak_tflops": {"float32": 10, "bfloat": 20}}, "did you mean cluster.device.peak_tflops.bfloat16?"),
    ("p100", "cluster.device must be a mapping"),
])
def test_a_device_refuses_an_unknown_key_naming_it(spec: Any, fragment: str) -> None:
    refused(lambda: device_spec(spec), fragment, kind=ClusterError)


def test_a_misspelt_nested_key_on_the_command_line_is_refused():
    refused(lambda: build(compose(["cluster=p100x4", "+cluster.intra.bandwith=3"])), "cluster.intra.bandwith", "cluster.intra.bw_GBps",
            kind=ClusterError)
    refused(lambda: build(compose(["cluster=dgx1_v100", "+cluster.intra.fallback.qpi.latency=3"])),
            "cluster.intra.fallback.qpi.latency is not a key", "did you mean cluster.intra.fallback.qpi.lat_us?", kind=ClusterError)


# ---------------------------------------------------------------------------- 3. figures the simulator can represent
@pytest.mark.parametrize("kw, fragment", [
    ({"intra": {**SWITCH, "bw_GBps": 1e-310}}, "cluster.intra.bw_GBps must be between 1e-06 and 1e+09 GB/s"),
    ({"intra": {**SWITCH, "bw_GBps": 1e300}}, "cluster.intra.bw_GBps must be between"),
    ({"intra": {**SWITCH, "lat_us": 1e300}}, "cluster.intra.lat_us must be between 0 and 1e+09 us"),
    ({"intra": {"topology": "switch", "bw_gbps": 5e-320}}, "cluster.intra.bw_gbps must be between 8e-06 and 8e+09 Gb/s"),
    ({"nodes": 2, "inter": {"bw_gbps": 1e-300}}, "cluster.inter.bw_gbps must be between"),
    ({"collective": {"lat_us": 1, "bw_GBps": 1e-300}}, "cluster.collective.bw_GBps must be between"),
    ({"host_comm": {"copy_GBps": 1, "send_tau_us": 1e-300}}, "cluster.host_comm.send_tau_us must be between"),
])
def test_a_figure_outside_its_plausible_range_is_refused(kw: dict[str, Any], fragment: str) -> None:
    """A subnormal bandwidth or an astronomic latency would make a simulated time infinite (and
    the Gantt chart's axis limits with it): refused at the cluster, naming the key and the range."""
    args = {"gpus": 2, "intra": SWITCH, **kw}
    refused(lambda: build_cluster("x", DEVICE, **args), fragment, kind=ClusterError)


@pytest.mark.parametrize("key, value, fragment", [
    ("peak_tflops", 1e-300, "cluster.device.peak_tflops must be between 1e-09 and 1e+09 TFLOP/s"),
    ("peak_tflops", {"float32": 10, "float16": 1e-310}, "cluster.device.peak_tflops.float16 must be between"),
    ("mem_bw_GBps", 1e-310, "cluster.device.mem_bw_GBps must be between"),
    ("mem_GiB", 1e30, "cluster.device.mem_GiB must be between 1e-06 and 1e+06 GiB"),
])
def test_a_device_figure_outside_its_range_is_refused(key: str, value: Any, fragment: str) -> None:
    refused(lambda: device_spec({**DEVICE, key: value}), fragment, kind=ClusterError)


def test_the_range_edges_are_figures_the_simulation_keeps_finite():
    """At the edges of the ranges, a gigabyte over the slowest link and a teraflop on the slowest
    device still take a finite time."""
    from harness.core.topology import RANGES

    slow = build_cluster("x", {**DEVICE, "peak_tflops": RANGES["tflops"][0]}, gpus=2,
                         intra={**SWITCH, "bw_GBps": RANGES["GBps"][0], "lat_us": RANGES["us"][1]})
    assert math.isfinite(1e9 / slow.route_bw[0, 1] + slow.route_lat[0, 1])
    assert math.isfinite(1e12 / slow.devices[0].spec.peak())


def _peak_bytes(fn: Any) -> int:
    """The most memory Python allocated while ``fn`` ran (and raised)."""
    tracemalloc.start()
    try:
        with pytest.raises(Exception):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_cluster_too_large_to_represent_is_refused_before_allocating():
    fn = lambda: build_cluster("x", DEVICE, gpus=8, nodes=100_000, intra=SWITCH)  # noqa: E731
    refused(fn, "cluster.gpus x cluster.nodes = 800000 devices is more than the simulator represents", "at most 131072 devices", kind=ClusterError)
    assert _peak_bytes(fn) < 10 * 2**20
    assert build_cluster("x", DEVICE, gpus=8, nodes=8, intra=SWITCH, inter={"bw_gbps": 100}).num_devices == 64


def test_a_synthetic_graph_too_large_to_generate_is_refused_before_allocating():
    for kw in ({"nodes": 10**9}, {"nodes": 10**6, "degree": 1e6}):
        fn = lambda kw=kw: SyntheticGraph(**kw)  # noqa: E731
        refused(fn, "GiB to generate; the limit is 4 GiB", kind=ModelConfigError)
        assert _peak_bytes(fn) < 10 * 2**20
    assert SyntheticGraph(nodes=2000, width=1, seed=1).op_graph().num_nodes == 2000  # one node per layer


@pytest.mark.parametrize("kw", [{"gflops": 1e300}, {"ref_tflops": 1e-300}, {"ccr": 1e300}, {"ref_bw_GBps": 1e300}])
def test_synthetic_figures_whose_bytes_overflow_are_refused(kw: dict[str, float]) -> None:
    """Edge sizes are int64 counts: figures whose product overflows them (or the FLOPs) are refused,
    not cast to a wrapped-around count."""
    refused(lambda: SyntheticGraph(nodes=50, **kw), "more than a count of bytes holds (2^62)", kind=ModelConfigError)


# ---------------------------------------------------------------------------- 4. names that become directories
@pytest.mark.parametrize("name, safe", [
    ("resnet50", "resnet50"), ("gpus8_nodes1", "gpus8_nodes1"), ("synthetic_n50_ccr1.0", "synthetic_n50_ccr1.0"),
    ("../../etc", "____etc"), ("..", "_"), ("a/b", "a_b"), (".hidden", "_hidden"), ("", "_"), ("x" * 300, "x" * 64),
])
def test_a_name_in_a_directory_name_stays_one_component(name: str, safe: str) -> None:
    assert path_safe(name) == safe
    assert "/" not in path_safe(name) and ".." not in path_safe(name) and not path_safe(name).startswith(".")


def test_a_model_name_with_dots_and_slashes_stays_under_the_output_root(tmp_path: Path) -> None:
    """A single run (outputs/<date>/<time>_<names>) and a sweep job (<sweep dir>/<names>) whose
    model.name climbs out write inside their roots."""
    single = run_harness(*TINY, "model.name=../../../escaped", cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    sweep = run_harness("-m", "hydra/launcher=basic", *TINY, "model.name=../../escaped_too", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                        cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    results = sorted(tmp_path.rglob("result.json"))
    assert sorted(json.loads(r.read_text())["model"] for r in results) == ["../../../escaped", "../../escaped_too"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs", "sweep"]
    single_dir, sweep_dir = sorted((r.parent for r in results), key=lambda d: "sweep" in d.parts)
    assert single_dir.parent.parent == tmp_path / "outputs" and sweep_dir.parent == tmp_path / "sweep"
    assert not list(tmp_path.parent.glob("*escaped*"))


# ---------------------------------------------------------------------------- 5. through the command line
@pytest.mark.parametrize("overrides, line", [
    (["model.batchsize=4"], "error: model.batchsize is not a key of model: did you mean model.batch_size?"),
    (["+cluster.intra.bandwith=3", "cluster=p100x4"],
     "error: cluster.intra.bandwith is not a key of cluster.intra: did you mean cluster.intra.bw_GBps?"),
    (["+foo=bar"], "error: foo is not a key of the config"),
    (["seed=1.5"], "error: seed must be an integer >= 0, got 1.5"),
    (["sim.order=bogus"], "error: sim.order must be one of"),
    (["cluster.gpus=100000"], "error: cluster.gpus = 100000 devices per node is more than the simulator represents"),
    (["cluster=superpod_a100", "cluster.nodes=400"],
     "error: cluster.gpus x cluster.nodes = 3200 devices is more than an operator or layer graph's simulation represents"),
    (["cluster.intra.bw_GBps=1e-310", "cluster=p100x4"], "error: cluster.intra.bw_GBps must be between"),
])
def test_the_command_line_names_the_key_in_one_line(tmp_path: Path, overrides: list[str], line: str) -> None:
    r = run_harness(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(line), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "result.json").exists()


def test_a_config_dir_file_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "broken.yaml").write_text("_target_: harness.core.models.SyntheticGraph\nnodes: [1, 2\n")
    r = run_harness("--config-dir", str(conf), "model=broken", f"hydra.run.dir={tmp_path / 'run'}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: {conf / 'model' / 'broken.yaml'} is not valid YAML (line 3, column 1):"), lines[0]
