"""Graph capture: FLOPs, views, phases, layers, batch roles, co-location, granularity."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from harness.core.capture import CaptureError, TensorSpec, capture
from harness.core.graph import BACKWARD, BATCHED, FORWARD, PARTIAL, REPLICATED, UPDATE
from harness.core.models import TorchModel
from tests.helpers import IMG, LABEL, Tiny


@pytest.fixture(scope="module")
def tiny():
    return capture(Tiny, IMG, LABEL, batch_size=16, name="tiny")


def node(g, target_prefix, phase=None):
    hits = [i for i, t in enumerate(g.targets) if t.startswith(target_prefix) and (phase is None or g.phase[i] == phase)]
    assert hits, f"no {target_prefix} node"
    return hits[0]


def test_flops_from_pytorch_formulas(tiny):
    g = tiny
    conv = node(g, "aten.convolution.default")
    assert g.flops[conv] == 2 * 16 * 8 * 8 * 8 * 3 * 3 * 3
    addmm = node(g, "aten.addmm")
    assert g.flops[addmm] == 2 * 16 * 512 * 10
    # weight gradient of the first conv only (no input gradient needed)
    cb = node(g, "aten.convolution_backward")
    assert g.flops[cb] == 2 * 16 * 8 * 8 * 8 * 3 * 3 * 3
    relu = node(g, "aten.relu")
    assert g.flops[relu] == 0 and g.work_bytes[relu] == 2 * 16 * 8 * 8 * 8 * 4  # costed by bytes


def test_views_getitem_detach_are_free(tiny):
    g = tiny
    for i, t in enumerate(g.targets):
        if t in ("getitem", "aten.view.default", "aten.t.default", "aten.detach.default"):
            assert g.free[i] and g.work_bytes[i] == 0, t
    assert not g.free[node(g, "aten.relu")]


def test_phases_and_layers(tiny):
    g = tiny
    layer = lambda i: g.layer_names[g.layer[i]]  # noqa: E731
    assert g.phase[node(g, "aten.convolution.default")] == FORWARD
    assert layer(node(g, "aten.convolution.default")) == "conv"
    cb = node(g, "aten.convolution_backward")
    assert g.phase[cb] == BACKWARD and layer(cb) == "conv"
    bnb = node(g, "aten.native_batch_norm_backward")
    assert g.phase[bnb] == BACKWARD and layer(bnb) == "bn"
    assert layer(node(g, "aten._log_softmax.default")) == "loss"
    assert layer(node(g, "aten.mm", BACKWARD)) == "fc"
    # phases come in order: forward, then backward, then update
    assert (np.diff(g.phase) >= 0).all()
    assert (g.phase == UPDATE).sum() == 6  # one SGD update per parameter


def test_batch_roles(tiny):
    g = tiny
    assert g.batch_role[node(g, "aten.convolution.default")] == BATCHED
    assert g.batch_role[node(g, "aten.convolution_backward")] == PARTIAL  # weight gradient
    assert g.batch_role[node(g, "aten.nll_loss_forward")] == PARTIAL  # the loss
    assert all(g.batch_role[g.phase == UPDATE] == REPLICATED)
    assert g.meta["batch_probe"] is True
    axis = g.meta["batch_axis"]
    assert axis[node(g, "aten.convolution.default")] == 0


def test_parameters_gradients_updates_and_colocation(tiny):
    g = tiny
    assert g.param_names[:6] == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    assert g.param_bytes[0] == 8 * 3 * 3 * 3 * 4
    conv = node(g, "aten.convolution.default")
    assert set(g.params_of(conv).tolist()) == {0, 1}
    for p in range(6):
        u = int(g.update_node[p])
        assert g.phase[u] == UPDATE
        assert g.coloc[u] >= 0
        # the update sits with the op that computes the gradient
        grad = int(g.grad_node[p])
        assert g.coloc[grad] == g.coloc[u]
    assert g.coloc[node(g, "aten.convolution_backward")] == g.coloc[int(g.update_node[0])]


def test_edges_carry_bytes_and_shape_only_reads_are_dropped(tiny):
    g = tiny
    conv = node(g, "aten.convolution.default")
    bn = node(g, "aten.native_batch_norm.default")
    e = np.flatnonzero((g.src == conv) & (g.dst == bn))
    assert len(e) == 1 and g.nbytes[e[0]] == 16 * 8 * 8 * 8 * 4
    ones = node(g, "aten.ones_like")
    assert len(g.predecessors(ones)) == 0


def test_fake_tensors_make_huge_batches_free():
    # 4096 x 64 x 224 x 224 float32 activations would be 51 GiB per tensor
    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 64, 3, padding=1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.c(x).mean((2, 3)))

    t = time.perf_counter()
    g = capture(Big, [TensorSpec((3, 224, 224))], LABEL, batch_size=4096)
    assert time.perf_counter() - t < 30
    assert g.out_bytes.max() >= 4096 * 64 * 224 * 224 * 4


def test_layer_granularity_is_a_dag_with_the_same_flops(tiny):
    g = capture(Tiny, IMG, LABEL, batch_size=16, granularity="layer")
    assert g.num_nodes < tiny.num_nodes
    assert g.flops.sum() == pytest.approx(tiny.flops.sum())
    assert (g.src < g.dst).all()


def test_core_aten_decomposes_into_more_nodes(tiny):
    g = capture(Tiny, IMG, LABEL, batch_size=16, granularity="core_aten")
    assert g.num_nodes > tiny.num_nodes
    assert g.meta["batch_probe"] is True


def test_capture_errors_name_the_model():
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow cannot be traced
                return x
            return -x

    with pytest.raises(CaptureError, match="could not trace a training step of 'broken'"):
        capture(Broken, IMG, LABEL, batch_size=2, name="broken")
    with pytest.raises(CaptureError, match="unknown granularity 'ops'"):
        capture(Tiny, IMG, LABEL, granularity="ops")


def test_torch_model_memoises_and_any_factory_plugs_in():
    m = TorchModel("tiny", {"_target_": "tests.test_capture.Tiny"}, 4, [{"shape": [3, 8, 8]}], {"shape": [], "dtype": "int64", "high": 10})
    g1 = m.op_graph()
    assert m.op_graph() is g1
    assert g1.meta["batch_size"] == 4
    # graph.colocate_gradients: a module's forward and backward ops share one group
    g2 = m.op_graph(colocate_gradients=True)
    conv_f = next(i for i, t in enumerate(g2.targets) if t == "aten.convolution.default")
    conv_b = next(i for i, t in enumerate(g2.targets) if t.startswith("aten.convolution_backward"))
    assert g1.coloc[conv_f] == -1 and g2.coloc[conv_f] >= 0 and g2.coloc[conv_f] == g2.coloc[conv_b]
    assert g2.num_nodes == g1.num_nodes and m.op_graph() is g1
    with pytest.raises(CaptureError, match="needs a _target_"):
        TorchModel("x", {}, 4, [], {})
