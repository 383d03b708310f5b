"""Issue 32: a hostile graph file (``model=from_file``) is one line naming the file and the field,
never a traceback, a hang or a wrong answer: duplicate node names, byte counts and FLOPs too large
to compute with (beyond int64, 1e308, integers beyond float64), ``kernels`` of the wrong type or
with codes out of range, JSON nested too deeply, a device, a FIFO or a directory instead of a file,
a file without read permission; in a layer graph negative or non-finite FLOPs, negative or huge
dims.  A batch of 1 is not split over several devices, and a graph without the parts data
parallelism synchronises is flagged in result.json's ``warnings`` and the summary."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.app.compose import compose
from harness.app.run import run
from harness.core.graph import BATCHED, FORWARD, PARTIAL, UPDATE, GraphError, OpGraph
from harness.core.models import GraphFile
from harness.core.zoo import pase_graphs
from tests.helpers import REPO, make_graph, refused, run_harness


def small_graph(batch: int = 4) -> OpGraph:
    """Three nodes, two parameters: w read by node 0, b by node 1 (its gradient, partial); node 2 updates both."""
    return OpGraph(
        names=["mm", "grad", "sgd"], targets=["aten.mm.default", "aten.mm.default", "aten._foreach_add_.List"],
        phase=[FORWARD, FORWARD, UPDATE], layer=[0, 0, 0], layer_names=["fc"], flops=[64.0, 8.0, 24.0], out_bytes=[32, 32, 0],
        work_bytes=[96, 64, 48], free=[0, 0, 0], batch_role=[BATCHED, PARTIAL, 2], coloc=[-1, -1, -1], src=[0, 1], dst=[1, 2],
        nbytes=[32, 32], param_names=["fc.w", "fc.b"], param_bytes=[16, 8], param_ptr=[0, 1, 2, 2], param_idx=[0, 1],
        grad_node=[1, 1], update_node=[2, 2], meta={"model": "p", "batch_size": batch, "granularity": "aten", "optimizer": "sgd"},
    )


def write(path: Path, d: Any) -> Path:
    path.write_text(json.dumps(d))
    return path


def edited(edit: Callable[[dict[str, Any]], None], base: dict[str, Any] | None = None) -> dict[str, Any]:
    d = copy.deepcopy(base if base is not None else small_graph().to_dict())
    edit(d)
    return d


def kernels(**over: Any) -> dict[str, Any]:
    """A one-row kernel table for node 0 (a GEMM), with ``over`` replacing its lists."""
    return {"node": [0], "kind": [0], "dims": [[4, 4, 4, 1] + [0] * 10], "bdim": [0], "math": [0], "rnn": [0], **over}


# ---------------------------------------------------------------------------- operator-graph fields
@pytest.mark.parametrize("edit, fragments", [
    (lambda d: d.update(names=["mm", "mm", "sgd"]), ["node 1 is named 'mm' like node 0", "must be unique"]),
    (lambda d: d["nbytes"].__setitem__(0, 2**70), ["field 'nbytes' adds up to 1.18e+21 bytes", "edge 0 (mm -> grad)"]),
    (lambda d: d["nbytes"].__setitem__(1, 1e308), ["field 'nbytes' adds up to 1e+308 bytes"]),
    (lambda d: d["out_bytes"].__setitem__(0, 2**63), ["field 'out_bytes' adds up to 9.22e+18 bytes"]),
    (lambda d: d["flops"].__setitem__(0, 1e308), ["field 'flops' adds up to 1e+308 FLOPs", "node 0 (mm)"]),
    (lambda d: d["flops"].__setitem__(0, True), ["field 'flops' must be a list of numbers"]),
    (lambda d: d["src"].__setitem__(0, 10**30), ["src[0] = 1e+30 is not in 0..2"]),
    (lambda d: d["param_bytes"].__setitem__(0, 2**63), ["field 'param_bytes' adds up to"]),
    (lambda d: d.update(kernels="abc"), ["field 'kernels' must be null or a JSON object", "got str"]),
    (lambda d: d.update(kernels=[1, 2]), ["field 'kernels' must be null or a JSON object", "got list"]),
    (lambda d: d.update(kernels={"node": [0]}), ["field 'kernels' needs the lists", "'kind' is missing"]),
    (lambda d: d.update(kernels=kernels(kind=[9])), ["kernels.kind[0] = 9 is not in 0..5"]),
    (lambda d: d.update(kernels=kernels(node=[3])), ["kernels.node[0] = 3 is not in 0..2"]),
    (lambda d: d.update(kernels=kernels(dims=[[2**70] * 14])), ["kernels.dims[0] = 1.18e+21 is not in 0..2147483647"]),
    (lambda d: d.update(kernels=kernels(dims=[[1] * 13])), ["field 'dims' has 13 entries, expected 14"]),
    (lambda d: d.update(kernels=kernels(math=[-1])), ["kernels.math[0] = -1"]),
    (lambda d: d.update(out_shapes=["a", None, None]), ["node 0 (mm) has out_shapes 'a'"]),
    (lambda d: d.update(out_shapes=[[[4, -1]], None, None]), ["node 0 (mm) has out_shapes [[4, -1]]"]),
    (lambda d: d["meta"].update(batch_size=10**30), ["meta.batch_size must be an integer in 1..2147483647"]),
    (lambda d: d["meta"].update(batch_axis=["x", 0, 0]), ["field 'batch_axis' must be a list of numbers"]),
    (lambda d: d.update(node_time_s={"*": [10**400, None, None]}), ["node 0 (mm) has node_time_s['*'] = 1000... (401 digits)"]),
    (lambda d: d.update(node_time_s={"*": [1e308, None, None]}), ["node 0 (mm) has node_time_s['*'] = 1e+308"]),
])
def test_a_bad_field_is_one_line_naming_the_file_and_the_culprit(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                                               fragments: list[str]) -> None:
    p = write(tmp_path / "g.json", edited(edit))
    refused(lambda: GraphFile(str(p)), f"graph file {p}: ", *fragments, kind=GraphError)


def test_the_checks_leave_a_good_file_alone(tmp_path: Path) -> None:
    d = edited(lambda d: d.update(kernels=kernels(), out_shapes=[[[4, 8]], [], None], node_time_s={"*": [1e-3, None, 3.2e7]}))
    g = GraphFile(str(write(tmp_path / "g.json", d))).op_graph()
    assert g.kernels is not None and len(g.kernels) == 1 and g.names == ["mm", "grad", "sgd"]


def test_an_integer_beyond_float64_is_one_line(tmp_path: Path) -> None:
    text = json.dumps(small_graph().to_dict()).replace('"flops": [64.0', '"flops": [' + "9" * 400)
    p = tmp_path / "g.json"
    p.write_text(text)
    refused(lambda: GraphFile(str(p)), str(p), "field 'flops' holds a number too large to compute with", kind=GraphError)


def test_json_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text('{"format": "harness.opgraph/2", "meta": ' + "[" * 200_000 + "]" * 200_000 + "}")
    refused(lambda: GraphFile(str(p)), str(p), "nests JSON arrays or objects too deeply", kind=GraphError)


# ---------------------------------------------------------------------------- what is not a regular file
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_is_refused_without_reading_it() -> None:
    refused(lambda: GraphFile("/dev/zero"), "graph file /dev/zero is a device: expected a JSON file", kind=GraphError)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    refused(lambda: GraphFile(str(tmp_path)), f"graph file {tmp_path} is a directory", kind=GraphError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    refused(lambda: GraphFile(str(fifo)), f"graph file {fifo} is a FIFO", kind=GraphError)
    t0 = time.monotonic()
    r = run_harness("model=from_file", f"model.path={fifo}", "algo=single_device", f"hydra.run.dir={tmp_path / 'out'}", timeout=120)
    assert r.returncode == 1 and "is a FIFO" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    assert time.monotonic() - t0 < 120


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_a_file_without_read_permission_is_one_line(tmp_path: Path) -> None:
    p = write(tmp_path / "g.json", small_graph().to_dict())
    p.chmod(0)
    try:
        refused(lambda: GraphFile(str(p)), f"cannot read graph file {p}", "Permission denied", kind=GraphError)
    finally:
        p.chmod(0o600)


# ---------------------------------------------------------------------------- layer-graph files
def layer_dict() -> dict[str, Any]:
    return json.loads(json.dumps(pase_graphs.rnnlm(4).to_dict()))


@pytest.mark.parametrize("edit, fragments", [
    (lambda d: d["flops_fwd"].__setitem__(1, -5), ["node 1 (embed) has flops_fwd = -5", "finite number >= 0"]),
    (lambda d: d["flops_bwd"].__setitem__(1, float("nan")), ["node 1 (embed) has flops_bwd = nan"]),
    (lambda d: d["flops_fwd"].__setitem__(1, 1e308), ["field 'flops_fwd' adds up to 1e+308 FLOPs"]),
    (lambda d: d["dims"][1].__setitem__("sample", -4), ["node embed: dim 'sample' has -4", "an integer in 1..2147483647"]),
    (lambda d: d["dims"][1].__setitem__("sample", 10**30), ["node embed: dim 'sample' has 1000000000000000000000000000000"]),
    (lambda d: d["dims"][1].__setitem__("sample", 2.5), ["node embed: dim 'sample' has 2.5"]),
    (lambda d: d["dims"].__setitem__(1, [1, 2]), ["node embed: dims must be a mapping"]),
    (lambda d: d["out_shape"][1].__setitem__(0, -1), ["node embed: out_shape has -1"]),
    (lambda d: d["names"].__setitem__(2, d["names"][1]), ["node name 'embed' is not unique"]),
    (lambda d: d["nbytes"].__setitem__(0, 2**70), ["field 'nbytes' adds up to 1.18e+21 bytes"]),
    (lambda d: d["param_bytes"].__setitem__(1, -8), ["node 1 (embed) has param_bytes = -8"]),
    (lambda d: d["src"].__setitem__(0, 2**40), ["malformed layer graph"]),
    (lambda d: d.update(meta=[1]), ["LayerGraph.meta must be a mapping"]),
])
def test_a_bad_layer_graph_field_is_one_line(tmp_path: Path, edit: Callable[[dict[str, Any]], None], fragments: list[str]) -> None:
    d = layer_dict()
    assert "sample" in d["dims"][1] and d["names"][1] == "embed"
    edit(d)
    p = write(tmp_path / "lg.json", d)
    refused(lambda: GraphFile(str(p)), f"layer graph file {p}: ", *fragments, kind=GraphError)


# ---------------------------------------------------------------------------- a batch of 1, a graph without parameters
def test_data_parallel_does_not_split_a_batch_of_one(tmp_path: Path) -> None:
    p = write(tmp_path / "g.json", small_graph(batch=1).to_dict())
    refused(lambda: run(compose(["model=from_file", f"model.path={p}", "algo=data_parallel", "cluster=p100x4"])),
            "data parallelism over 4 devices splits the batch 4 ways", "(model.batch_size) is 1", "algo.devices <= 1")
    row = run(compose(["model=from_file", f"model.path={p}", "algo=single_device", "cluster=p100x4"])).row
    assert row["data_parallel_step_s"] is None and row["speedup_vs_data_parallel"] is None  # no data-parallel reference


def test_a_graph_file_without_a_parameter_table_is_flagged(tmp_path: Path) -> None:
    bare = make_graph(3, [(0, 1), (1, 2)])
    bare.meta["batch_size"] = 4
    p = tmp_path / "bare.json"
    bare.save(p)
    out = tmp_path / "run"
    r = run_harness("model=from_file", f"model.path={p}", "algo=data_parallel", "cluster=p100x4", f"hydra.run.dir={out}",
                    "output.gantt=false", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((out / "result.json").read_text())
    assert len(row["warnings"]) == 1
    assert "no parameter table" in row["warnings"][0] and "no partial node" in row["warnings"][0] and str(p) in row["warnings"][0]
    assert "WARNING" in r.stdout and "no parameter table" in r.stdout
    good = write(tmp_path / "good.json", small_graph().to_dict())
    assert GraphFile(str(good)).warnings == []
    assert "no parameter bytes" not in " ".join(GraphFile(str(write(tmp_path / "lg.json", layer_dict()))).warnings)
    lg = layer_dict()
    lg["param_bytes"] = [0] * len(lg["param_bytes"])
    assert "no layer parameter bytes" in GraphFile(str(write(tmp_path / "lg0.json", lg))).warnings[0]


def test_the_example_graph_still_loads() -> None:
    src = GraphFile(str(REPO / "docs" / "examples" / "profiled_graph.json"))
    assert src.op_graph().num_nodes > 0


def test_a_hostile_file_through_the_command_line_writes_no_result(tmp_path: Path) -> None:
    p = write(tmp_path / "g.json", edited(lambda d: d.update(names=["a", "b", "a"])))
    out = tmp_path / "run"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness", "model=from_file", f"model.path={p}", "algo=m_topo", f"hydra.run.dir={out}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "node 2 is named 'a' like node 0" in r.stderr.strip().splitlines()[-1]
    assert not (out / "result.json").exists()
