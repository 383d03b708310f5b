"""Issue 19, "validate what comes in, naming the key": every user mistake in a model, cluster,
cost-model, graph-file or strategy input is a :class:`harness.core.errors.UserError` raised when the
job is built (before anything is captured or simulated), whose one-line message names the
culprit (the config key as the user types it, the file and JSON position, the node, edge or
array) - tested mostly on ``harness.app.run.build`` and the constructors, and for a few cases
through ``python -m harness`` as a user runs it.

Hydra wraps an exception raised by a ``_target_`` in its ``InstantiationException``; the
UserError is its cause (:func:`user_error` finds it), which is what the command line reports.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.app.compose import compose
from harness.core.calibrated import CalibrationError, CalibratedCostModel
from harness.core.capture import CaptureError
from harness.core.cluster import ClusterError, build_cluster, device_spec
from harness.core.costs import AnalyticalCostModel, CostModelError
from harness.core.errors import UserError
from harness.core.graph import BATCHED, FORWARD, UPDATE, GraphError, OpGraph
from harness.core.models import GraphFile, ModelConfigError, SyntheticGraph, TorchModel
from harness.core.pase_costs import PaseCostModel
from harness.core.errors import ProfileError
from harness.core.profiled import ProfiledCostModel
from harness.app.run import build
from harness.core.strategy import ParallelConfig, Strategy, StrategyError
from tests.helpers import DEVICE, make_cluster, make_graph, refused

REPO = Path(__file__).resolve().parents[1]
MODELS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml") if p.stem != "from_file")  # from_file: below
INTRA = {"topology": "mesh", "cls": "nvlink", "bw_GBps": 10.0, "lat_us": 5.0}


def built(*overrides: str) -> Any:
    """``harness.app.run.build`` of the composed config: (source, cluster, costs, algo, sim)."""
    return build(compose(list(overrides)))


# ---------------------------------------------------------------------------- factories for model=custom
def needs_depth(depth: int, width: int = 8) -> nn.Module:
    """A factory with a required parameter."""
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def takes_anything(**kwargs: Any) -> nn.Module:
    """A factory that takes any keyword."""
    return nn.Linear(4, 4)


# ---------------------------------------------------------------------------- 1. model keys and batch size
@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds_with_its_declared_keys(model: str) -> None:
    if model == "hf":  # an optional extra (pip install -e '.[hf]'): tests/test_hf_models.py
        pytest.importorskip("transformers")
    extra = {"custom": ["model.module._target_=tests.test_capture.Tiny"],
             "built": ["model.fn=harness.core.zoo.pase_graphs.alexnet"]}.get(model, [])
    source = built(f"model={model}", *extra)[0]
    assert source.batch_size >= 1


@pytest.mark.parametrize("value, shown", [("2.5", "2.5"), ("null", "None"), ("abc", "'abc'"), ("0", "0"), ("-3", "-3")])
def test_batch_size_must_be_a_positive_integer(value: str, shown: str) -> None:
    refused(lambda: built("model=lenet5", f"model.batch_size={value}"), "model.batch_size must be an integer >= 1", f"got {shown}",
            kind=ModelConfigError)


TINY = {"name": "tiny", "module": {"_target_": "tests.test_capture.Tiny"}, "inputs": [{"shape": [3, 8, 8]}],
        "target": {"shape": [], "dtype": "int64", "high": 10}}


def whole_number(value: Any) -> int | None:
    """What a batch size of ``value`` is: the integer it writes (8, 8.0, "8"), else None."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return int(x) if math.isfinite(x) and x.is_integer() else None


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.integers(min_value=-10**6, max_value=10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=5), st.none()))
def test_batch_size_property(value: Any) -> None:
    """Every whole number >= 1 is taken as it is; anything else (2.5, 0, nan, "abc", None) is
    refused naming model.batch_size, never rounded."""
    n = whole_number(value)
    if n is not None and n >= 1:
        assert TorchModel(batch_size=value, **TINY).batch_size == n
    else:
        refused(lambda: TorchModel(batch_size=value, **TINY), "model.batch_size must be an integer >= 1", kind=ModelConfigError)


def test_an_unknown_model_key_is_refused_listing_the_accepted_ones() -> None:
    err = refused(lambda: built("model=lenet5", "+model.batchsize=8"), "model.batchsize", "batch_size", "image_size", "model.helpers",
                  kind=ModelConfigError)
    assert "helpers" in str(err)
    # a helper key of another model is not one of this model's
    refused(lambda: built("model=nmt", "+model.image_size=64"), "model.image_size", "vocab, src_len, tgt_len", kind=ModelConfigError)
    refused(lambda: built("model=synthetic", "+model.nodez=5"), "model.nodez", "nodes", kind=ModelConfigError)


def test_helper_keys_are_declared_and_must_be_set() -> None:
    src = built("model=custom", "model.module._target_=tests.test_capture.Tiny", "+model.side=8", "model.helpers=[image_size,side]",
                "model.image_size=${model.side}", "model.target.high=10")[0]
    assert src.inputs[0].shape == (3, 8, 8)
    refused(lambda: built("model=custom", "model.module._target_=tests.test_capture.Tiny", "model.helpers=[image_size,side]"),
            "model.helpers lists 'side'", "+model.side=", kind=ModelConfigError)
    refused(lambda: TorchModel(batch_size=4, helpers="image_size", **TINY), "model.helpers must be a list", kind=ModelConfigError)


def test_the_custom_factory_keys_are_checked_before_capture() -> None:
    base = ["model=custom", "model.target.high=10"]
    refused(lambda: built(*base, "model.module._target_=tests.test_profile.Tiny", "+model.module.widht=3"),
            "model.module.widht is not a parameter of tests.test_profile.Tiny", "it takes width", kind=ModelConfigError)
    refused(lambda: built(*base, "model.module._target_=tests.test_capture.Tiny", "+model.module.width=3"),
            "model.module.width", "no arguments", kind=ModelConfigError)
    target = f"model.module._target_={__name__}.needs_depth"
    refused(lambda: built(*base, target), "model.module.depth is required", "+model.module.depth=", kind=ModelConfigError)
    assert built(*base, target, "+model.module.depth=2")[0].module_cfg["depth"] == 2
    assert built(*base, f"model.module._target_={__name__}.takes_anything", "+model.module.whatever=1")[0].name == "custom"
    refused(lambda: built(*base, "model.module._target_=no_such_pkg.make_model"), "model.module._target_=no_such_pkg.make_model",
            "cannot be imported", kind=CaptureError)


@pytest.mark.parametrize("key, value, fragment", [
    ("nodes", 0, "model.nodes must be an integer >= 1"), ("nodes", 2.5, "model.nodes"), ("ccr", -1.0, "model.ccr must be >= 0"),
    ("width", 0, "model.width"), ("skip", 1.5, "model.skip must be in [0, 1]"), ("gflops", 0.0, "model.gflops must be > 0"),
    ("ref_tflops", -1.0, "model.ref_tflops"), ("ref_bw_GBps", math.nan, "model.ref_bw_GBps"), ("seed", 1.5, "model.seed"),
    ("batch_size", 0, "model.batch_size"),
])
def test_synthetic_graph_figures(key: str, value: Any, fragment: str) -> None:
    refused(lambda: SyntheticGraph(**{key: value}), fragment, kind=ModelConfigError)


# ---------------------------------------------------------------------------- 2. physical figures
@pytest.mark.parametrize("kw, fragment", [
    ({"intra": {**INTRA, "bw_GBps": -5}}, "cluster.intra.bw_GBps must be > 0, got -5"),
    ({"intra": {**INTRA, "bw_GBps": 0}}, "cluster.intra.bw_GBps must be > 0, got 0"),
    ({"intra": {**INTRA, "bw_GBps": math.inf}}, "cluster.intra.bw_GBps must be a finite number > 0, got inf"),
    ({"intra": {**INTRA, "bw_GBps": "fast"}}, "cluster.intra.bw_GBps must be a finite number > 0, got 'fast'"),
    ({"intra": {**INTRA, "lat_us": -1}}, "cluster.intra.lat_us must be >= 0, got -1"),
    ({"intra": {**INTRA, "lat_us": math.nan}}, "cluster.intra.lat_us"),
    ({"intra": {"topology": "pcie_tree", "bw_GBps": 16, "uplink": {"bw_GBps": 0}}}, "cluster.intra.uplink.bw_GBps must be > 0"),
    ({"intra": {"topology": "pcie_tree", "bw_GBps": 16, "gpus_per_switch": 0}}, "cluster.intra.gpus_per_switch must be an integer >= 1"),
    ({"intra": {"topology": "pcie_tree", "bw_GBps": 16, "gpus_per_switch": 1, "sockets": 2, "qpi": {"bw_GBps": -1}}},
     "cluster.intra.qpi.bw_GBps must be > 0"),
    ({"intra": {"topology": "nvlink_mesh", "link_GBps": -25, "pairs": [[0, 1, 1]], "fallback": {"bw_GBps": 16}}},
     "cluster.intra.link_GBps must be > 0"),
    ({"intra": {"topology": "nvlink_mesh", "link_GBps": 25, "pairs": [[0, 1, 1]], "fallback": {"bw_GBps": -16}}},
     "cluster.intra.fallback.bw_GBps must be > 0"),
    ({"nodes": 2, "inter": {"bw_gbps": 0}}, "cluster.inter.bw_gbps must be > 0"),
    ({"nodes": 2, "inter": {"bw_gbps": 100, "lat_us": -2}}, "cluster.inter.lat_us must be >= 0"),
    ({"nodes": 2, "inter": {"bw_gbps": 100, "nics_per_node": 1.5}}, "cluster.inter.nics_per_node must be an integer"),
    ({"nodes": 2, "inter": {"bw_gbps": 100}, "host_link": {"bw_GBps": -16}}, "cluster.host_link.bw_GBps must be > 0"),
    ({"nodes": 2, "inter": {"bw_gbps": 100}, "host_link": {"bw_GBps": 16, "lat_us": -1}}, "cluster.host_link.lat_us must be >= 0"),
    ({"gpus": 0}, "cluster.gpus must be an integer >= 1, got 0"),
    ({"gpus": 2.5}, "cluster.gpus must be an integer >= 1, got 2.5"),
    ({"nodes": -1}, "cluster.nodes must be an integer >= 1"),
    ({"collective": {"lat_us": 10, "bw_GBps": 0}}, "cluster.collective.bw_GBps must be > 0"),
    ({"collective": {"bw_GBps": 1}}, "cluster.collective.lat_us is missing"),
    ({"host_comm": {"copy_GBps": 0}}, "cluster.host_comm.copy_GBps must be > 0"),
    ({"host_comm": {"copy_GBps": 1, "send_tau_us": 0}}, "cluster.host_comm.send_tau_us must be > 0"),
    ({"host_comm": {"copy_GBps": 1, "per_message_us": -5}}, "cluster.host_comm.per_message_us must be >= 0"),
    ({"host_comm": {"copy_GBps": 1, "recv_when": "sometimes"}}, "cluster.host_comm.recv_when must be 'always' or 'busy'"),
    ({"host_comm": {"per_message_us": 5}}, "cluster.host_comm.copy_GBps is missing"),
    ({"colective": {"lat_us": 1, "bw_GBps": 1}}, "cluster.colective is not a cluster key"),
    ({"runtime_GiB": -1}, "cluster.runtime_GiB must be >= 0, got -1"),
    ({"runtime_GiB": math.inf}, "cluster.runtime_GiB must be a finite number"),
    ({"runtime_GiB": "lots"}, "cluster.runtime_GiB must be a finite number"),
    ({"runtime_GiB": 16}, "cluster.runtime_GiB = 16 leaves none of the TestGPU's 16 GiB to the framework's tensors"),
    ({"runtime_gib": 2}, "cluster.runtime_gib is not a cluster key: did you mean cluster.runtime_GiB?"),
    ({"allocator_reserve": 0.8}, "cluster.allocator_reserve = 0.8 is outside 1-3"),
    ({"allocator_reserve": 12}, "cluster.allocator_reserve = 12 is outside 1-3"),
    ({"allocator_reserve": "some"}, "cluster.allocator_reserve must be a finite number"),
])
def test_cluster_figures_name_their_key(kw: dict[str, Any], fragment: str) -> None:
    args = {"gpus": 2, "intra": INTRA, **kw}
    refused(lambda: build_cluster("x", DEVICE, **args), fragment, kind=ClusterError)


@pytest.mark.parametrize("spec, fragment", [
    ({**DEVICE, "peak_tflops": -10.0}, "cluster.device.peak_tflops must be > 0"),
    ({**DEVICE, "peak_tflops": {"float32": 10.0, "float16": -1}}, "cluster.device.peak_tflops.float16 must be > 0, got -1"),
    ({**DEVICE, "peak_tflops": {"float32": math.nan}}, "cluster.device.peak_tflops.float32 must be a finite number > 0"),
    ({**DEVICE, "peak_tflops": {"fp16": 20.0, "float32": 10.0}}, "cluster.device.peak_tflops.fp16 is not a math mode"),
    ({**DEVICE, "peak_tflops": {"float16": 20.0}}, "cluster.device.peak_tflops.float32 is missing"),
    ({**DEVICE, "mem_bw_GBps": 0}, "cluster.device.mem_bw_GBps must be > 0"),
    ({**DEVICE, "mem_GiB": -16}, "cluster.device.mem_GiB must be > 0"),
    ({**DEVICE, "mem_GB": 16}, "cluster.device.mem_GB is not a device key"),
])
def test_device_figures_name_their_key(spec: dict[str, Any], fragment: str) -> None:
    refused(lambda: device_spec(spec), fragment, kind=ClusterError)


def test_cluster_keys_through_the_config() -> None:
    refused(lambda: built("model=lenet5", "cluster=p100x4", "cluster.intra.bw_GBps=-5"), "cluster.intra.bw_GBps must be > 0, got -5")
    refused(lambda: built("model=lenet5", "cluster=dgx1_v100", "cluster.device.peak_tflops.float32=-1"),
            "cluster.device.peak_tflops.float32 must be > 0")
    refused(lambda: built("model=lenet5", "cluster=p100x16_4nodes", "cluster.inter.bw_gbps=0"), "cluster.inter.bw_gbps must be > 0")
    refused(lambda: built("model=lenet5", "cluster=cpu2", "cluster.collective.lat_us=-1"), "cluster.collective.lat_us must be >= 0")
    refused(lambda: built("model=gpt_1p7b", "cluster=superpod_a100", "cluster.runtime_GiB=-2"), "cluster.runtime_GiB must be >= 0")


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_bandwidth_and_latency_property(bw: float, lat: float) -> None:
    """A bandwidth and a latency in their plausible ranges (topology.RANGES: finite, > 0 and >= 0,
    no subnormal bandwidth that would make a transfer take forever) build a cluster whose routes
    carry them; any other pair is refused naming the first bad key."""
    from harness.core.topology import RANGES

    intra = {"topology": "mesh", "bw_GBps": bw, "lat_us": lat}
    bw_ok = RANGES["GBps"][0] <= bw <= RANGES["GBps"][1]
    if bw_ok and RANGES["us"][0] <= lat <= RANGES["us"][1]:
        cl = build_cluster("x", DEVICE, gpus=2, intra=intra)
        assert cl.route_bw[0, 1] == bw * 1e9 and cl.route_lat[0, 1] == lat * 1e-6
    else:
        bad = "bw_GBps" if not bw_ok else "lat_us"
        refused(lambda: build_cluster("x", DEVICE, gpus=2, intra=intra), f"cluster.intra.{bad}", kind=ClusterError)


@pytest.mark.parametrize("kw, fragment", [
    ({"efficiency": {"gemm": 1.5}}, "costs.efficiency.gemm must be in (0, 1], got 1.5"),
    ({"efficiency": {"conv": 0}}, "costs.efficiency.conv must be in (0, 1], got 0"),
    ({"efficiency": {"gem": 0.5}}, "costs.efficiency.gem is not an op class"),
    ({"mem_efficiency": -0.8}, "costs.mem_efficiency must be in (0, 1]"),
    ({"mem_efficiency": math.nan}, "costs.mem_efficiency"),
    ({"launch_us": -5}, "costs.launch_us must be >= 0, got -5"),
    ({"sync": "tree"}, "costs.sync must be 'ring' or 'ps'"),
    ({"lanch_us": 5}, "costs.lanch_us is not a parameter of AnalyticalCostModel: it takes efficiency, mem_efficiency, launch_us"),
])
def test_analytical_cost_figures(kw: dict[str, Any], fragment: str) -> None:
    refused(lambda: AnalyticalCostModel(make_cluster(2), **kw), fragment, kind=CostModelError)


@pytest.mark.parametrize("kw, fragment", [
    ({"peak_tflops": 0}, "costs.peak_tflops must be > 0"), ({"bw_GBps": -16}, "costs.bw_GBps must be > 0"),
    ({"cutoff": 0}, "costs.cutoff must be an integer >= 1"), ({"launch_us": -1}, "costs.launch_us"),
    ({"word_bytes": 8}, "costs.word_bytes is not a parameter of PaseCostModel: it takes peak_tflops"),
])
def test_pase_cost_figures(kw: dict[str, Any], fragment: str) -> None:
    refused(lambda: PaseCostModel(make_cluster(2), **kw), fragment, kind=CostModelError)


def test_calibrated_cost_figures() -> None:
    refused(lambda: built("model=lenet5", "costs.mem_efficiency=2"), "costs.mem_efficiency must be in (0, 1], got 2")
    refused(lambda: built("model=lenet5", "costs.efficiency.gemm=0"), "costs.efficiency.gemm")
    refused(lambda: built("model=lenet5", "costs.launch_us=-1"), "costs.launch_us must be >= 0")
    cl = make_cluster(2)
    refused(lambda: CalibratedCostModel(cl, devices={"TestGPU": {"ref": "V100", "extrapolate": True}}),
            "costs.devices.TestGPU.extrapolate is not a key", kind=CalibrationError)
    refused(lambda: CalibratedCostModel(cl, devices={"TestGPU": "V100"}), "costs.devices.TestGPU must be a mapping", kind=CalibrationError)


def test_profiled_costs_refuse_a_missing_profile_dir(tmp_path: Path) -> None:
    cl = make_cluster(2)
    missing = tmp_path / "nope"
    refused(lambda: ProfiledCostModel(cl, profile_dir=str(missing)), f"costs.profile_dir={missing} does not exist", kind=ProfileError)
    (tmp_path / "file").write_text("x")
    refused(lambda: ProfiledCostModel(cl, profile_dir=str(tmp_path / "file")), "is not a directory", kind=ProfileError)
    refused(lambda: ProfiledCostModel(cl, profiles={"TestGPU": str(missing)}), "costs.profiles['TestGPU']", "does not exist",
            kind=ProfileError)
    refused(lambda: ProfiledCostModel(cl, profiles={"TestGPU2": str(tmp_path)}), "costs.profiles['TestGPU2']", "'TestGPU'",
            kind=ProfileError)
    refused(lambda: ProfiledCostModel(cl, fallback={"efficiency": {"gemm": 2}}), "costs.fallback.efficiency.gemm", kind=CostModelError)
    refused(lambda: ProfiledCostModel(cl, fallback={"lanch_us": 1}), "costs.fallback.lanch_us", kind=CostModelError)
    refused(lambda: built("model=lenet5", "cluster=cpu2", "costs=profiled", f"costs.profile_dir={missing}"), "costs.profile_dir")
    # an existing directory without this device's profiles still falls back, and says so
    assert ProfiledCostModel(cl, profile_dir=str(tmp_path)).root == tmp_path


# ---------------------------------------------------------------------------- 3. graph files
def params_graph() -> OpGraph:
    """Three nodes and two parameters: w read by node 0, b by node 1; node 2 updates both."""
    return OpGraph(
        names=["mm", "add", "sgd"], targets=["aten.mm.default", "aten.add.Tensor", "aten._foreach_add_.List"],
        phase=[FORWARD, FORWARD, UPDATE], layer=[0, 0, 0], layer_names=["fc"], flops=[64.0, 8.0, 24.0], out_bytes=[32, 32, 0],
        work_bytes=[96, 64, 48], free=[0, 0, 0], batch_role=[BATCHED, BATCHED, 2], coloc=[-1, -1, -1], src=[0, 1], dst=[1, 2],
        nbytes=[32, 32], param_names=["fc.w", "fc.b"], param_bytes=[16, 8], param_ptr=[0, 1, 2, 2], param_idx=[0, 1],
        grad_node=[1, 1], update_node=[2, 2], meta={"model": "p", "batch_size": 4, "granularity": "aten", "optimizer": "sgd"},
    )


def write(path: Path, d: Any) -> Path:
    path.write_text(json.dumps(d))
    return path


def test_a_graph_file_round_trips_and_takes_its_stem_as_name(tmp_path: Path) -> None:
    g = params_graph()
    p = write(tmp_path / "my_graph.json", g.to_dict())
    src = GraphFile(str(p))
    assert src.name == "my_graph" and src.batch_size == 4
    assert src.op_graph().to_dict() == json.loads(json.dumps(g.to_dict()))
    assert GraphFile(str(p), name="named").name == "named"
    assert built("model=from_file", f"model.path={p}")[0].name == "my_graph"


def test_unreadable_graph_files_name_the_path_and_position(tmp_path: Path) -> None:
    text = json.dumps(params_graph().to_dict(), indent=1)
    refused(lambda: GraphFile(str(tmp_path / "none.json")), f"{tmp_path / 'none.json'} does not exist", kind=GraphError)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    refused(lambda: GraphFile(str(empty)), str(empty), "is empty (line 1, column 1)", kind=GraphError)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    line = text[: len(text) // 2].count("\n") + 1
    refused(lambda: GraphFile(str(cut)), str(cut), "is not valid JSON", f"(line {line}, column", kind=GraphError)
    arr = tmp_path / "arr.json"
    arr.write_text("\n  [1, 2]")
    refused(lambda: GraphFile(str(arr)), str(arr), "holds an array at line 2, column 3", "expected a JSON object", kind=GraphError)
    refused(lambda: GraphFile(str(tmp_path)), str(tmp_path), kind=GraphError)
    refused(lambda: OpGraph.load(write(tmp_path / "fmt.json", {"format": "x"})), "fmt.json", "not an op graph file", kind=GraphError)


def field_edit(field: str, index: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d[field][index] = value
    return edit


@pytest.mark.parametrize("edit, fragments", [
    (field_edit("flops", 1, float("nan")), ["node 1 (add) has flops = nan"]),
    (field_edit("flops", 0, -64.0), ["node 0 (mm) has flops = -64", "finite number >= 0"]),
    (field_edit("out_bytes", 2, -1), ["node 2 (sgd) has out_bytes = -1"]),
    (field_edit("work_bytes", 0, 1.5), ["node 0 (mm) has work_bytes = 1.5", "an integer >= 0"]),
    (field_edit("nbytes", 1, -32), ["edge 1 (add -> sgd) has nbytes = -32"]),
    (field_edit("param_bytes", 1, float("inf")), ["parameter 1 (fc.b) has param_bytes = inf"]),
    (field_edit("src", 1, 7), ["src[1] = 7 is not in 0..2"]),
    (field_edit("dst", 0, -1), ["dst[0] = -1 is not in 0..2"]),
    (field_edit("param_idx", 0, 2), ["param_idx[0] = 2 is not in 0..1"]),
    (field_edit("grad_node", 1, 3), ["grad_node[1] = 3 is not in -1..2"]),
    (field_edit("update_node", 0, 1.5), ["update_node[0] = 1.5"]),
    (field_edit("layer", 2, 1), ["layer[2] = 1 is not in 0..0"]),
    (field_edit("phase", 0, 3), ["phase[0] = 3"]),
    (field_edit("param_ptr", 3, 5), ["param_ptr[3] = 5"]),
    (field_edit("param_ptr", 3, 1), ["param_ptr must rise from 0 to 2"]),
    (lambda d: d.pop("flops"), ["field 'flops' is missing"]),
    (lambda d: d.update(flop=[1, 2, 3]), ["field 'flop' is not an op graph field"]),
    (lambda d: d.update(flops=[1.0, 2.0]), ["field 'flops' has 2 entries, expected 3"]),
    (lambda d: d.update(names="abc"), ["field 'names' must be a list"]),
    (lambda d: d.update(src=[0, 1, 2], dst=[1, 2, 0], nbytes=[1, 1, 1]), ["cycle through nodes", "(mm)"]),
])
def test_bad_graph_file_contents_name_the_node_edge_or_array(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                                           fragments: list[str]) -> None:
    d = params_graph().to_dict()
    edit(d)
    p = write(tmp_path / "g.json", d)
    refused(lambda: GraphFile(str(p)), f"graph file {p}: ", *fragments, kind=GraphError)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["src", "dst", "param_idx", "grad_node", "update_node", "layer", "phase", "batch_role", "coloc", "free"]),
       st.integers(min_value=0, max_value=10), st.integers(min_value=-10**6, max_value=10**6))
def test_index_arrays_property(field: str, pos: int, value: int) -> None:
    """Setting an index array entry to any integer: in range it loads (or is a cycle), out of
    range the error names the array and position."""
    d = params_graph().to_dict()
    pos %= len(d[field])
    d[field][pos] = value
    hi = {"src": 2, "dst": 2, "param_idx": 1, "grad_node": 2, "update_node": 2, "layer": 0, "phase": 2, "batch_role": 2, "coloc": 2,
          "free": 1}[field]
    lo = -1 if field in ("grad_node", "update_node", "coloc") else 0
    if lo <= value <= hi:
        try:
            OpGraph.from_dict(d)
        except GraphError as e:  # an edge edit may close a cycle or a self-loop
            assert "cycle" in str(e)
    else:
        refused(lambda: OpGraph.from_dict(d), f"{field}[{pos}] = {value} is not in {lo}..{hi}", kind=GraphError)


def test_node_ids_that_are_not_topological_are_renumbered(tmp_path: Path) -> None:
    d = make_graph(3, [(0, 1), (1, 2)]).to_dict()
    d["src"], d["dst"] = [2, 0], [0, 1]  # 2 -> 0 -> 1
    g = GraphFile(str(write(tmp_path / "g.json", d))).op_graph()
    assert g.names == ["v2", "v0", "v1"] and (g.src < g.dst).all()


def test_what_a_file_graph_cannot_apply_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "g.json", params_graph().to_dict())
    refused(lambda: built("model=from_file", f"model.path={p}", "model.batch_size=8"), "model.batch_size=8", str(p), "its batch size is 4",
            kind=ModelConfigError)
    assert built("model=from_file", f"model.path={p}", "model.batch_size=4")[0].batch_size == 4
    src = GraphFile(str(p))
    refused(lambda: src.op_graph(granularity="core_aten"), "graph.granularity=core_aten", "pass graph.granularity=aten",
            kind=ModelConfigError)
    refused(lambda: src.op_graph(optimizer="none"), "graph.optimizer=none", kind=ModelConfigError)
    refused(lambda: src.op_graph(precision="fp16"), "precision=fp16", kind=CaptureError)
    assert src.op_graph(colocate_gradients=False).num_nodes == 3
    refused(lambda: built("model=from_file", f"model.path={p}", "+model.batchsize=8"), "model.batchsize", kind=ModelConfigError)


# ---------------------------------------------------------------------------- 4. strategies
def test_degrees_and_device_ids_must_be_integers_and_degrees_positive(tmp_path: Path) -> None:
    refused(lambda: ParallelConfig.make({"sample": 0}, []), "the degree of sample is 0", kind=StrategyError)
    refused(lambda: ParallelConfig.make({"sample": -2, "channel": -2}, [0, 1, 2, 3]), "the degree of sample is -2", kind=StrategyError)
    refused(lambda: ParallelConfig.make({"sample": 2}, [0, 1.7]), "parallel config devices[1] must be an integer, got 1.7", kind=StrategyError)
    refused(lambda: ParallelConfig.make({"sample": 1.5}, [0]), "parallel config dims.sample must be an integer, got 1.5", kind=StrategyError)
    refused(lambda: ParallelConfig((("sample", 0),), ()), "the degree of sample is 0", kind=StrategyError)
    refused(lambda: Strategy.placement([0, 1.7, 1]), "strategy.device[1] = 1.7 is not an integer", kind=StrategyError)
    refused(lambda: Strategy.placement([0, 1, 1], order=[0, 1.5, 2]), "strategy.order[1] = 1.5", kind=StrategyError)
    assert Strategy.placement(np.array([0.0, 1.0])).device.tolist() == [0, 1]  # integral floats are integers
    g = make_graph(2, [(0, 1)])
    good = Strategy.uniform_config(2, ParallelConfig.make({"sample": 2}, [0, 1]))
    good.validate(g, 2)
    d = good.to_dict()
    d["configs"][0]["dims"]["sample"] = 0
    d["configs"][0]["devices"] = []
    p = write(tmp_path / "s.json", d)
    refused(lambda: Strategy.load(p), f"strategy file {p}: strategy configs[0]", "degree of sample is 0", kind=StrategyError)
    d["configs"][0] = {"dims": {"sample": 2}, "devices": [0, 1.7]}
    refused(lambda: Strategy.load(write(p, d)), "strategy configs[0]: parallel config devices[1] must be an integer, got 1.7", kind=StrategyError)
    p.write_text('{"format": "harness.strategy/1",\n "device": [0, 1')
    refused(lambda: Strategy.load(p), f"strategy file {p} is not valid JSON (line 2", kind=StrategyError)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["sample", "channel", "height"]), st.integers(min_value=-4, max_value=4), min_size=1))
def test_degree_property(dims: dict[str, int]) -> None:
    degree = math.prod(dims.values())
    if all(v >= 1 for v in dims.values()):
        assert ParallelConfig.make(dims, range(degree)).degree == degree
    else:
        bad = next(k for k, v in dims.items() if v < 1)
        refused(lambda: ParallelConfig.make(dims, range(max(degree, 0))), f"the degree of {bad} is {dims[bad]}", kind=StrategyError)


# ---------------------------------------------------------------------------- through the command line
def cli(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={out}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    return r, out


@pytest.mark.parametrize("overrides, fragments", [
    (["model=lenet5", "+model.batchsize=8"], ["model.batchsize is not a key of model"]),
    (["model=lenet5", "model.batch_size=2.5"], ["model.batch_size must be an integer >= 1, got 2.5"]),
    (["model=lenet5", "cluster=p100x4", "cluster.intra.bw_GBps=-5"], ["cluster.intra.bw_GBps must be > 0, got -5"]),
    (["model=lenet5", "cluster=cpu2", "costs=profiled", "costs.profile_dir=/nonexistent/profiles"],
     ["costs.profile_dir=/nonexistent/profiles does not exist"]),
    (["model=custom", "model.module._target_=tests.test_profile.Tiny", "+model.module.widht=3"],
     ["model.module.widht is not a parameter of tests.test_profile.Tiny"]),
    (["model=from_file", "model.path={cut}"], ["{cut} is not valid JSON (line 1, column"]),
    (["model=lenet5", "algo=fddps", "algo.slot=anywhere"], ["algo=fddps: algo.slot must be one of lst, idle; got 'anywhere'"]),
    (["model=lenet5", "algo=fddps", "algo.compiled=yes"], ["algo=fddps: algo.compiled must be one of null, true, false"]),
    (["model=lenet5", "algo=fddps", "+algo.horizn=3"], ["algo.horizn is not a parameter of algo=fddps", "horizon, eps"]),
    (["model=lenet5", "algo=m_sct", "algo.threshold=2"], ["algo=m_sct: algo.threshold must be in [0, 1], got 2"]),
    (["model=lenet5", "cluster=p100x4", "algo=optcnn", "algo.space=bad"], ["algo=optcnn: algo.space must be one of null, optcnn, pase; got 'bad'"]),
])
def test_the_command_line_refuses_and_writes_no_result(tmp_path: Path, overrides: list[str], fragments: list[str]) -> None:
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(params_graph().to_dict())[:100])
    r, out = cli(tmp_path, *(o.format(cut=cut) for o in overrides))
    assert r.returncode == 1, r.stderr[-2000:]
    wanted = [f.format(cut=cut) for f in fragments]
    assert any(all(f in line for f in wanted) for line in r.stderr.splitlines()), r.stderr[-2000:]  # on one line
    assert not (out / "result.json").exists()


# ---------------------------------------------------------------------------- algorithms, sources, threads
@pytest.mark.parametrize("over,needle", [
    (["algo=single_device", "algo.device=1.7"], "algo.device"),
    (["algo=single_device", "algo.device=-1"], "algo.device must be a device id >= 0"),
    (["algo=data_parallel", "algo.devices=0"], "algo.devices"),
])
def test_baseline_device_parameters_are_checked(over, needle):

    with pytest.raises(Exception) as e:
        build(compose(["model=lenet5", "cluster=p100x4", *over]))
    err = e.value if isinstance(e.value, UserError) else e.value.__cause__
    assert isinstance(err, UserError) and needle in str(err) and "\n" not in str(err)


def test_data_parallel_over_more_devices_than_the_cluster_has():
    from harness.app.run import run
    from harness.core.strategy import StrategyError

    with pytest.raises(StrategyError, match="algo.devices=8 is more than the 4 devices"):
        run(compose(["model=lenet5", "cluster=p100x4", "algo=data_parallel", "algo.devices=8"]))


def test_a_layer_graph_algorithm_on_a_graph_file_is_one_line(tmp_path):
    from harness.core.models import SyntheticGraph
    from harness.app.run import run

    p = tmp_path / "g.json"
    SyntheticGraph(nodes=20, seed=1).op_graph().save(p)
    with pytest.raises(UserError, match=r"graph file .*g\.json holds an operator graph; this algorithm plans on a layer graph"):
        run(compose(["model=from_file", f"model.path={p}", "algo=optcnn", "cluster=p100x4"]))


@pytest.mark.parametrize("threads", [0, 10_000])
def test_thread_counts_are_checked(threads):
    from harness.core.errors import ProfileError
    from harness.core.machine import thread_count

    with pytest.raises(ProfileError, match=r"^threads"):
        thread_count(threads, "threads")
    assert thread_count(1, "threads") == 1
