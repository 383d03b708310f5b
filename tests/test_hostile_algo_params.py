"""Issue 32: every declared parameter of every registered algorithm (conf/algo/*.yaml) is checked
for its type and range when the job builds the algorithm (``harness.app.run.build_algorithm``):
NaN, infinity, a negative number, a bool or a string where a number belongs, a string or a
number where ``true``/``false`` belongs and an unknown name where a choice belongs are each one
line naming the algorithm and the key, never a traceback or a result.

The parameters under test are read from the classes' signatures, so an algorithm added with a
parameter nobody checks fails here."""

from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from harness.app.run import build_algorithm
from harness.core.errors import OptionError
from tests.helpers import make_cluster, make_graph, refused, run_harness

ROOT = Path(__file__).resolve().parents[1]
YAMLS = sorted((ROOT / "conf" / "algo").glob("*.yaml"))
#: keys that are not values to range-check: the label, the input file, HRL's environment object
NOT_VALUES = {"name", "path", "environment"}
#: values a parameter takes although they look hostile, with the reason (none so far: a -1, NaN
#: or infinity is meaningless for every parameter; a zero is tried separately below)
BAD_NUMBERS: list[Any] = [math.nan, math.inf, -math.inf, -1, True, "abc"]


def yaml_config(path: Path) -> dict[str, Any]:
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(cfg, dict)
    return cfg


def signature(path: Path) -> dict[str, inspect.Parameter]:
    module, _, name = str(yaml_config(path)["_target_"]).rpartition(".")
    return dict(inspect.signature(getattr(importlib.import_module(module), name).__init__).parameters)


def kind_of(param: inspect.Parameter) -> str:
    """``number``, ``bool``, ``choice`` or ``other``, by the parameter's annotation."""
    ann = str(param.annotation)
    if "int" in ann or "float" in ann:
        return "number"
    if ann.startswith("bool"):
        return "bool"
    if ann.startswith("str"):
        return "choice"
    return "other"


def parameters(kind: str) -> list[tuple[str, str]]:
    """(yaml file stem, key) of every parameter of ``kind`` of every registered algorithm, seed included."""
    out = []
    for path in YAMLS:
        sig = signature(path)
        keys = [k for k in sig if k not in ("self", *NOT_VALUES)]
        out += [(path.stem, k) for k in keys if kind_of(sig[k]) == kind]
    return out


def build(stem: str, seed: Any = 0, **values: Any) -> Any:
    """The algorithm of conf/algo/<stem>.yaml with ``values`` set, built as a job builds it."""
    algo = {**yaml_config(ROOT / "conf" / "algo" / f"{stem}.yaml"), **values}
    if stem == "from_file":
        algo.setdefault("path", "strategy.json")
        if algo["path"] == "???":
            algo["path"] = "strategy.json"
    return build_algorithm(OmegaConf.create({"algo": algo, "seed": seed}))


def key_label(key: str) -> str:
    return "seed" if key == "seed" else f"algo.{key}"


def test_the_parameter_lists_are_not_empty() -> None:
    """The introspection finds what the yaml files declare (a guard on the tests below)."""
    numbers, bools, choices = (dict.fromkeys(parameters(k)) for k in ("number", "bool", "choice"))
    assert {("optcnn", "budget_s"), ("flexflow_mcmc", "beta"), ("hrl", "seed"), ("m_sct", "lp_time_limit_s"),
            ("fddps", "min_time_ms"), ("hrl", "time_budget_s"), ("flexflow_mcmc", "iterations")} <= set(numbers)
    assert {("heft", "insertion"), ("celeritas", "adjust"), ("fddps", "compiled")} <= set(bools)
    assert {("flexflow_mcmc", "iterations"), ("optcnn", "cutoff"), ("hrl", "seed")} <= set(integer_parameters())
    assert {("optcnn", "space"), ("fddps", "slot"), ("data_parallel", "graph")} <= set(choices)


@pytest.mark.parametrize("stem, key", parameters("number"), ids=lambda x: str(x))
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_a_hostile_number_is_one_line_naming_the_algorithm_and_key(stem: str, key: str, value: Any) -> None:
    kw: dict[str, Any] = {"seed": value} if key == "seed" else {key: value}
    err = refused(lambda: build(stem, **kw), f"algo={stem}: ", key_label(key), kind=OptionError)
    assert "got" in str(err)


def integer_parameters() -> list[tuple[str, str]]:
    """The numeric parameters whose annotation admits no float (counts, ids, seeds)."""
    out = []
    for stem, key in parameters("number"):
        if "float" not in str(signature(ROOT / "conf" / "algo" / f"{stem}.yaml")[key].annotation):
            out.append((stem, key))
    return out


@pytest.mark.parametrize("stem, key", integer_parameters(), ids=lambda x: str(x))
def test_a_fraction_where_an_integer_belongs_is_refused(stem: str, key: str) -> None:
    kw: dict[str, Any] = {"seed": 2.5} if key == "seed" else {key: 2.5}
    refused(lambda: build(stem, **kw), f"algo={stem}: ", key_label(key), "integer", kind=OptionError)


@pytest.mark.parametrize("stem, key", parameters("number"), ids=lambda x: str(x))
def test_zero_is_refused_where_it_means_nothing(stem: str, key: str) -> None:
    """Zero is a valid seed, device id, number of rounds, threshold, decay, merge ratio, minimum
    time, parameter limit, failing signal, FD-DPS horizon (0: exact), a layer search's budget
    (0: the best baseline of its space at once) or ZeRO stage (0: plain DDP); for every other
    parameter (HRL's and m-SCT's time limits, counts, rates, memory caps, parallel degrees) it is refused."""
    zero_ok = {"seed", "device", "max_rounds", "threshold", "baseline_decay", "merge_ratio", "min_time_ms", "max_param_MiB",
               "failing_signal", "horizon", "exact_up_to", "beta", "budget_s", "zero"}
    kw: dict[str, Any] = {"seed": 0} if key == "seed" else {key: 0}
    if key in zero_ok:
        build(stem, **kw)
    else:
        refused(lambda: build(stem, **kw), f"algo={stem}: ", key_label(key), kind=OptionError)


@pytest.mark.parametrize("stem, key", parameters("bool"), ids=lambda x: str(x))
@pytest.mark.parametrize("value", ["no", "false", 2, 0.5])
def test_a_flag_takes_true_or_false_only(stem: str, key: str, value: Any) -> None:
    refused(lambda: build(stem, **{key: value}), f"algo={stem}: ", f"algo.{key}", "true", kind=OptionError)


@pytest.mark.parametrize("stem, key", parameters("choice"), ids=lambda x: str(x))
def test_a_choice_names_its_options(stem: str, key: str) -> None:
    refused(lambda: build(stem, **{key: "bogus"}), f"algo={stem}: ", f"algo.{key}", "must be one of", "'bogus'", kind=OptionError)


@pytest.mark.parametrize("stem, values", [
    ("flexflow_mcmc", {"beta": 0.0, "patience": 1, "budget_s": None, "iterations": 1}),
    ("m_sct", {"threshold": 0.0, "lp_time_limit_s": 0.5}),
    ("m_sct", {"threshold": 1.0}),
    ("hrl", {"baseline_decay": 1.0, "time_budget_s": 2.5, "num_groups": 3}),
    ("optcnn", {"budget_s": None, "cutoff": 2, "space": "pase", "product": "at_most", "mapping": "spread"}),
    ("optcnn_dfs", {"budget_s": None}),
    ("fddps", {"horizon": 0, "compiled": None, "split_dim": "channel"}),
    ("fddps", {"horizon": 5.0}),
    ("pase", {"cutoff": "auto", "dtype": "float32"}),
    ("megatron", {"tp": 8, "pp": 8, "vpp": 3, "dp": None, "schedule": None, "zero": 0, "stages": "balanced", "recompute": "selective"}),
    ("megatron", {"schedule": "zb_h1", "zero": 3, "stages": [3, 4, 3]}),
    ("megatron", {"pp": 2, "zero": 3, "gather_once": True}),
    ("megatron", {"tp": 2, "pp": 2, "scatter_gather": False}),
    ("fsdp", {"tp": 2, "recompute": "full", "reshard_after_forward": False}),
    ("data_parallel", {"graph": "stack", "micro_batch": 4}),
])
def test_the_values_the_papers_allow_are_taken(stem: str, values: dict[str, Any]) -> None:
    algo = build(stem, **values)
    described = algo.describe()
    for k, v in values.items():
        if k in described:
            assert described[k] == v


def test_gather_once_needs_zero_3() -> None:
    refused(lambda: build("megatron", zero=1, gather_once=True), "algo=megatron: ", "algo.gather_once", "algo.zero=3", kind=OptionError)


def test_keep_lp_grads_needs_zero_0_or_1() -> None:
    refused(lambda: build("megatron", zero=2, keep_lp_grads=True), "algo=megatron: ", "algo.keep_lp_grads", "algo.zero=1", kind=OptionError)


def test_grad_accumulation_is_one_of_three_and_needs_unsharded_gradients() -> None:
    refused(lambda: build("megatron", grad_accumulation="sometimes"), "algo.grad_accumulation", "fused", kind=OptionError)
    refused(lambda: build("megatron", zero=3, grad_accumulation="hook"), "algo=megatron: ", "algo.grad_accumulation", "algo.zero=1",
            kind=OptionError)


def test_blocking_sends_is_a_flag() -> None:
    refused(lambda: build("megatron", blocking_sends="sometimes"), "algo.blocking_sends", kind=OptionError)


def test_scatter_gather_is_a_flag() -> None:
    refused(lambda: build("megatron", scatter_gather="maybe"), "algo.scatter_gather", kind=OptionError)


def test_a_list_of_split_ops_must_be_names() -> None:
    refused(lambda: build("fddps", split_ops="aten.mm.default"), "algo.split_ops must be a list of op names", kind=OptionError)
    refused(lambda: build("fastt", split_ops=[1, 2]), "algo.split_ops", kind=OptionError)


# ---------------------------------------------------------------------------- through the command line
@pytest.mark.parametrize("overrides, fragments", [
    (["algo=hrl", "seed=-1"], ["seed must be an integer >= 0, got -1"]),
    (["algo=flexflow_mcmc", "algo.beta=nan", "cluster=p100x4"], ["algo=flexflow_mcmc: algo.beta must be a finite number >= 0"]),
    (["algo=m_sct", "algo.lp_time_limit_s=-5"], ["algo=m_sct: algo.lp_time_limit_s must be > 0, got -5"]),
])
def test_the_command_line_names_the_parameter(tmp_path: Path, overrides: list[str], fragments: list[str]) -> None:
    out = tmp_path / "run"
    r = run_harness("model=lenet5", *overrides, f"hydra.run.dir={out}", timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert any(all(f in line for f in fragments) for line in r.stderr.splitlines()), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not (out / "result.json").exists()


# ---------------------------------------------------------------------------- a batch too small to split
def test_data_parallel_refuses_a_batch_smaller_than_the_device_count() -> None:
    from algorithms.baselines import DataParallel

    g = make_graph(3, [(0, 1), (1, 2)])
    g.meta["batch_size"] = 1
    refused(lambda: DataParallel().plan(g, make_cluster(4), None), "splits the batch 4 ways", "model.batch_size) is 1",
            "algo.devices <= 1")
    g.meta["batch_size"] = 4
    assert DataParallel().plan(g, make_cluster(4), None).strategy.configs[0].degree == 4
    g.meta["batch_size"] = 2
    assert DataParallel(devices=2).plan(g, make_cluster(4), None).strategy.configs[0].degree == 2
