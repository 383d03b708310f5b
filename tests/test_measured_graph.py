"""Measured node times in an operator-graph file (``node_time_s``, format harness.opgraph/2,
docs/graph_format.md): every cost model and every operator-placement algorithm honours them,
a shard of a batch-scaled node takes its share, /1 files load, bad entries are one-line errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import hydra.utils
import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments.common import needs_input
from harness.core.calibrated import CalibratedCostModel
from harness.core.costs import AnalyticalCostModel
from harness.core.graph import BATCHED, GRAPH_FORMAT, REPLICATED, GraphError, OpGraph
from harness.core.profiled import ProfiledCostModel
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "profiled_graph.json"
KIND = "TestGPU"  # make_cluster's device kind


def measured(g: OpGraph, times: dict[str, list[float | None]], **fields) -> OpGraph:
    """``g`` with ``node_time_s`` (through the file format's checks)."""
    return OpGraph.from_dict({**g.to_dict(), **fields, "node_time_s": times})


def diamond(flops_scale: float = 1.0) -> OpGraph:
    """A small DAG with parallel branches; node i does (i + 1) GFLOP x ``flops_scale``."""
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6), (6, 7)]
    return make_graph(8, edges, flops=[(i + 1) * 1e9 * flops_scale for i in range(8)])


TIMES = [3e-3, 1e-3, 2e-3, 5e-4, 4e-3, 1.5e-3, 2.5e-4, 7e-4]


def cost_models(cluster, profile_dir: Path):
    cal = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "costs" / "calibrated.yaml"), resolve=True)
    cal.pop("_target_", None)
    cal.pop("_partial_", None)
    return {"analytical": AnalyticalCostModel(cluster), "calibrated": CalibratedCostModel(cluster, **cal),
            "profiled": ProfiledCostModel(cluster, profile_dir=profile_dir)}


# ---------------------------------------------------------------------------- the cost models
@pytest.mark.parametrize("model", ["analytical", "calibrated", "profiled"])
def test_every_cost_model_answers_a_measured_node_with_its_time(model, tmp_path):
    cl = make_cluster(2)
    costs = cost_models(cl, tmp_path)[model]  # profiled: an empty profile directory
    g = measured(diamond(), {"*": TIMES[:3] + [None] * 5})
    plain = costs.node_times(diamond(), 0)
    t = costs.node_times(g, 0)
    assert t[:3].tolist() == TIMES[:3]
    assert t[3:].tolist() == plain[3:].tolist()  # unmeasured nodes keep the model's estimate
    assert costs.compute_time(g, 1, 1) == TIMES[1]


def test_the_profiled_report_counts_the_graphs_measured_nodes_apart_from_its_fallbacks(tmp_path):
    cl = make_cluster(2)
    costs = ProfiledCostModel(cl, profile_dir=tmp_path)  # an empty profile: every unmeasured node falls back
    costs.node_times(measured(diamond(), {"*": TIMES[:3] + [None] * 5}), 0)
    kind = costs.report()["by_kind"][KIND]
    assert (kind["measured_in_graph"], kind["fallback_nodes"]) == (3, 5)


def test_the_kind_entry_wins_over_star_and_a_null_falls_through_to_star():
    cl = make_cluster(2)
    g = measured(diamond(), {"*": TIMES, KIND: [1.0, None] + [None] * 6})
    t = AnalyticalCostModel(cl).node_times(g, 0)
    assert t.tolist() == [1.0] + TIMES[1:]


def test_an_entry_for_another_kind_only_is_fine_and_changes_nothing():
    cl = make_cluster(2)
    g = measured(diamond(), {"V100-SXM2-32GB": TIMES})
    assert AnalyticalCostModel(cl).node_times(g, 0).tolist() == AnalyticalCostModel(cl).node_times(diamond(), 0).tolist()


def test_a_shard_of_a_batch_scaled_node_takes_its_share_a_replicated_node_all_of_it():
    """Data parallelism on 4 devices: a batched node's shard runs 1/4 of its measured time, a
    replicated one (not batch-scaled) runs whole on every replica."""
    cl = make_cluster(4)
    g0 = make_graph(3, [(0, 1), (1, 2)], nbytes=[0, 0])
    times = [4e-3, 2e-3, 1e-3]
    g = measured(g0, {"*": times}, batch_role=[BATCHED, BATCHED, REPLICATED])
    assert g.batch_scaled().tolist() == [True, True, False]
    costs = AnalyticalCostModel(cl)
    assert costs.node_times(g, 0, 0.25).tolist() == [1e-3, 5e-4, 2.5e-4]
    from algorithms.baselines import DataParallel

    dp = DataParallel(name="data_parallel", seed=0).plan(g, cl, costs).strategy
    step = simulate(g, dp, cl, costs).step_time_s
    assert step == pytest.approx(4e-3 / 4 + 2e-3 / 4 + 1e-3, rel=1e-12)


# ---------------------------------------------------------------------------- every algorithm
def op_algorithms() -> list[str]:
    out = []
    for path in sorted((REPO / "conf" / "algo").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        if needs_input(path.stem):  # replays a file (algo=from_file)
            continue
        cls = hydra.utils.get_class(cfg["_target_"])
        kind = cfg.get("graph", getattr(cls, "graph_kind", None))
        if kind == "op":
            out.append(path.stem)
    return out


def run_algo(name: str, graph: OpGraph, cluster):
    cfg = OmegaConf.load(REPO / "conf" / "algo" / f"{name}.yaml")
    if name == "hrl":
        cfg.samples = 8
    algo = hydra.utils.instantiate(cfg, seed=0)
    costs = AnalyticalCostModel(cluster)
    plan = algo.plan(graph, cluster, costs)
    return plan, simulate(plan.graph, plan.strategy, cluster, costs).step_time_s


def test_single_device_simulates_the_sum_of_the_node_times():
    cl = make_cluster(4)
    g = measured(diamond(), {"*": TIMES})
    _, step = run_algo("single_device", g, cl)
    assert step == pytest.approx(sum(TIMES), rel=1e-12)


@pytest.mark.parametrize("name", op_algorithms())
def test_every_op_algorithm_plans_and_simulates_on_the_measured_times_alone(name):
    """Two graphs with the same measured times and FLOPs 1000x apart plan and simulate the same:
    the estimates play no part, in the algorithm or in the simulator."""
    cl = make_cluster(4)
    a = measured(diamond(), {"*": TIMES})
    b = measured(diamond(1000.0), {"*": TIMES})
    plan_a, step_a = run_algo(name, a, cl)
    plan_b, step_b = run_algo(name, b, cl)
    assert plan_a.strategy.device.tolist() == plan_b.strategy.device.tolist()
    assert step_a == step_b
    assert step_a >= max(TIMES) * (0.25 if name == "data_parallel" else 1.0)


def test_a_split_graph_keeps_the_measured_times():
    """FD-DPS's split: each half takes its share of its op's time, a node left alone keeps its
    own, and the gather / aggregate nodes the split adds have none (the model's estimate)."""
    cl = make_cluster(4)
    g = measured(diamond(), {"*": [5e-3] * 8})
    plan, _ = run_algo("fddps", g, cl)
    assert plan.graph.num_nodes > g.num_nodes  # fddps split the mm nodes (>= 1 ms each)
    t = plan.graph.node_time_s["*"]
    halves = [i for i, name in enumerate(plan.graph.names) if name.endswith((".0", ".1"))]
    assert halves and all(t[i] == 2.5e-3 for i in halves)
    kept = [i for i, name in enumerate(plan.graph.names) if name in g.names]
    assert all(t[i] == 5e-3 for i in kept)
    added = set(range(plan.graph.num_nodes)) - set(halves) - set(kept)
    assert all(np.isnan(t[i]) for i in added)  # none on this graph: the halves feed their readers


# ---------------------------------------------------------------------------- the file
def test_save_and_load_keep_the_times_and_null_entries(tmp_path):
    g = measured(diamond(), {"*": TIMES[:4] + [None] * 4, KIND: [None] * 7 + [1.0]})
    g.save(tmp_path / "g.json")
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["format"] == "harness.opgraph/2"
    assert d["node_time_s"]["*"] == TIMES[:4] + [None] * 4
    back = OpGraph.load(tmp_path / "g.json")
    assert back.to_dict() == g.to_dict()


def test_a_graph_without_times_saves_no_node_time_s(tmp_path):
    diamond().save(tmp_path / "g.json")
    assert "node_time_s" not in json.loads((tmp_path / "g.json").read_text())


def test_a_format_1_file_still_loads(tmp_path):
    d = diamond().to_dict()
    d["format"] = "harness.opgraph/1"
    (tmp_path / "g.json").write_text(json.dumps(d))
    g = OpGraph.load(tmp_path / "g.json")
    assert g.node_time_s is None and g.num_nodes == 8
    d["node_time_s"] = {"*": TIMES}
    (tmp_path / "g.json").write_text(json.dumps(d))
    with pytest.raises(GraphError, match="needs format 'harness.opgraph/2'"):
        OpGraph.load(tmp_path / "g.json")


def test_renumbering_carries_the_times():
    g = diamond().to_dict()
    perm = [7, 6, 5, 4, 3, 2, 1, 0]  # file node j is graph node perm[j]
    inv = np.argsort(perm)
    d = dict(g)
    for key in ("names", "targets", "phase", "layer", "flops", "out_bytes", "work_bytes", "free", "batch_role", "coloc"):
        d[key] = [g[key][perm[j]] for j in range(8)]
    d["src"] = [int(inv[s]) for s in g["src"]]
    d["dst"] = [int(inv[t]) for t in g["dst"]]
    d["param_ptr"] = None
    d["node_time_s"] = {"*": [TIMES[perm[j]] for j in range(8)]}
    back = OpGraph.from_dict(d)
    by_name = dict(zip(back.names, back.measured_times(KIND).tolist()))
    assert by_name == {f"v{i}": TIMES[i] for i in range(8)}


@pytest.mark.parametrize("times, message", [
    ({"*": TIMES[:3]}, r"^graph file .*: node_time_s\['\*'\] has 3 entries, expected 8 \(one per node\)$"),
    ({KIND: [1e-3, -1e-3] + [0] * 6}, r"^graph file .*: node 1 \(v1\) has node_time_s\['TestGPU'\] = -0.001; .* or null$"),
    ({"*": [0] * 5 + ["NaN"] + [0] * 2}, r"node 5 \(v5\) has node_time_s\['\*'\] = 'NaN'"),
    ({"*": [0] * 7 + [True]}, r"node 7 \(v7\) has node_time_s\['\*'\] = True"),
    ([1, 2], r"field 'node_time_s' must be a JSON object"),
    ({"*": "fast"}, r"node_time_s\['\*'\] must be a list of 8 per-node seconds"),
    ({"": [0] * 8}, r"a key of node_time_s must be a device kind"),
])
def test_bad_times_are_one_line_errors(tmp_path, times, message):
    d = {**diamond().to_dict(), "node_time_s": times}
    (tmp_path / "g.json").write_text(json.dumps(d))
    with pytest.raises(GraphError, match=message) as e:
        OpGraph.load(tmp_path / "g.json")
    assert "\n" not in str(e.value)


def test_nan_in_the_file_is_refused(tmp_path):
    d = {**diamond().to_dict(), "node_time_s": {"*": [0.0] * 2 + [float("nan")] + [0.0] * 5}}
    (tmp_path / "g.json").write_text(json.dumps(d))  # json writes NaN, which json reads back as nan
    with pytest.raises(GraphError, match=r"node 2 \(v2\) has node_time_s\['\*'\] = nan"):
        OpGraph.load(tmp_path / "g.json")


# ---------------------------------------------------------------------------- the documented example
def test_the_example_file_loads_and_its_times_apply():
    g = OpGraph.load(EXAMPLE)
    d = json.loads(EXAMPLE.read_text())
    star, p100 = d["node_time_s"]["*"], d["node_time_s"]["P100-SXM2-16GB"]
    assert g.measured_times("P100-SXM2-16GB").tolist() == [p if p is not None else s for p, s in zip(p100, star)]
    assert g.measured_times("some other GPU").tolist() == star


def test_the_schema_lists_exactly_the_fields_of_a_graph_file():
    """Without jsonschema installed: the schema's properties are the fields OpGraph.load takes,
    its required ones those it requires."""
    schema = json.loads((REPO / "docs" / "graph.schema.json").read_text())
    fields = {f.name for f in dataclasses.fields(OpGraph) if f.name != "fx"}
    assert set(schema["properties"]) == fields | {"format"}
    required = {f.name for f in dataclasses.fields(OpGraph)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert set(schema["required"]) == required | {"format"}
    assert schema["properties"]["format"]["enum"][0] == GRAPH_FORMAT


def test_the_example_file_follows_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "graph.schema.json").read_text())
    jsonschema.validate(json.loads(EXAMPLE.read_text()), schema)
    jsonschema.validate(diamond().to_dict(), schema)  # what OpGraph.save writes
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(EXAMPLE.read_text()), "node_time_s": {"*": [-1.0]}}, schema)


def test_the_cli_runs_a_measured_graph_file_end_to_end(tmp_path):
    out = tmp_path / "job"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness", "model=from_file", f"model.path={EXAMPLE}", "algo=m_topo",
                        "cluster=p100x4", "output.gantt=false", f"hydra.run.dir={out}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((out / "result.json").read_text())
    g = OpGraph.load(EXAMPLE)
    times = g.measured_times("P100-SXM2-16GB")
    # the chain fc1 -> relu -> fc2 -> loss -> fc2_grad -> relu_grad -> fc1_grad -> fc1_update runs in order
    assert row["step_time_s"] >= times[[0, 1, 2, 3, 4, 5, 6, 7]].sum() * (1 - 1e-12)
    one = tmp_path / "single"
    r = subprocess.run([sys.executable, "-m", "harness", "model=from_file", f"model.path={EXAMPLE}", "algo=single_device",
                        "cluster=p100x4", "output.gantt=false", f"hydra.run.dir={one}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((one / "result.json").read_text())["step_time_s"] == pytest.approx(times.sum(), rel=1e-12)
