"""Tests of the model zoo (harness/zoo) and its Hydra configs (conf/model/*.yaml).

Default-size models are only built on the meta device (no memory, no compute): parameter counts
are checked against published figures (or closed-form counts where no figure is published), and
meta forwards with each conf file's inputs check output shapes. Real forward + backward passes
and fake-tensor graph captures use shrunken sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn import functional as F

from experiments.common import zoo_models
from harness.core.zoo import (
    alexnet,
    holography,
    inception,
    lenet,
    nasnet,
    nmt,
    pnasnet,
    resnet,
    rnnlm,
    transformer,
    vgg,
)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
#: every zoo model registered in conf/model (a TorchModel file but custom), read from the files
MODEL_NAMES = tuple(zoo_models())
FACTORIES: dict[str, Callable[..., nn.Module]] = {
    name: get_method(OmegaConf.load(CONF_DIR / f"{name}.yaml").module._target_) for name in MODEL_NAMES
}


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_on_meta(factory: Callable[..., nn.Module], **kwargs: Any) -> nn.Module:
    with torch.device("meta"):
        return factory(**kwargs)


# --- parameter counts at the paper sizes -------------------------------------------------

# name -> (factory, published parameter count, relative tolerance)
PUBLISHED: dict[str, tuple[Callable[..., nn.Module], float, float]] = {
    "resnet50": (resnet.resnet50, 25.6e6, 0.01),
    "resnet101": (resnet.resnet101, 44.5e6, 0.01),
    "resnet200": (resnet.resnet200, 64.7e6, 0.01),
    "vgg16": (vgg.vgg16, 138.36e6, 0.001),
    # Inception-v3 without the auxiliary head (torchvision: 27.16M with it, 23.83M without).
    "inception_v3": (inception.inception_v3, 23.8e6, 0.01),
    # The single-tower AlexNet has 62.4M; the paper's two-GPU grouped layout is checked below.
    "alexnet": (alexnet.alexnet, 61.0e6, 0.03),
    # Keras NASNetLarge: 88.9M total, of which 88.75M trainable (the rest are BN statistics).
    "nasnet_large": (nasnet.nasnet_large, 88.9e6, 0.01),
    "pnasnet_mobile": (pnasnet.pnasnet_mobile, 5.1e6, 0.02),
    "lenet5": (lenet.lenet5, 61_706, 0.0),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_paper(name: str) -> None:
    factory, published, tolerance = PUBLISHED[name]
    count = count_parameters(build_on_meta(factory))
    assert abs(count - published) <= tolerance * published, f"{name}: {count:,} vs {published:,.0f}"


def test_alexnet_grouped_layout_is_the_papers_61m() -> None:
    count = count_parameters(build_on_meta(alexnet.alexnet, groups=2))
    assert abs(count - 60.97e6) <= 0.001 * 60.97e6


def test_counts_equal_the_torchvision_layouts() -> None:
    assert count_parameters(build_on_meta(resnet.resnet50)) == 25_557_032
    assert count_parameters(build_on_meta(resnet.resnet101)) == 44_549_160
    assert count_parameters(build_on_meta(inception.inception_v3)) == 23_834_568


def _lstm(input_size: int, hidden: int, bias: bool) -> int:
    return (input_size + hidden) * 4 * hidden + (4 * hidden if bias else 0)


def test_rnnlm_count_is_the_pase_layout() -> None:
    v, h = 50_000, 2048
    expected = v * h + 2 * _lstm(h, h, bias=False) + h * v
    assert count_parameters(build_on_meta(rnnlm.rnnlm)) == expected


def test_nmt_count_is_the_gnmt_layout() -> None:
    v, h = 32_000, 2048
    encoder = 2 * _lstm(h, h, True) + _lstm(2 * h, h, True) + 2 * _lstm(h, h, True)
    decoder = 4 * _lstm(2 * h, h, True)
    attention = 2 * h * h + h
    expected = 2 * v * h + encoder + decoder + attention + h * v
    assert count_parameters(build_on_meta(nmt.nmt)) == expected


def test_transformer_count_is_6_plus_6_layers_of_width_2048() -> None:
    v, d, ff = 37_000, 2048, 8192
    attention = 4 * (d * d + d)
    ffn = d * ff + ff + ff * d + d
    norm = 2 * d
    expected = v * d + 6 * (attention + ffn + 2 * norm) + 6 * (2 * attention + ffn + 3 * norm)
    assert count_parameters(build_on_meta(transformer.transformer)) == expected


def test_tensor_holography_count() -> None:
    filters, k = 24, 9
    first = 4 * filters * k + filters + 2 * filters
    middle = 28 * (filters * filters * k + filters + 2 * filters)
    last = (filters + 4) * 6 * k + 6 + 2 * 6
    assert count_parameters(build_on_meta(holography.tensor_holography)) == first + middle + last


# --- feature maps at the paper sizes (meta forward; every model's default output shape is
# checked with its conf file below) --------------------------------------------------------


def test_nasnet_large_feature_maps() -> None:
    """331 -> 165 (stem conv) -> 83 -> 42 (stem cells) -> 21 -> 11; 4032 penultimate."""
    with torch.device("meta"):
        model = nasnet.nasnet_large()
        assert isinstance(model, nasnet.CellNetwork)
        sizes: list[tuple[int, ...]] = []
        for cell in model.cells:
            cell.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[1:])))
        model(torch.empty(1, 3, 331, 331))
    assert len(sizes) == 2 + 18 + 2
    assert sizes[:3] == [(168, 83, 83), (336, 42, 42), (1008, 42, 42)]
    assert sizes[8] == (1344, 21, 21) and sizes[15] == (2688, 11, 11)
    assert sizes[-1] == (4032, 11, 11)


def test_pnasnet_mobile_feature_maps() -> None:
    with torch.device("meta"):
        model = pnasnet.pnasnet_mobile()
        assert isinstance(model, nasnet.CellNetwork)
        sizes: list[tuple[int, ...]] = []
        for cell in model.cells:
            cell.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[1:])))
        model(torch.empty(1, 3, 224, 224))
    assert sizes[0] == (65, 56, 56) and sizes[1] == (135, 28, 28)
    assert sizes[-1] == (1080, 7, 7) and len(sizes) == 2 + 9


# --- tiny real models: forward, backward, determinism, graph capture ---------------------


@dataclass(frozen=True)
class Tiny:
    """A shrunken model with inputs and the loss the harness would use."""

    factory: Callable[..., nn.Module]
    kwargs: dict[str, Any]
    inputs: Callable[[], list[Tensor]]
    out_shape: tuple[int, ...]
    loss: str = "cross_entropy"


def _images(c: int, s: int) -> Callable[[], list[Tensor]]:
    return lambda: [torch.randn(2, c, s, s)]


def _tokens(vocab: int, *lengths: int) -> Callable[[], list[Tensor]]:
    return lambda: [torch.randint(0, vocab, (2, n)) for n in lengths]


SMALL_RESNET: dict[str, Any] = {"num_classes": 7, "width": 4}
SMALL_IMAGES = (_images(3, 32), (2, 7))

TINY: dict[str, Tiny] = {
    "lenet5": Tiny(lenet.lenet5, {}, _images(1, 32), (2, 10)),
    "alexnet": Tiny(
        alexnet.alexnet,
        {"num_classes": 7, "image_size": 67, "widths": (8, 8, 8, 8, 8), "fc_width": 16},
        _images(3, 67),
        (2, 7),
    ),
    "vgg16": Tiny(
        vgg.vgg16,
        {"num_classes": 7, "image_size": 32, "widths": (4, 4, 8, 8, 8), "fc_width": 16},
        _images(3, 32),
        (2, 7),
    ),
    # Inception-v3 has fixed widths; 75x75 is the smallest input its grid reductions accept.
    "inception_v3": Tiny(inception.inception_v3, {"num_classes": 7}, _images(3, 75), (2, 7)),
    "resnet50": Tiny(resnet.resnet50, {**SMALL_RESNET, "layers": (1, 2, 1, 1)}, *SMALL_IMAGES),
    "resnet101": Tiny(resnet.resnet101, {**SMALL_RESNET, "layers": (1, 1, 3, 1)}, *SMALL_IMAGES),
    "resnet200": Tiny(resnet.resnet200, {**SMALL_RESNET, "layers": (1, 3, 3, 1)}, *SMALL_IMAGES),
    "transformer": Tiny(
        transformer.transformer,
        {
            "vocab_size": 50,
            "d_model": 16,
            "num_heads": 4,
            "d_ff": 32,
            "num_encoder_layers": 2,
            "num_decoder_layers": 2,
        },
        _tokens(50, 5, 4),
        (2, 4, 50),
    ),
    "nmt": Tiny(
        nmt.nmt,
        {"vocab_size": 50, "hidden_size": 8, "embed_dim": 6, "num_layers": 4},
        _tokens(50, 5, 4),
        (2, 4, 50),
    ),
    "rnnlm": Tiny(
        rnnlm.rnnlm,
        {"vocab_size": 50, "hidden_size": 8, "embed_dim": 6},
        _tokens(50, 5),
        (2, 5, 50),
    ),
    "tensor_holography": Tiny(
        holography.tensor_holography,
        {"num_layers": 8, "filters": 6},
        _images(4, 12),
        (2, 6, 12, 12),
        "mse",
    ),
    "nasnet_large": Tiny(
        nasnet.nasnet_large,
        {
            "num_classes": 7,
            "cells_per_stack": 1,
            "penultimate_filters": 192,
            "stem_multiplier": 1.0,
        },
        _images(3, 48),
        (2, 7),
    ),
    "pnasnet_mobile": Tiny(
        pnasnet.pnasnet_mobile,
        {"num_classes": 7, "num_cells": 3, "num_conv_filters": 6},
        _images(3, 48),
        (2, 7),
    ),
}


def training_loss(out: Tensor, target: Tensor, kind: str) -> Tensor:
    """The harness's losses: cross entropy over logits flattened to (N, C), or MSE."""
    if kind == "mse":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def make_target(out: Tensor, kind: str) -> Tensor:
    if kind == "mse":
        return torch.rand_like(out)
    return torch.randint(0, out.shape[-1], out.shape[:-1])


def test_tiny_table_covers_every_model() -> None:
    assert set(TINY) == set(MODEL_NAMES) == set(FACTORIES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    tiny = TINY[name]
    model = tiny.factory(**tiny.kwargs)
    inputs = tiny.inputs()
    out = model(*inputs)
    assert isinstance(out, Tensor) and tuple(out.shape) == tiny.out_shape
    assert out.dtype == torch.float32
    loss = training_loss(out, make_target(out, tiny.loss), tiny.loss)
    loss.backward()
    assert torch.isfinite(loss)
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient reaches {pname}"
        assert torch.isfinite(p.grad).all(), pname
    # No randomness in forward (dropout defaults to 0): same input, same output.
    with torch.no_grad():
        assert torch.equal(model(*inputs), model(*inputs))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_fake_graph_capture(name: str) -> None:
    """The harness's capture: make_fx on fake tensors of forward + loss + autograd.grad."""
    torch.manual_seed(0)
    tiny = TINY[name]
    model = tiny.factory(**tiny.kwargs)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    inputs = tiny.inputs()
    with torch.no_grad():
        target = make_target(model(*inputs), tiny.loss)

    def step(
        params: dict[str, Tensor], buffers: dict[str, Tensor], inputs: list[Tensor], target: Tensor
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        out = torch.func.functional_call(model, {**params, **buffers}, tuple(inputs))
        loss = training_loss(out, target, tiny.loss)
        return loss, torch.autograd.grad(loss, list(params.values()))

    graph = make_fx(step, tracing_mode="fake")(params, buffers, inputs, target).graph
    targets = {str(node.target) for node in graph.nodes if node.op == "call_function"}
    # Attention and recurrences are spelled out, as in the papers' TensorFlow graphs.
    assert not any("scaled_dot_product" in t or "lstm" in t or "_rnn" in t for t in targets)


def test_recurrent_graphs_grow_per_time_step() -> None:
    def matmul_count(model: nn.Module, *inputs: Tensor) -> int:
        graph = make_fx(model)(*inputs).graph
        return sum("mm" in str(n.target) for n in graph.nodes if n.op == "call_function")

    language_model = rnnlm.rnnlm(vocab_size=20, hidden_size=4, embed_dim=4)
    assert matmul_count(language_model, torch.zeros(1, 6, dtype=torch.long)) > matmul_count(
        language_model, torch.zeros(1, 3, dtype=torch.long)
    )
    gnmt = nmt.nmt(vocab_size=20, hidden_size=4, embed_dim=4, num_layers=2)
    src = torch.zeros(1, 3, dtype=torch.long)
    short = matmul_count(gnmt, src, torch.zeros(1, 2, dtype=torch.long))
    assert matmul_count(gnmt, src, torch.zeros(1, 5, dtype=torch.long)) > short


def test_transformer_decoder_is_causal() -> None:
    torch.manual_seed(0)
    model = transformer.transformer(
        vocab_size=30, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1, num_decoder_layers=2
    )
    model.eval()
    src = torch.randint(0, 30, (1, 5))
    tgt = torch.randint(0, 30, (1, 6))
    changed = tgt.clone()
    changed[0, 4] = (changed[0, 4] + 1) % 30
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize(
    ("name", "extra"), [("nasnet_large", {}), ("pnasnet_mobile", {"num_cells": 6})]
)
def test_cell_networks_without_skip_reduction_input(name: str, extra: dict[str, int]) -> None:
    # PNASNet then keeps the stride-2 cell's older input from the cell before (as TF-slim
    # does), which needs non-adjacent reductions, hence 6 cells.
    tiny = TINY[name]
    model = tiny.factory(**{**tiny.kwargs, **extra}, skip_reduction_layer_input=False)
    assert tuple(model(*tiny.inputs()).shape) == tiny.out_shape


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        transformer.transformer(d_model=30, num_heads=4)
    with pytest.raises(ValueError):
        nmt.nmt(num_layers=1)
    with pytest.raises(ValueError):
        nasnet.nasnet_large(penultimate_filters=100)
    with pytest.raises(ValueError):
        vgg.vgg16(image_size=16)


# --- conf/model/*.yaml --------------------------------------------------------------------


def load_model_conf(name: str, **overrides: Any) -> DictConfig:
    """The file as Hydra composes it: under the ``model`` key of the root config."""
    root = OmegaConf.create({"model": OmegaConf.load(CONF_DIR / f"{name}.yaml")})
    for key, value in overrides.items():
        OmegaConf.update(root, f"model.{key}", value)
    return root.model


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_conf_resolves_and_matches_its_module(name: str) -> None:
    cfg = load_model_conf(name)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    assert data["_target_"] == "harness.core.models.TorchModel"
    assert data["name"] == name
    assert data["loss"] in ("cross_entropy", "mse")
    assert isinstance(data["batch_size"], int) and data["batch_size"] > 0
    assert data["module"]["_target_"].startswith("harness.core.zoo.")

    # Build the configured module on meta and run a meta forward with the configured inputs.
    with torch.device("meta"):
        model = instantiate(cfg.module)
        inputs = []
        for spec in data["inputs"]:
            shape = (2, *spec["shape"])
            assert all(isinstance(n, int) for n in shape), spec
            inputs.append(torch.empty(shape, dtype=getattr(torch, spec["dtype"])))
        out = model(*inputs)
    target = data["target"]
    if data["loss"] == "mse":
        assert tuple(out.shape) == (2, *target["shape"])
        assert target["dtype"] == "float32"
    else:
        assert tuple(out.shape[:-1]) == (2, *target["shape"])
        assert target["dtype"] == "int64" and target["high"] == out.shape[-1]
    for spec in data["inputs"]:
        if spec["dtype"] == "int64":
            assert spec["high"] == out.shape[-1]  # token ids index the vocabulary


@pytest.mark.parametrize(
    ("name", "overrides", "input_shapes", "target_shape"),
    [
        ("transformer", {"src_len": 16, "tgt_len": 8, "vocab": 100}, [[16], [8]], [8]),
        ("nmt", {"src_len": 7, "tgt_len": 9}, [[7], [9]], [9]),
        ("rnnlm", {"seq_len": 12}, [[12]], [12]),
        ("resnet50", {"image_size": 64}, [[3, 64, 64]], []),
        ("vgg16", {"image_size": 64}, [[3, 64, 64]], []),
        ("tensor_holography", {"image_size": 32}, [[4, 32, 32]], [6, 32, 32]),
    ],
)
def test_conf_top_level_sizes_propagate(
    name: str, overrides: dict[str, int], input_shapes: list[list[int]], target_shape: list[int]
) -> None:
    data = OmegaConf.to_container(load_model_conf(name, **overrides), resolve=True)
    assert isinstance(data, dict)
    assert [spec["shape"] for spec in data["inputs"]] == input_shapes
    assert data["target"]["shape"] == target_shape
    if "vocab" in overrides:
        assert data["module"]["vocab_size"] == overrides["vocab"]
        assert data["target"]["high"] == overrides["vocab"]
    if name == "vgg16":
        assert data["module"]["image_size"] == 64


def test_conf_builds_a_small_real_model() -> None:
    """Hydra instantiate with overrides gives a working (tiny) model."""
    cfg = load_model_conf("transformer", vocab=40, src_len=6, tgt_len=5)
    model = instantiate(
        cfg.module, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
    )
    out = model(torch.randint(0, 40, (2, cfg.src_len)), torch.randint(0, 40, (2, cfg.tgt_len)))
    assert tuple(out.shape) == (2, 5, 40)
    assert torch.isfinite(out).all()
