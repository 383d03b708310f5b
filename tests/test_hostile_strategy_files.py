"""Issue 32: a hostile strategy file (``algo=from_file``) is one line naming the file, the node and
the field: a null or non-integer device, an order out of range or not a permutation, an integer
too large for its array; and its ``plan_graph`` never reaches outside the strategy file's folder
(no ``..``, no absolute path, no sub-folder, no symbolic link that leads out)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from algorithms.from_file import FromFile, ReplayError
from harness.core.costs import AnalyticalCostModel
from harness.core.strategy import PLAN_GRAPH_FILE, Strategy, StrategyError
from tests.helpers import make_cluster, make_graph, refused, run_harness

GRAPH = make_graph(3, [(0, 1), (1, 2)])
CLUSTER = make_cluster(2)


def write(path: Path, d: Any) -> Path:
    path.write_text(json.dumps(d))
    return path


def replay(path: Path) -> Any:
    return FromFile(path=str(path)).plan(GRAPH, CLUSTER, AnalyticalCostModel(CLUSTER))


@pytest.mark.parametrize("fields, fragments", [
    ({"device": [0, None, 1]}, ["strategy.device[1] = None is not an integer"]),
    ({"device": None}, ["strategy.device must be a list of integers, got None"]),
    ({"device": [0, 1.5, 1]}, ["strategy.device[1] = 1.5 is not an integer"]),
    ({"device": [0, True, 1]}, ["strategy.device[1] = True is not an integer"]),
    ({"device": [0, "x", 1]}, ["strategy.device[1] = 'x' is not an integer"]),
    ({"device": [[0], [1], [1]]}, ["strategy.device must be a flat list of integers"]),
    ({"device": [0, 1, 10**30]}, ["strategy.device[2] = 1000000000000000000000000000000 is out of range"]),
    ({"device": [0, 1, 1], "order": [0, 1, 1000]}, ["strategy.order[2] = 1000 is out of range", "a permutation of 0..2"]),
    ({"device": [0, 1, 1], "order": [0, 1, -5]}, ["strategy.order[2] = -5 is out of range"]),
    ({"device": [0, 1, 1], "order": [0, 1, 1e30]}, ["strategy.order[2] = 1e+30 is out of range"]),
    ({"device": [0, 1, 1], "order": [0, 2, 2]}, ["strategy.order[2] = 2 repeats node 1's position", "a permutation of 0..2"]),
    ({"device": [0, 1, 1], "config_id": None}, ["strategy.config_id must be a list of config indices"]),
    ({"device": [0, 1, 1], "config_id": [None, -1, -1]}, ["strategy.config_id[0] = None is not an integer"]),
    ({"device": [0, 1, 5]}, ["node 2 (v2) is placed on device 5", "devices 0..1"]),
    ({"device": [0, 1, 1], "order": [2, 1, 0]}, ["order must respect every edge"]),
])
def test_a_bad_strategy_is_one_line_naming_the_field(tmp_path: Path, fields: dict[str, Any], fragments: list[str]) -> None:
    p = write(tmp_path / "s.json", {"format": "harness.strategy/1", **fields})
    err = refused(lambda: replay(p), str(p), *fragments, kind=StrategyError)
    assert "Traceback" not in str(err)


def test_a_good_hand_written_strategy_replays(tmp_path: Path) -> None:
    p = write(tmp_path / "s.json", {"format": "harness.strategy/1", "device": [0, 1, 1], "order": [0, 1, 2]})
    assert replay(p).strategy.device.tolist() == [0, 1, 1]


# ---------------------------------------------------------------------------- plan_graph stays in its folder
def with_plan_graph(folder: Path, name: str) -> Path:
    """A strategy file in ``folder`` whose plan graph (the job's graph itself) is ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    d = Strategy.placement([0, 1, 1]).to_dict()
    d.update(plan_graph=name, plan_origin=[0, 1, 2])
    return write(folder / "strategy.json", d)


def test_a_plan_graph_beside_the_strategy_file_replays(tmp_path: Path) -> None:
    GRAPH.save(tmp_path / PLAN_GRAPH_FILE)
    plan = replay(with_plan_graph(tmp_path, PLAN_GRAPH_FILE))
    assert plan.graph.names == GRAPH.names and plan.origin.tolist() == [0, 1, 2]
    os.symlink(tmp_path / PLAN_GRAPH_FILE, tmp_path / "alias.json")  # a link that stays in the folder
    assert replay(with_plan_graph(tmp_path, "alias.json")).graph.num_nodes == 3


@pytest.mark.parametrize("name", ["../outside.json", "sub/plan_graph.json", "..", ".", "{abs}"])
def test_a_plan_graph_outside_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    GRAPH.save(tmp_path / "outside.json")
    (tmp_path / "job" / "sub").mkdir(parents=True)
    GRAPH.save(tmp_path / "job" / "sub" / "plan_graph.json")
    p = with_plan_graph(tmp_path / "job", name.format(abs=tmp_path / "outside.json"))
    refused(lambda: replay(p), str(p), "must be a plain file name in the strategy file's own folder", kind=ReplayError)


def test_a_symbolic_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    GRAPH.save(tmp_path / "outside.json")
    (tmp_path / "job").mkdir()
    os.symlink(tmp_path / "outside.json", tmp_path / "job" / PLAN_GRAPH_FILE)
    p = with_plan_graph(tmp_path / "job", PLAN_GRAPH_FILE)
    refused(lambda: replay(p), str(p), "is a link to", "outside the strategy file's folder", kind=ReplayError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_as_the_strategy_file_is_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "s.json"
    os.mkfifo(fifo)
    refused(lambda: replay(fifo), f"strategy file {fifo} is a FIFO", kind=StrategyError)


def test_the_command_line_names_the_node_and_field(tmp_path: Path) -> None:
    p = write(tmp_path / "s.json", {"format": "harness.strategy/1", "device": [0] * 12 + [None]})
    out = tmp_path / "run"
    r = run_harness("model=lenet5", "cluster=p100x4", "algo=from_file", f"algo.path={p}", "graph.granularity=layer",
                    f"hydra.run.dir={out}", timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "strategy.device[12] = None is not an integer" in r.stderr.strip().splitlines()[-1]
    assert not (out / "result.json").exists()
