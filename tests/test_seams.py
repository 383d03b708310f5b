"""The declared seams (harness/core/sources.py, harness/core/costs.CostModel,
simulators/simulate.SimulatorBackend): what every registered component of conf/ is, checked on
instances, so that a component that drops a member the harness asks for fails here, not in a job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate

from harness.app.compose import compose
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.kernels import GEMM, MEM, NCOLS, KernelTable
from harness.core.sources import GraphSource, LayerGraphSource, StackSource, TorchSource
from simulators.simulate import ExecutingBackend, SimulatorBackend

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_GRAPH = REPO / "docs" / "examples" / "profiled_graph.json"


@pytest.mark.parametrize("overrides, kinds", [
    (["model=lenet5"], (GraphSource, LayerGraphSource, TorchSource)),
    (["model=synthetic"], (GraphSource, LayerGraphSource)),
    (["model=pase_alexnet"], (GraphSource, LayerGraphSource)),
    (["model=from_file", f"model.path={EXAMPLE_GRAPH}"], (GraphSource, LayerGraphSource)),
    (["model=llm"], (GraphSource, StackSource)),
])
def test_model_sources_are_graph_sources(overrides, kinds):
    source = instantiate(compose(overrides).model, _recursive_=False)
    for kind in kinds:
        assert isinstance(source, kind), f"{overrides} is not a {kind.__name__}"
    if TorchSource not in kinds:
        assert not isinstance(source, TorchSource)


def test_a_source_without_a_layer_graph_says_so_in_one_line():
    source = instantiate(compose(["model=synthetic", "model.nodes=20"]).model, _recursive_=False)
    with pytest.raises(UserError, match="has no layer graph"):
        source.layer_graph()


@pytest.mark.parametrize("costs", sorted(p.stem for p in (REPO / "conf" / "costs").glob("*.yaml")))
def test_every_cost_model_answers_the_protocol(costs):
    cfg = compose([f"costs={costs}", "cluster=p100x4"])
    cluster = instantiate(cfg.cluster, _convert_="all")
    try:
        model = instantiate(cfg.costs, _partial_=True, _convert_="all")(cluster=cluster)
    except Exception as e:  # a profiled model without profiles of this machine: a one-line refusal is fine here
        if any(isinstance(x, UserError) for x in (e, e.__cause__)):
            pytest.skip(f"costs={costs} cannot be built here: {e}")
        raise
    assert isinstance(model, CostModel)
    assert model.sync in ("ring", "ps")
    routes = model.transfer_routes()
    if routes is not None:  # the tables say what transfer_time says
        lat, bw = routes
        assert model.transfer_time(1e6, 0, 1) == pytest.approx(lat[0, 1] + 1e6 / bw[0, 1])
    assert isinstance(model.report(), dict)
    # a kernel table (a transformer block's kernels): seconds per node, finite, > 0 where it has rows
    gemm = KernelTable([0, 0, 2], [GEMM, MEM, GEMM], [[1, 256, 256, 256] + [0] * (NCOLS - 4), [10**6] + [0] * (NCOLS - 1),
                                                      [1, 64, 64, 64] + [0] * (NCOLS - 4)], [1, 0, 1], [0, 0, 0], [False] * 3)
    t = model.kernel_times(gemm, 0, 3)
    assert t.shape == (3,) and np.all(np.isfinite(t)) and t[0] > 0 and t[1] == 0 and t[2] > 0


@pytest.mark.parametrize("sim, executes", [("default", False), ("realrun", True)])
def test_every_simulator_is_a_backend(sim, executes):
    backend = instantiate(compose([f"sim={sim}"]).sim, _convert_="all")
    assert isinstance(backend, SimulatorBackend)
    assert isinstance(backend, ExecutingBackend) == executes
