"""The contract of every registered algorithm (conf/algo/*.yaml): its class declares its
``graph_kind``, lists its parameters explicitly (a misspelt key is refused, not swallowed),
takes every key of its yaml and reports them in ``describe()`` (result.json's ``algo_params``)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from algorithms.base import Algorithm

ROOT = Path(__file__).resolve().parents[1]
YAMLS = sorted((ROOT / "conf" / "algo").glob("*.yaml"))
#: parameters that steer how an algorithm runs, not what it plans: not in algo_params
NOT_DESCRIBED = {"progress", "environment"}


def load(path: Path) -> tuple[type, dict[str, Any]]:
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert isinstance(cfg, dict)
    module, _, name = str(cfg.pop("_target_")).rpartition(".")
    return getattr(importlib.import_module(module), name), cfg


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_graph_kind_is_declared_by_the_class_or_a_base_that_is_not_algorithm(path):
    cls, _ = load(path)
    assert issubclass(cls, Algorithm)
    owners = [k for k in cls.__mro__ if "graph_kind" in vars(k) and k is not Algorithm and k is not object]
    assert owners, f"{cls.__name__} does not declare graph_kind"
    assert getattr(cls, "graph_kind") in ("op", "layer", "stack")


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_init_lists_every_yaml_key_and_no_kwargs(path):
    cls, cfg = load(path)
    params = inspect.signature(cls.__init__).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), f"{cls.__name__}.__init__ takes **kwargs"
    missing = set(cfg) - set(params)
    assert not missing, f"{path.name}: {sorted(missing)} are not parameters of {cls.__name__}.__init__"
    assert {"name", "seed"} <= set(params)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_describe_reports_the_configured_parameters(path):
    cls, cfg = load(path)
    algo = cls(**cfg, seed=3)
    described = algo.describe()
    assert described["name"] == cfg["name"] and described["seed"] == 3
    expected = {k: v for k, v in cfg.items() if k not in NOT_DESCRIBED}
    assert {k: described.get(k) for k in expected} == expected
    assert set(described) <= set(inspect.signature(cls.__init__).parameters)  # defaults of keys the yaml omits too


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.stem)
def test_a_misspelt_parameter_is_refused(path):
    cls, cfg = load(path)
    with pytest.raises(TypeError, match="slott"):
        cls(**cfg, slott="idle")


def test_the_job_refuses_a_misspelt_parameter():
    from harness.app.compose import compose
    from harness.app.run import build

    with pytest.raises(Exception, match="slott"):
        build(compose(["algo=fddps", "model=lenet5", "+algo.slott=idle"]))


def test_an_algorithm_that_needs_an_input_is_left_out_of_every_algorithm_sweep():
    """The rule: a yaml with a mandatory ``???`` value needs an input (from_file's ``path``), so
    the leaderboard / scaling list (and the CLI test's sweep) leave it out; its constructor only
    keeps the value (the contracts above build it with ``???``), and planning without it is a
    one-line UserError."""
    from experiments.common import algorithms, needs_input
    from harness.core.errors import UserError
    from tests.helpers import make_cluster, make_graph

    needing = {p.stem for p in YAMLS if needs_input(p.stem)}
    assert needing == {"from_file"} and needs_input("from_file") == ["path"]
    assert not needing & set(algorithms())
    assert {p.stem for p in YAMLS} - needing <= set(algorithms())
    cls, cfg = load(ROOT / "conf" / "algo" / "from_file.yaml")
    with pytest.raises(UserError, match=r"^algo=from_file needs the strategy to replay: add algo.path="):
        cls(**cfg).plan(make_graph(2, [(0, 1)]), make_cluster(2), None)


def test_no_init_in_algorithms_takes_kwargs():
    """No constructor under algorithms/ swallows unknown keys (``**kw`` / ``**params``)."""
    bad = []
    for path in sorted((ROOT / "algorithms").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__" and node.args.kwarg is not None:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, f"__init__ with **kwargs: {bad}"
