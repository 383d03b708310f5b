"""Numeric precision of a captured step (``harness/core/precision.py`` and where it is used).

Pins: the ``Precision`` names and math modes (``math_of``); CUDA autocast's op lists as
applied at capture (GEMMs and convolutions in FP16 / BF16, norms, softmax and losses in FP32,
FP32 master weights, cached weight casts, loss scaling for ``amp_fp16``); the
half-precision captures (``fp16`` / ``bf16``); apex O2's ``fp16_master`` (an FP16 model cast
from FP32 masters once per step, no per-op casts, the loss on FP32 logits, the unscale folded
into the gradient copy) and what it costs against autocast's ``amp_fp16`` on one step; that
``amp_fp8`` is refused on operator and layer graphs; that the temporary autocast kernels do not
outlive a capture; the batch probe under AMP; the layer-graph and non-torch sources'
handling of ``precision``; the peaks a math mode maps to (``math_peak`` / ``node_peaks``);
and ``python -m harness ... precision=amp_fp16`` end to end.  The FP8 recipe of a transformer
block is ``tests/test_fp8.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.core.capture import CaptureError, TensorSpec, capture
from harness.core.cluster import DeviceSpec
from harness.core.costs import math_peak, node_peaks
from harness.core.graph import FORWARD, REPLICATED, UPDATE, OpGraph
from harness.core.kernels import CONV_FWD, CONV_KINDS, GEMM, MEM, NCOLS, KernelTable
from harness.core.precision import (
    BF16, FP8, FP16, FP32, FP64, INT, LOSS_SCALE, MATH, PRECISIONS, TF32, Precision, PrecisionError, cuda_autocast, math_of,
)

REPO = Path(__file__).resolve().parents[1]

#: the precisions an operator graph is captured in (``amp_fp8`` is a transformer stack graph's)
OP_PRECISIONS = tuple(p for p in PRECISIONS if p != "amp_fp8")

GEMM_CONV_TARGETS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.convolution.default",
                     "aten.convolution_backward.default")


class Net(nn.Module):
    """conv, batch norm, relu, linear, layer norm, softmax, log-softmax and an explicit NLL loss
    (its targets are the second input), then a linear head (the step adds cross-entropy)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 8 * 8, 32)
        self.ln = nn.LayerNorm(32)
        self.out = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        h = self.ln(self.fc(h))
        h = torch.softmax(h, dim=1) * h
        logp = torch.log_softmax(h, dim=1)
        nll = F.nll_loss(logp, t, reduction="none")
        return self.out(h) + nll[:, None]


class Unrolled(nn.Module):
    """One nn.Linear applied at every step of an unrolled loop (an RNN's shared weight)."""

    steps = 5

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(self.steps):
            h = torch.tanh(self.cell(h))
        return self.head(h)


INPUTS = [TensorSpec((3, 8, 8)), TensorSpec((), "int64", 10)]
LABEL = TensorSpec((), "int64", 10)
BATCH = 8


def capture_net(precision: str) -> OpGraph:
    return capture(Net, INPUTS, LABEL, batch_size=BATCH, name="net", precision=precision)


@pytest.fixture(scope="module")
def graphs() -> dict[str, OpGraph]:
    return {p: capture_net(p) for p in OP_PRECISIONS}


def nodes_of(g: OpGraph, target: str, layer: str | None = None) -> list[int]:
    hits = [v for v, t in enumerate(g.targets) if t == target and (layer is None or g.layer_names[g.layer[v]] == layer)]
    assert hits, f"no {target} node" + (f" in layer {layer}" if layer else "")
    return hits


def first_dtype(g: OpGraph, v: int) -> str:
    assert g.out_dtypes is not None
    return g.out_dtypes[v][0]


def forward_activation_bytes(g: OpGraph) -> int:
    """Bytes of the forward pass's data-dependent outputs (a weight's cast is not an activation)."""
    return int(g.out_bytes[(g.phase == FORWARD) & ~g.free & (g.batch_role != REPLICATED)].sum())


# ---------------------------------------------------------------------------- names and math
def test_precision_rejects_unknown_names_and_lists_the_options() -> None:
    for name in PRECISIONS:
        assert Precision(name).name == name
    with pytest.raises(PrecisionError, match="fp64") as e:
        Precision("fp64")
    for option in PRECISIONS:
        assert option in str(e.value)
    assert issubclass(PrecisionError, ValueError)


def test_precision_properties() -> None:
    assert PRECISIONS == ("fp32", "tf32", "amp_fp16", "amp_bf16", "fp16", "bf16", "fp16_master", "amp_fp8")
    assert [Precision(p).autocast_dtype for p in PRECISIONS] == [None, None, "float16", "bfloat16", None, None, None, "bfloat16"]
    assert [Precision(p).param_dtype for p in PRECISIONS] == ["float32"] * 4 + ["float16", "bfloat16", "float32", "float32"]
    assert [Precision(p).model_dtype for p in PRECISIONS] == ["float32"] * 4 + ["float16", "bfloat16", "float16", "float32"]
    assert [Precision(p).compute_dtype for p in PRECISIONS] == ["float32"] * 2 + ["float16", "bfloat16"] * 2 + ["float16", "bfloat16"]
    assert [Precision(p).loss_scaling for p in PRECISIONS] == [False, False, True, False, False, False, True, False]
    assert [p for p in PRECISIONS if Precision(p).master_copy] == ["fp16_master"]
    assert [p for p in PRECISIONS if Precision(p).fp8_linears] == ["amp_fp8"]
    assert MATH[FP8] == "fp8" and len(MATH) == 7


def test_math_of_follows_pytorchs_tf32_flags() -> None:
    # fp32: cudnn.allow_tf32 (convolutions) is on, matmul.allow_tf32 is off; AMP keeps that for FP32 ops
    for p in ("fp32", "amp_fp16", "amp_bf16", "fp16_master", "amp_fp8"):
        assert math_of("float32", True, Precision(p)) == TF32
        assert math_of("float32", False, Precision(p)) == FP32
    assert math_of("float32", False, Precision("tf32")) == TF32
    assert math_of("float32", True, Precision("tf32")) == TF32
    for p in PRECISIONS:
        assert math_of("float16", False, Precision(p)) == FP16
        assert math_of("bfloat16", True, Precision(p)) == BF16
        assert math_of("float64", False, Precision(p)) == FP64
        assert math_of("int64", False, Precision(p)) == INT
        assert math_of("", True, Precision(p)) == FP32


# ---------------------------------------------------------------------------- AMP capture
@pytest.mark.parametrize("prec, half", [("amp_fp16", "float16"), ("amp_bf16", "bfloat16")])
def test_amp_runs_gemms_and_convolutions_in_half_precision(graphs: dict[str, OpGraph], prec: str, half: str) -> None:
    g = graphs[prec]
    hits = [v for v, t in enumerate(g.targets) if t in GEMM_CONV_TARGETS]
    assert len(hits) >= 7  # conv, 2 addmm forward; conv backward, 4 mm backward
    for v in hits:
        assert set(g.out_dtypes[v]) == {half}, (g.targets[v], g.out_dtypes[v])
    ref = graphs["fp32"]
    for v, t in enumerate(ref.targets):
        if t in GEMM_CONV_TARGETS:
            assert set(ref.out_dtypes[v]) == {"float32"}


@pytest.mark.parametrize("prec", ["amp_fp16", "amp_bf16"])
def test_amp_runs_cuda_autocasts_fp32_list_in_fp32(graphs: dict[str, OpGraph], prec: str) -> None:
    g = graphs[prec]
    # their inputs are half precision (a linear layer's output), the ops run in FP32
    for target in ("aten.native_layer_norm.default", "aten._softmax.default"):
        for v in nodes_of(g, target):
            assert first_dtype(g, v) == "float32", target
    assert first_dtype(g, nodes_of(g, "aten._log_softmax.default", "model")[0]) == "float32"
    assert first_dtype(g, nodes_of(g, "aten.nll_loss_forward.default", "model")[0]) == "float32"
    assert first_dtype(g, nodes_of(g, "aten.native_layer_norm_backward.default")[0]) == "float32"
    # batch norm is on no list: it runs in the dtype of its input, the convolution's half output
    bn, conv = nodes_of(g, "aten.native_batch_norm.default")[0], nodes_of(g, "aten.convolution.default")[0]
    assert first_dtype(g, bn) == first_dtype(g, conv) == Precision(prec).autocast_dtype


def test_cross_entropy_loss_of_half_logits_runs_nll_in_fp32(unrolled: dict[str, OpGraph]) -> None:
    """aten::cross_entropy_loss has a CPU-autocast kernel and no CUDA one: it must fall through
    and decompose, so that nll_loss (on CUDA's FP32 list) runs in FP32."""
    g = unrolled["amp_fp16"]  # its logits are a linear layer's FP16 output
    assert first_dtype(g, nodes_of(g, "aten.addmm.default", "head")[0]) == "float16"
    assert first_dtype(g, nodes_of(g, "aten.nll_loss_forward.default", "loss")[0]) == "float32"


def test_same_padding_convolution_runs_in_fp16_under_amp() -> None:
    """aten::conv2d.padding (a CPU-autocast-only composite) falls through to the convolution
    it calls, which CUDA autocast runs in FP16."""
    class Same(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding="same")
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).flatten(1))

    g = capture(Same, [TensorSpec((3, 8, 8))], LABEL, batch_size=2, precision="amp_fp16")
    assert first_dtype(g, nodes_of(g, "aten.convolution.default")[0]) == "float16"


def test_amp_keeps_fp32_master_weights_and_adds_casts(graphs: dict[str, OpGraph]) -> None:
    ref = graphs["fp32"]
    assert ref.meta["dtype"] == "float32"
    assert "aten._to_copy.default" not in ref.targets
    for prec in ("amp_fp16", "amp_bf16"):
        g = graphs[prec]
        assert g.param_names == ref.param_names
        np.testing.assert_array_equal(g.param_bytes, ref.param_bytes)
        assert g.meta["dtype"] == "float32" and g.meta["precision"] == prec
        casts = nodes_of(g, "aten._to_copy.default")
        # every weight of the GEMMs / convolution is cast to half for the forward pass ...
        cast_params = {g.param_names[p] for v in casts for p in g.params_of(v).tolist()}
        assert {"conv.weight", "conv.bias", "fc.weight", "fc.bias", "out.weight", "out.bias"} <= cast_params
        # ... but the layer norm's and batch norm's parameters are read as they are
        assert not cast_params & {"ln.weight", "ln.bias", "bn.weight", "bn.bias"}
        # the updates run in FP32 on the master weights
        for p, u in enumerate(g.update_node.tolist()):
            if u >= 0:
                assert first_dtype(g, u) == "float32"


def test_amp_kernel_rows_record_half_math(graphs: dict[str, OpGraph]) -> None:
    for prec, half in (("amp_fp16", FP16), ("amp_bf16", BF16)):
        kt = graphs[prec].kernels
        assert kt is not None
        compute = kt.kind != MEM
        assert compute.sum() >= 8
        assert set(kt.math[compute].tolist()) == {half}
        # FP32 ops (layer norm) record FP32 math on their memory-bound rows
        ln = nodes_of(graphs[prec], "aten.native_layer_norm.default")[0]
        assert kt.math[kt.node == ln].tolist() == [FP32]


def test_amp_shrinks_activations(graphs: dict[str, OpGraph]) -> None:
    ref = forward_activation_bytes(graphs["fp32"])
    for prec in ("amp_fp16", "amp_bf16"):
        assert forward_activation_bytes(graphs[prec]) < 0.6 * ref
    assert forward_activation_bytes(graphs["fp16"]) < 0.51 * ref
    # the convolution's output (the largest activation) is exactly half as big
    conv_ref = graphs["fp32"].out_bytes[nodes_of(graphs["fp32"], "aten.convolution.default")[0]]
    conv_amp = graphs["amp_fp16"].out_bytes[nodes_of(graphs["amp_fp16"], "aten.convolution.default")[0]]
    assert conv_amp * 2 == conv_ref == BATCH * 16 * 8 * 8 * 4


def test_loss_scaling_under_amp_fp16(graphs: dict[str, OpGraph]) -> None:
    trainable = int((graphs["fp32"].grad_node >= 0).sum())
    assert trainable == 10

    def update_ops(g: OpGraph) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in np.flatnonzero(g.phase == UPDATE).tolist():
            out[g.targets[v]] = out.get(g.targets[v], 0) + 1
        return out

    # GradScaler: one unscale (a multiply by 1 / LOSS_SCALE) per gradient before its update
    assert update_ops(graphs["amp_fp16"]) == {"aten.mul.Tensor": trainable, "aten.add.Tensor": trainable}
    assert update_ops(graphs["amp_bf16"]) == {"aten.add.Tensor": trainable}
    assert update_ops(graphs["fp32"]) == {"aten.add.Tensor": trainable}
    for p, u in enumerate(graphs["amp_fp16"].update_node.tolist()):
        if u >= 0:  # the update reads the unscaled gradient
            g = graphs["amp_fp16"]
            assert "aten.mul.Tensor" in [g.targets[s] for s in g.predecessors(u).tolist()]
    # and the loss is scaled once before the backward pass: a multiply and its backward (the seed
    # gradient times the scale), both in the loss's backward phase
    extra = [[g.layer_names[g.layer[v]] for v, t in enumerate(g.targets) if t == "aten.mul.Tensor" and g.phase[v] != UPDATE]
             for g in (graphs["amp_fp16"], graphs["amp_bf16"])]
    assert len(extra[0]) == len(extra[1]) + 2
    assert extra[0].count("loss") == extra[1].count("loss") + 2
    assert LOSS_SCALE == 2.0**16


# ---------------------------------------------------------------------------- apex O2: fp16_master
def test_fp16_master_runs_an_fp16_model_cast_from_fp32_masters(graphs: dict[str, OpGraph]) -> None:
    g, ref = graphs["fp16_master"], graphs["fp32"]
    # the masters are the parameters: FP32, as many bytes as the FP32 step's
    np.testing.assert_array_equal(g.param_bytes, ref.param_bytes)
    assert g.meta["dtype"] == "float32" and g.meta["precision"] == "fp16_master"
    for v, t in enumerate(g.targets):
        if t in GEMM_CONV_TARGETS:
            assert set(g.out_dtypes[v]) == {"float16"}, t
    # each floating parameter but batch norm's (keep_batchnorm_fp32) is cast once, forward, in its own layer
    floating = {n for p, n in enumerate(g.param_names) if g.grad_node[p] >= 0}  # the trainable parameters
    casts = [v for v in nodes_of(g, "aten._to_copy.default") if g.phase[v] == FORWARD and len(g.params_of(v))]
    cast_params = [g.param_names[int(p)] for v in casts for p in g.params_of(v)]
    assert sorted(cast_params) == sorted(floating - {"bn.weight", "bn.bias"})
    for v in casts:
        (p,) = g.params_of(v).tolist()
        assert g.layer_names[g.layer[v]] == g.param_names[p].rsplit(".", 1)[0]
        assert first_dtype(g, v) == "float16"
    # no autocast: layer norm and softmax run in FP16; the loss takes FP32 logits
    for target in ("aten.native_layer_norm.default", "aten._softmax.default"):
        assert first_dtype(g, nodes_of(g, target)[0]) == "float16", target
    assert first_dtype(g, nodes_of(g, "aten._log_softmax.default", "model")[0]) == "float16"
    assert first_dtype(g, nodes_of(g, "aten._log_softmax.default", "loss")[0]) == "float32"


def test_fp16_master_scales_the_loss_and_folds_the_unscale_into_the_gradient_copy(graphs: dict[str, OpGraph]) -> None:
    g = graphs["fp16_master"]
    updates = np.flatnonzero(g.phase == UPDATE).tolist()
    assert sorted({g.targets[v] for v in updates}) == ["aten.add.Tensor"]  # no separate unscale kernel
    bn = {g.param_names.index(n) for n in ("bn.weight", "bn.bias")}
    for p, u in enumerate(g.update_node.tolist()):
        if u < 0:
            continue
        assert first_dtype(g, u) == "float32"  # the update runs on the master
        if p not in bn:  # its gradient is the FP16 gradient copied to FP32 (the cast's backward)
            feeding = [s for s in g.predecessors(u).tolist() if g.targets[s] == "aten._to_copy.default"]
            assert feeding and first_dtype(g, feeding[0]) == "float32"
    # the loss is scaled once before the backward pass, as under amp_fp16
    def loss_muls(h: OpGraph) -> int:
        return sum(1 for v, t in enumerate(h.targets) if t == "aten.mul.Tensor" and h.phase[v] != UPDATE
                   and h.layer_names[h.layer[v]] == "loss")
    assert loss_muls(g) == loss_muls(graphs["amp_fp16"]) == loss_muls(graphs["amp_bf16"]) + 2


def test_fp16_master_moves_half_the_bytes_of_autocasts_fp32_ops(graphs: dict[str, OpGraph]) -> None:
    """Autocast (O1) runs softmax and log-softmax in FP32 on FP16 inputs cast up; O2's FP16 model
    runs them in FP16: exactly half the bytes, and no cast of an activation before them."""
    o1, o2 = graphs["amp_fp16"], graphs["fp16_master"]
    for target in ("aten._softmax.default", "aten._log_softmax.default"):
        v1, v2 = nodes_of(o1, target, "model")[0], nodes_of(o2, target, "model")[0]
        assert o1.work_bytes[v1] == 2 * o2.work_bytes[v2], target

    def activation_casts(h: OpGraph) -> list[int]:
        return [v for v in nodes_of(h, "aten._to_copy.default") if h.phase[v] == FORWARD and not len(h.params_of(v))]
    assert [o2.layer_names[o2.layer[v]] for v in activation_casts(o2)] == ["loss"]  # the logits, to FP32
    assert len(activation_casts(o1)) > 1


def test_fp16_master_layer_graph_is_its_fp16_model(lenet_source: Any) -> None:
    lg = lenet_source.layer_graph(precision="fp16_master")
    assert lg.meta["dtype"] == "float16" and lg.meta["precision"] == "fp16_master"
    np.testing.assert_array_equal(lg.param_bytes, lenet_source.layer_graph(precision="fp16").param_bytes)


def test_fp16_master_transformer_block_runs_its_kernels_in_fp16() -> None:
    """On a transformer's stack graph an FP16 model with FP32 masters runs the kernels of
    amp_fp16 (FP16 GEMMs, 2-byte activations; Megatron-LM's --fp16), not FP32 ones."""
    from harness.core.llm.block_work import block_work
    from harness.core.llm.shard import Shard
    from harness.core.llm.spec import TransformerSpec

    spec = TransformerSpec("t", 2, 256, 8, 8, 1024, False, 128, 1000, False)
    o1, o2 = (block_work(spec, 128, p, Shard(tp=2, micro_batch=2), False) for p in ("amp_fp16", "fp16_master"))
    for phase in ("fwd", "bwd_input", "bwd_weight"):
        a, b = getattr(o1, phase), getattr(o2, phase)
        np.testing.assert_array_equal(a.dims, b.dims)
        assert set(b.math.tolist()) == {FP16} and a.math.tolist() == b.math.tolist()
    assert o1.stored_bytes == o2.stored_bytes


# ---------------------------------------------------------------------------- amp_fp8's scope
def test_amp_fp8_is_refused_on_operator_and_layer_graphs(lenet_source: Any) -> None:
    with pytest.raises(CaptureError, match="stack graph") as e:
        capture(Net, INPUTS, LABEL, batch_size=2, name="net", precision="amp_fp8")
    assert "precision=amp_bf16" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CaptureError, match="stack graph"):
        lenet_source.layer_graph(precision="amp_fp8")
    with pytest.raises(CaptureError, match="stack graph"):
        lenet_source.stack_graph(precision="amp_fp8")


def test_check_device_refuses_fp8_without_fp8_tensor_cores() -> None:
    a100 = {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12}
    h100 = {**a100, "float8": 1978.9e12}
    with pytest.raises(PrecisionError, match="A100-SXM4-80GB has no float8 peak") as e:
        Precision("amp_fp8").check_device("A100-SXM4-80GB", a100)
    assert "precision=amp_bf16" in str(e.value)
    Precision("amp_fp8").check_device("H100-SXM5-80GB", h100)
    for p in OP_PRECISIONS:  # nothing else needs FP8 units
        Precision(p).check_device("A100-SXM4-80GB", a100)


@pytest.mark.parametrize("prec, half, math", [("fp16", "float16", FP16), ("bf16", "bfloat16", BF16)])
def test_half_precision_halves_parameters_and_runs_every_kernel_in_half(graphs: dict[str, OpGraph], prec: str,
                                                                        half: str, math: int) -> None:
    g, ref = graphs[prec], graphs["fp32"]
    floating = np.array([not n.endswith("num_batches_tracked") for n in ref.param_names])
    assert (~floating).sum() == 1  # batch norm's int64 step counter keeps its dtype
    np.testing.assert_array_equal(2 * g.param_bytes[floating], ref.param_bytes[floating])
    np.testing.assert_array_equal(g.param_bytes[~floating], ref.param_bytes[~floating])
    assert g.meta["dtype"] == half
    assert "aten._to_copy.default" not in g.targets
    kt = g.kernels
    assert kt is not None
    assert set(kt.math[kt.kind != MEM].tolist()) == {math}
    for v, t in enumerate(g.targets):
        if t in GEMM_CONV_TARGETS:
            assert set(g.out_dtypes[v]) == {half}


def test_fp32_and_tf32_math_of_kernel_rows(graphs: dict[str, OpGraph]) -> None:
    kt32, kt_tf = graphs["fp32"].kernels, graphs["tf32"].kernels
    assert kt32 is not None and kt_tf is not None
    gemm, conv = kt32.kind == GEMM, np.isin(kt32.kind, CONV_KINDS)
    assert gemm.sum() >= 4 and conv.sum() >= 2
    assert set(kt32.math[gemm].tolist()) == {FP32} and set(kt32.math[conv].tolist()) == {TF32}
    assert set(kt_tf.math[kt_tf.kind != MEM].tolist()) == {TF32}
    # the same graph otherwise: TF32 is a math mode, not a dtype
    assert graphs["tf32"].targets == graphs["fp32"].targets
    np.testing.assert_array_equal(graphs["tf32"].out_bytes, graphs["fp32"].out_bytes)


def test_batch_probe_aligns_under_amp(graphs: dict[str, OpGraph]) -> None:
    for prec in OP_PRECISIONS:
        g = graphs[prec]
        assert g.meta["batch_probe"] is True, prec
        kt = g.kernels
        conv_rows = np.flatnonzero(kt.kind == CONV_FWD)
        assert kt.bdim[conv_rows].tolist() == [0]
        fwd_gemm = [r for r in np.flatnonzero(kt.kind == GEMM) if g.phase[kt.node[r]] == FORWARD]
        assert [int(kt.bdim[r]) for r in fwd_gemm] == [1, 1]  # addmm: m is the batch


# ---------------------------------------------------------------------------- weight-cast cache
@pytest.fixture(scope="module")
def unrolled() -> dict[str, OpGraph]:
    return {p: capture(Unrolled, [TensorSpec((8,))], TensorSpec((), "int64", 4), batch_size=4, precision=p)
            for p in ("fp32", "amp_fp16", "amp_bf16")}


def test_a_weight_read_at_every_step_is_cast_once(unrolled: dict[str, OpGraph]) -> None:
    for prec, expected in (("fp32", 0), ("amp_fp16", 1), ("amp_bf16", 1)):
        g = unrolled[prec]
        w = g.param_names.index("cell.weight")
        casts = [v for v in range(g.num_nodes) if g.targets[v] == "aten._to_copy.default" and w in g.params_of(v).tolist()]
        assert len(casts) == expected, prec
        gemms = [v for v in range(g.num_nodes) if g.targets[v] == "aten.addmm.default" and g.phase[v] == FORWARD]
        assert len(gemms) == Unrolled.steps + 1
    g = unrolled["amp_fp16"]
    w = g.param_names.index("cell.weight")
    cast = next(v for v in range(g.num_nodes) if g.targets[v] == "aten._to_copy.default" and w in g.params_of(v).tolist())
    # the one cast (through views) feeds the GEMM of every step
    views = [s for s in g.successors(cast).tolist() if g.free[s]]
    fed = {u for s in views for u in g.successors(s).tolist()} | set(g.successors(cast).tolist())
    gemms = [u for u in fed if g.targets[u] == "aten.addmm.default" and g.phase[u] == FORWARD]
    assert len(gemms) == Unrolled.steps


# ---------------------------------------------------------------------------- autocast hygiene
def _cpu_autocast_dtypes() -> list[torch.dtype]:
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = torch.mm(a, b)
        return [m.dtype, torch.softmax(m, 1).dtype, torch.exp(m).dtype, F.layer_norm(m, (8,)).dtype]


def test_cuda_autocast_rules_apply_on_real_tensors_inside_the_block_only(graphs: dict[str, OpGraph]) -> None:
    # CPU autocast's own policy: mm lowered, softmax / exp / layer norm run in the input's dtype
    cpu_policy = [torch.bfloat16] * 4
    assert _cpu_autocast_dtypes() == cpu_policy  # after the AMP captures of the fixture
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    with cuda_autocast("bfloat16"):
        m = torch.mm(a, b)
        # dot needs one dtype: the promote list casts to the widest input
        inside = [m.dtype, torch.softmax(m, 1).dtype, torch.exp(m).dtype, F.layer_norm(m, (8,)).dtype,
                  torch.dot(a[0], m[0]).dtype, torch.relu(m).dtype, torch.softmax(m, 1, dtype=torch.bfloat16).dtype]
    assert inside == [torch.bfloat16, torch.float32, torch.float32, torch.float32, torch.float32, torch.bfloat16,
                      torch.bfloat16]
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::softmax.int", "AutocastCPU")
    assert _cpu_autocast_dtypes() == cpu_policy
    assert not torch.is_autocast_enabled("cpu")


def test_cuda_autocast_cleans_up_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with cuda_autocast("float16"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::softmax.int", "AutocastCPU")
            raise RuntimeError("boom")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::softmax.int", "AutocastCPU")
    assert not torch.is_autocast_enabled("cpu")
    # CPU autocast's own kernels (mm is on its list) survive
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", "AutocastCPU")


def test_unknown_precision_is_refused_at_capture() -> None:
    with pytest.raises(PrecisionError):
        capture(Net, INPUTS, LABEL, batch_size=2, precision="int8")


# ---------------------------------------------------------------------------- peaks of math modes
def test_math_peak_and_node_peaks() -> None:
    v100 = DeviceSpec("V100", {"float32": 15.7e12, "float16": 125e12}, 900e9, 16 << 30)
    h100 = DeviceSpec("H100", {"float32": 67e12, "tf32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12},
                      3350e9, 80 << 30)
    assert math_peak(v100, TF32) == 15.7e12  # no TF32 units: the FP32 rate
    assert math_peak(v100, BF16) == 15.7e12
    assert math_peak(v100, FP16) == 125e12
    assert math_peak(h100, TF32) == 494.7e12
    assert math_peak(h100, BF16) == 989.4e12
    assert math_peak(h100, FP32) == math_peak(h100, FP64) == math_peak(h100, INT) == 67e12
    assert math_peak(h100, FP8) == 67e12  # no float8 entry: the FP32 rate (check_device refuses amp_fp8 there)
    h100_fp8 = DeviceSpec("H100", {**h100.peak_flops, "float8": 1978.9e12}, 3350e9, 80 << 30)
    assert math_peak(h100_fp8, FP8) == 1978.9e12
    # a node takes the math of its most FLOP-heavy kernel: a conv backward whose bias row is FP32
    geo = [4, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1]
    kt = KernelTable([0, 0, 1], [2, MEM, GEMM], [geo, [100] + [0] * (NCOLS - 1), [1, 8, 8, 8] + [0] * 10],
                     [0, 0, 1], [FP16, FP32, TF32], [False] * 3)
    g = OpGraph(names=["a", "b", "c"], targets=["x"] * 3, phase=[0] * 3, layer=[0] * 3, layer_names=["l"],
                flops=[1.0, 1.0, 0.0], out_bytes=[0] * 3, work_bytes=[0] * 3, free=[False] * 3, batch_role=[0] * 3,
                coloc=[-1] * 3, src=[], dst=[], nbytes=[], kernels=kt, meta={"dtype": "float16"})
    assert kt.node_math(3, default=INT).tolist() == [FP16, TF32, INT]
    np.testing.assert_array_equal(node_peaks(g, h100), [989.4e12, 494.7e12, 67e12])
    g.kernels = None  # without a table: every node at the peak of meta["dtype"]
    np.testing.assert_array_equal(node_peaks(g, h100), [989.4e12] * 3)


# ---------------------------------------------------------------------------- graph sources
@pytest.fixture(scope="module")
def lenet_source() -> Any:
    from harness.app.compose import compose
    from harness.app.run import build

    cfg = compose(["model=lenet5", "model.batch_size=8"])
    return build(cfg)[0]


def test_layer_graph_precision(lenet_source: Any) -> None:
    lg32 = lenet_source.layer_graph()
    lg16 = lenet_source.layer_graph(precision="fp16")
    assert lg32.param_bytes.sum() > 0
    np.testing.assert_array_equal(2 * lg16.param_bytes, lg32.param_bytes)
    assert lg16.meta["precision"] == "fp16" and lg32.meta["precision"] == "fp32"
    assert lg16.meta["dtype"] == "float16"
    for prec in ("amp_fp16", "amp_bf16"):
        with pytest.raises(CaptureError, match="operator graph"):
            lenet_source.layer_graph(precision=prec)
    with pytest.raises(PrecisionError):
        lenet_source.layer_graph(precision="fp8")


def test_synthetic_and_file_sources_refuse_other_precisions(tmp_path: Path, graphs: dict[str, OpGraph]) -> None:
    from harness.core.models import GraphFile, SyntheticGraph

    syn = SyntheticGraph(nodes=20)
    assert syn.op_graph(precision="fp32").num_nodes == 20
    path = tmp_path / "g.json"
    graphs["fp32"].save(path)
    gf = GraphFile(str(path))
    assert gf.op_graph(precision="fp32").num_nodes == graphs["fp32"].num_nodes
    for prec in ("tf32", "amp_fp16", "bf16"):
        with pytest.raises(CaptureError, match=f"precision={prec}"):
            syn.op_graph(precision=prec)
        with pytest.raises(CaptureError, match=f"precision={prec}"):
            gf.op_graph(precision=prec)


def test_precision_config_key_reaches_the_capture() -> None:
    from harness.app.compose import compose
    from harness.app.run import build, config_hash

    base = ["model=lenet5", "model.batch_size=8", "algo=single_device"]
    c32, c16 = compose(base), compose(base + ["precision=amp_fp16"])
    assert c32.graph.precision == "fp32" and c16.graph.precision == "amp_fp16"
    assert config_hash(c32) != config_hash(c16)
    source = build(c16)[0]
    g = source.op_graph(**c16.graph)
    assert g.meta["precision"] == "amp_fp16" and "aten._to_copy.default" in g.targets


def test_cli_runs_an_amp_job_end_to_end(tmp_path: Path) -> None:
    from harness.app.compose import compose
    from harness.app.run import config_hash

    overrides = ["model=lenet5", "algo=single_device", "precision=amp_fp16"]
    out = tmp_path / "job"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={out}", "output.trace=false",
                           "output.gantt=false", "output.quiet=true"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((out / "result.json").read_text())
    assert row["model"] == "lenet5" and row["step_time_s"] > 0
    assert row["config_hash"] == config_hash(compose(overrides))
    assert row["config_hash"] != config_hash(compose(overrides[:2]))
    # the default cluster is P100 (PCIe): AMP kernels are DeepBench's fp16_pseudo fits
    assert "fp16_pseudo" in json.dumps(row["costs_report"])
