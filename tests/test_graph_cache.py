"""The on-disk graph cache (harness.core.graph_cache): a model config is captured once, a later
job loads the same graph bit for bit and says so in result.json; the key follows the config and
the code; parallel jobs capture once; a corrupt entry is captured again; graph.cache=false; an
entry holds data only (npz + JSON, read without pickle): a planted file never runs code."""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

from harness.app.compose import compose
from harness.core import graph_cache
from harness.core.graph_cache import NotStorable, cached, decode, encode, entry_key
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
    assert first.graph_source == "captured" and len(list(cache_dir.glob("op-*.npz"))) == 1
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
    assert len(list(cache_dir.glob("op-*.npz"))) == 3
    off = fresh_source("model.batch_size=3")
    off.op_graph(cache=False)
    assert off.graph_source == "captured (cache off)" and len(list(cache_dir.glob("op-*.npz"))) == 3


def test_the_key_follows_the_code(monkeypatch):
    k = entry_key("op", ["x"])
    monkeypatch.setitem(graph_cache._DIGESTS, "core", "edited")
    assert entry_key("op", ["x"]) != k


def test_a_corrupt_entry_is_captured_again(cache_dir):
    cache_dir.mkdir()
    g, hit = cached("op", ["p"], lambda: {"a": 1})
    assert (g, hit) == ({"a": 1}, False)
    entry = next(cache_dir.glob("op-*.npz"))
    entry.write_bytes(b"not an npz")
    assert cached("op", ["p"], lambda: {"a": 2}) == ({"a": 2}, False)
    assert cached("op", ["p"], lambda: {"a": 3}) == ({"a": 2}, True)


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


class Planted:
    """A pickle that runs code when it is loaded (it touches a file)."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def test_a_planted_entry_never_runs_code(cache_dir, tmp_path):
    """A pickle put where an entry goes, and an npz whose arrays are pickled objects, are read as
    misses (captured again), and the code in them never runs."""
    mark = tmp_path / "ran"
    cached("op", ["p"], lambda: {"a": 1})
    entry = next(cache_dir.glob("op-*.npz"))
    entry.write_bytes(pickle.dumps(Planted(mark)))
    assert cached("op", ["p"], lambda: {"a": 2}) == ({"a": 2}, False)
    with open(entry, "wb") as f:
        np.savez(f, __doc__=np.frombuffer(b'{"@array": "a0"}', dtype=np.uint8), a0=np.array([Planted(mark)], dtype=object))
    assert cached("op", ["p"], lambda: {"a": 3}) == ({"a": 3}, False)
    assert not mark.exists()


def test_an_entry_names_only_the_graph_classes():
    """A document that names any other class than the graphs' is no entry."""
    doc = json.dumps({"@class": "Popen", "fields": {"args": ["touch", "x"]}}).encode()
    with pytest.raises(KeyError):
        decode({"__doc__": np.frombuffer(doc, dtype=np.uint8)})


def test_old_pickle_entries_are_not_read(cache_dir):
    """Entries of the pickle format (``.pkl``) are another key's files: never opened."""
    cache_dir.mkdir()
    (cache_dir / f"op-{entry_key('op', ['p'])}.pkl").write_bytes(pickle.dumps({"a": "old"}))
    assert cached("op", ["p"], lambda: {"a": "new"}) == ({"a": "new"}, False)


def test_the_format_keeps_types_and_refuses_what_it_cannot_hold(cache_dir):
    value = {"t": (1, 2.5, "x"), "l": [None, True], "n": np.int64(7), "f": np.float32(0.5), 3: "int key",
             "a": np.arange(4, dtype=np.int16), "m": np.zeros((2, 3), bool)}
    back = decode(encode(value))
    assert back.keys() == value.keys() and back["t"] == (1, 2.5, "x") and back["l"] == [None, True] and back[3] == "int key"
    assert type(back["n"]) is np.int64 and type(back["f"]) is np.float32
    assert back["a"].dtype == np.int16 and np.array_equal(back["a"], value["a"]) and back["m"].shape == (2, 3)
    for bad in (object(), {"x": np.array([object()], dtype=object)}, [lambda: 1]):
        with pytest.raises(NotStorable):
            encode(bad)
    _, hit = cached("op", ["unstorable"], lambda: [object()])
    assert not hit and not list(cache_dir.glob("op-*.npz"))  # built, not stored
