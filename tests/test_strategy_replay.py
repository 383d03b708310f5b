"""Replaying a strategy file (``algo=from_file algo.path=strategy.json``): a job's plan replays to
exactly the step time the job reported (FD-DPS's split graph too, through plan_graph.json), a
hand-written strategy replays, and every hostile file is a one-line UserError naming the culprit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.app.compose import compose
from harness.core.errors import UserError
from harness.core.strategy import PLAN_GRAPH_FILE, STRATEGY_FORMAT
from harness.app.run import run, write_plan

BASE = ["model=lenet5", "cluster=p100x4", "output.worth=false"]
SUMMARY = ("step_time_s", "lower_bound_s", "plan_lower_bound_s", "comm_bytes", "peak_memory_bytes", "device_busy_s", "oom")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """m_topo, fddps, data_parallel and single_device on lenet5 / p100x4: the strategy file each
    job writes (write_plan, as the CLI's job does) and its result row.  FD-DPS splits no op of
    lenet5 at its 1 ms threshold; at 0 it splits, so its plan graph is a rewrite."""
    out = {}
    for algo in ("m_topo", "fddps", "data_parallel", "single_device"):
        d = tmp_path_factory.mktemp(algo)
        res = run(compose([f"algo={algo}", *BASE, *(["algo.min_time_ms=0"] if algo == "fddps" else [])]))
        write_plan(res.plan, res.graph, d)
        out[algo] = (d / "strategy.json", res.row)
    return out


def replay(path: Path | str, *extra: str) -> dict:
    return run(compose(["algo=from_file", f"algo.path={path}", *BASE, *extra])).row


@pytest.mark.parametrize("algo", ["m_topo", "fddps", "data_parallel"])
def test_a_replayed_plan_simulates_to_exactly_the_reported_step_time(algo, jobs):
    path, row = jobs[algo]
    again = replay(path)
    assert {k: again[k] for k in SUMMARY} == {k: row[k] for k in SUMMARY}
    assert again["step_time_s"] == row["step_time_s"]
    assert (again["plan_nodes"], again["plan_edges"]) == (row["plan_nodes"], row["plan_edges"])
    assert again["algo"] == "from_file" and again["algo_info"]["replayed_from"] == str(path)


def test_fddps_writes_its_split_graph_beside_the_strategy_and_the_others_do_not(jobs):
    path, row = jobs["fddps"]
    d = json.loads(path.read_text())
    assert row["plan_nodes"] != row["graph_nodes"], "lenet5 / p100x4 should split an op (the point of this case)"
    assert d["plan_graph"] == PLAN_GRAPH_FILE and (path.parent / PLAN_GRAPH_FILE).is_file()
    assert len(d["plan_origin"]) == row["plan_nodes"] and len(d["device"]) == row["plan_nodes"]
    assert d["graph"]["nodes"] == row["graph_nodes"] and d["graph"]["kind"] == "op" and len(d["graph"]["fingerprint"]) == 40
    for algo in ("m_topo", "data_parallel"):
        p, _ = jobs[algo]
        assert "plan_graph" not in json.loads(p.read_text()) and not (p.parent / PLAN_GRAPH_FILE).exists()


def test_the_schema_describes_a_jobs_strategy_file(jobs):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "strategy.schema.json").read_text())
    for algo in jobs:
        jsonschema.validate(json.loads(jobs[algo][0].read_text()), schema)
    jsonschema.validate({"format": STRATEGY_FORMAT, "device": [0, 1]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"format": STRATEGY_FORMAT, "device": [0.5]}, schema)


def test_a_hand_written_strategy_replays(jobs, tmp_path):
    """Only format and device: order defaults to node order; all on device 0 is single_device's plan."""
    n = jobs["single_device"][1]["graph_nodes"]
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"format": STRATEGY_FORMAT, "device": [0] * n}))
    assert replay(p)["step_time_s"] == jobs["single_device"][1]["step_time_s"]


def write(path: Path, obj: object) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def refused(path: Path | str, *fragments: str, extra: tuple[str, ...] = ()) -> str:
    with pytest.raises(UserError) as e:
        replay(path, *extra)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_hostile_files_are_one_line_errors(jobs, tmp_path):
    good = json.loads(jobs["m_topo"][0].read_text())
    n = len(good["device"])
    refused(tmp_path / "nope.json", "algo.path=", "no such strategy file", "docs/strategy_format.md")
    refused(write(tmp_path / "bad.json", "{not json"), "bad.json")
    refused(write(tmp_path / "list.json", "[1, 2]"), "list.json")
    refused(write(tmp_path / "fmt.json", {**good, "format": "harness.opgraph/1"}), "not a strategy", STRATEGY_FORMAT)
    refused(write(tmp_path / "nodev.json", {"format": STRATEGY_FORMAT}), "'device' is missing")
    refused(write(tmp_path / "frac.json", {**good, "device": [0.5] * n}), "strategy.device[0] = 0.5 is not an integer")
    bad = list(good["device"])
    bad[3] = 7
    refused(write(tmp_path / "dev.json", {**good, "device": bad}), "node 3 (", "placed on device 7", "devices 0..3", "p100x4")
    order = list(good["order"])
    order[0], order[-1] = order[-1], order[0]
    refused(write(tmp_path / "order.json", {**good, "order": order}), "order must respect every edge")
    refused(write(tmp_path / "layer.json", {**good, "graph": {"kind": "layer", "nodes": n}}), "layer graph",
            "operator-graph strategies only")
    fp = good["graph"]["fingerprint"]
    msg = refused(write(tmp_path / "fp.json", {**good, "graph": {**good["graph"], "fingerprint": "0" * 40}}),
                  "is for another graph", f"fingerprint {'0' * 12}", f"fingerprint {fp[:12]}")
    assert msg.count(f"({n} nodes") == 2
    short = {k: v for k, v in good.items() if k != "graph"}
    refused(write(tmp_path / "short.json", {**short, "device": good["device"][:-1], "order": good["order"][:-1],
                                            "config_id": good["config_id"][:-1]}), "is for another graph", f"{n - 1} nodes", f"has {n}")


def test_a_strategy_for_another_model_names_both_graphs(jobs):
    """lenet5's strategy on a synthetic graph: both graphs named, with their node counts."""
    p, row = jobs["m_topo"]
    with pytest.raises(UserError) as e:
        run(compose(["algo=from_file", f"algo.path={p}", "model=synthetic", "model.nodes=30", "cluster=p100x4", "output.worth=false"]))
    msg = str(e.value)
    assert "is for another graph" in msg and f"lenet5 ({row['graph_nodes']} nodes" in msg and "(30 nodes" in msg, msg


def test_a_missing_or_broken_plan_graph_is_named(jobs, tmp_path):
    src, _ = jobs["fddps"]
    d = json.loads(src.read_text())
    p = write(tmp_path / "strategy.json", d)
    refused(p, f"names plan_graph {PLAN_GRAPH_FILE}", "does not exist", "copy it along")
    write(tmp_path / PLAN_GRAPH_FILE, "{")
    refused(p, "its plan graph")
    (tmp_path / PLAN_GRAPH_FILE).write_text((src.parent / PLAN_GRAPH_FILE).read_text())
    refused(write(tmp_path / "o.json", {**d, "plan_origin": [0, 1]}), "plan_origin has 2 entries")
    assert replay(p)["step_time_s"] == jobs["fddps"][1]["step_time_s"]  # copied together: replays


def test_the_schema_lists_the_fields_a_strategy_file_has(jobs):
    """docs/strategy.schema.json names every key a job writes, and requires format and device."""
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "strategy.schema.json").read_text())
    assert schema["required"] == ["format", "device"] and schema["properties"]["format"]["const"] == STRATEGY_FORMAT
    assert set(json.loads(jobs["fddps"][0].read_text())) <= set(schema["properties"])


# ---------------------------------------------------------------------------- the command line
REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_replay_through_the_command_line(tmp_path):
    """A job's strategy.json (FD-DPS, split graph) replayed by ``python -m harness algo=from_file``:
    the same step time, bit for bit; no path is one line on stderr."""
    quiet = ("model=lenet5", "cluster=p100x4", "output.gantt=false", "output.trace=false", "output.worth=false")
    src = cli("algo=fddps", "algo.min_time_ms=0", *quiet, f"hydra.run.dir={tmp_path / 'src'}")
    assert src.returncode == 0, src.stderr[-2000:]
    assert (tmp_path / "src" / PLAN_GRAPH_FILE).is_file()
    again = cli("algo=from_file", f"algo.path={tmp_path / 'src' / 'strategy.json'}", *quiet, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("src", "again"))
    assert b["algo"] == "from_file" and b["step_time_s"] == a["step_time_s"] and b["plan_nodes"] == a["plan_nodes"]
    none = cli("algo=from_file", *quiet, f"hydra.run.dir={tmp_path / 'none'}")
    assert none.returncode == 1 and "algo.path" in none.stderr and len(none.stderr.strip().splitlines()) == 1, none.stderr


def test_a_replay_without_a_path_says_which_key_to_give(tmp_path):
    """algo=from_file alone: one line naming algo.path and how to give it, exit 1, no result.json."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness", "algo=from_file", "model=lenet5", f"hydra.run.dir={tmp_path}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert r.stderr.strip() == "error: Missing mandatory value: algo.path; give it on the command line: algo.path=VALUE"
    assert not (tmp_path / "result.json").exists()
