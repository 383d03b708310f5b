"""The on-disk graph cache (harness.core.graph_cache): a model config is captured once, a later
job loads the same graph bit for bit and says so in result.json; the key follows the config and
the code; parallel jobs capture once; a corrupt entry is captured again; graph.cache=false."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

from harness.app.compose import compose
from harness.core import graph_cache
from harness.core.graph_cache import cached, entry_key
from harness.app.run import build
from tests.helpers import run_harness


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv(graph_cache.CACHE_ENV, str(d))
    return d


def fresh_source(*overrides: str):
    """A newly built source (no in-process memo of its graph: the module-level memo is keyed by config,
    so tests clear it)."""
    from harness.core import models

    models._CACHE.clear()
    models._LAYER_CACHE.clear()
    return build(compose(["model=lenet5", *overrides]))[0]


def test_a_second_capture_of_a_config_loads_the_same_graph_from_disk(cache_dir):
    first = fresh_source()
    g1 = first.op_graph()
    assert first.graph_source == "captured" and len(list(cache_dir.glob("op-*.pkl"))) == 1
    second = fresh_source()
    g2 = second.op_graph()
    assert second.graph_source == "disk"
    assert g1.to_dict() == g2.to_dict() and np.array_equal(g1.flops, g2.flops)
    l1 = fresh_source().layer_graph()
    again = fresh_source()
    assert again.layer_graph().to_dict() == l1.to_dict() and again.graph_source == "disk"


def test_another_config_or_option_is_another_entry_and_cache_off_writes_nothing(cache_dir):
    fresh_source().op_graph()
    fresh_source("model.batch_size=4").op_graph()
    fresh_source().op_graph(optimizer="none")
    assert len(list(cache_dir.glob("op-*.pkl"))) == 3
    off = fresh_source("model.batch_size=3")
    off.op_graph(cache=False)
    assert off.graph_source == "captured (cache off)" and len(list(cache_dir.glob("op-*.pkl"))) == 3


def test_the_key_follows_the_code(monkeypatch):
    k = entry_key("op", ["x"])
    monkeypatch.setitem(graph_cache._DIGESTS, "core", "edited")
    assert entry_key("op", ["x"]) != k


def test_a_corrupt_entry_is_captured_again(cache_dir):
    cache_dir.mkdir()
    g, hit = cached("op", ["p"], lambda: {"a": 1})
    assert (g, hit) == ({"a": 1}, False)
    entry = next(cache_dir.glob("op-*.pkl"))
    entry.write_bytes(b"not a pickle")
    assert cached("op", ["p"], lambda: {"a": 2}) == ({"a": 2}, False)
    assert pickle.loads(entry.read_bytes()) == {"a": 2}


def test_parallel_misses_build_once(cache_dir):
    calls = []
    gate = threading.Event()

    def slow_build():
        calls.append(1)
        gate.wait(2)
        return [1, 2, 3]

    results = []
    threads = [threading.Thread(target=lambda: results.append(cached("op", ["same"], slow_build))) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(hit for _, hit in results) == [False, True, True, True]


def test_result_json_says_where_the_graph_came_from(tmp_path, cache_dir):
    rows = []
    for i, extra in enumerate(([], [], ["graph.cache=false"])):
        out = tmp_path / f"run{i}"
        r = run_harness("model=lenet5", "algo=m_topo", "cluster=p100x4", "output.worth=false", f"hydra.run.dir={out}", *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        rows.append(json.loads((out / "result.json").read_text()))
    assert [(r["graph_from_cache"], r["graph_source"]) for r in rows] == [
        (False, "captured"), (True, "disk"), (False, "captured (cache off)")]
    assert rows[0]["step_time_s"] == rows[1]["step_time_s"] == rows[2]["step_time_s"]
