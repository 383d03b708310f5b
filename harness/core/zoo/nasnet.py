"""NASNet-A Large (Zoph, Vasudevan, Shlens and Le 2018, "Learning transferable architectures
for scalable image recognition"), the 6@4032 ImageNet model, 331x331 input.

Cell definitions and wiring follow the authors' TF-slim code (``nets/nasnet/nasnet.py`` and
``nasnet_utils.py``):

* Each cell takes the previous two cell outputs. The older one is matched to the current one
  (ReLU + factorized reduction if its resolution is higher, ReLU + 1x1 conv + BN if only its
  width differs); the newer one goes through ReLU + 1x1 conv + BN. Five blocks each apply one
  operation to each of two hidden states and add the results; the hidden states no block used
  are concatenated (after a factorized reduction where their shape differs) into the output.
* Operations: ``separable_KxK_2`` = (ReLU, depthwise KxK, pointwise 1x1, BN) twice, the first
  depthwise conv carrying the stride; ``avg_pool_3x3`` / ``max_pool_3x3`` (SAME padding; avg
  excludes padding) followed by 1x1 conv + BN only where the width changes; ``none`` = identity,
  or ReLU + strided 1x1 conv + BN where stride or width require it. Strides apply only to ops
  reading the cell inputs.
* Network: 3x3/2 conv stem (32 x stem_multiplier filters) + BN, two reduction cells as stem
  cells (filters F/4 and F/2), then 3 stacks of N normal cells with a reduction cell before the
  second and third stack, filters doubling at each reduction (F, 2F, 4F); with
  ``skip_reduction_layer_input`` the normal cell after a reduction cell takes the cell before
  the reduction's input as its older input (the large model's setting). Head: ReLU, global
  average pool, dropout, FC. A normal cell outputs 6 x filters, so the penultimate layer has
  6 * 4F = 24F = 4032 channels for F = 168.

Left out: the auxiliary head and drop-path (both training-time regularizers; drop-path is
random and would make steps nondeterministic). 88.9M parameters.

The cell machinery here (``CellSpec``, ``Cell``, ``CellNetwork``) is shared with PNASNet-5
(``harness.core.zoo.pnasnet``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def batch_norm(channels: int) -> nn.BatchNorm2d:
    """BatchNorm with the TF-slim NASNet settings (decay 0.9997, epsilon 1e-3)."""
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.0003)


@dataclass(frozen=True, slots=True)
class CellSpec:
    """A NASNet-search-space cell: 5 blocks; block b applies ``operations[2b]`` to hidden state
    ``hiddenstate_indices[2b]`` and ``operations[2b+1]`` to ``hiddenstate_indices[2b+1]`` and
    adds them. States 0 and 1 are the (processed) current and previous cell outputs; block b
    creates state b + 2. ``used_hiddenstates[i]`` is 1 for states consumed by a block, which
    are left out of the output concatenation."""

    operations: tuple[str, ...]
    hiddenstate_indices: tuple[int, ...]
    used_hiddenstates: tuple[int, ...]


NASNET_A_NORMAL = CellSpec(
    operations=(
        "separable_5x5_2", "separable_3x3_2",
        "separable_5x5_2", "separable_3x3_2",
        "avg_pool_3x3", "none",
        "avg_pool_3x3", "avg_pool_3x3",
        "separable_3x3_2", "none",
    ),
    hiddenstate_indices=(0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
    used_hiddenstates=(1, 0, 0, 0, 0, 0, 0),
)

NASNET_A_REDUCTION = CellSpec(
    operations=(
        "separable_5x5_2", "separable_7x7_2",
        "max_pool_3x3", "separable_7x7_2",
        "avg_pool_3x3", "separable_5x5_2",
        "none", "avg_pool_3x3",
        "separable_3x3_2", "max_pool_3x3",
    ),
    hiddenstate_indices=(0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
    used_hiddenstates=(1, 1, 1, 0, 0, 0, 0),
)


class SeparableStack(nn.Module):
    """(ReLU, depthwise KxK, pointwise 1x1, BN) x num_layers; the first depthwise is strided."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int, num_layers: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for index in range(num_layers):
            layers += [
                nn.ReLU(),
                nn.Conv2d(
                    channels,
                    channels,
                    kernel_size,
                    stride=stride if index == 0 else 1,
                    padding=kernel_size // 2,
                    groups=channels,
                    bias=False,
                ),
                nn.Conv2d(channels, out_channels, 1, bias=False),
                batch_norm(out_channels),
            ]
            channels = out_channels
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class PoolOp(nn.Module):
    """3x3 max or average pool (SAME padding), then 1x1 conv + BN if the width changes."""

    def __init__(self, kind: str, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.pool: nn.Module
        if kind == "avg":
            self.pool = nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)
        elif kind == "max":
            self.pool = nn.MaxPool2d(3, stride=stride, padding=1)
        else:
            raise ValueError(f"unknown pooling {kind!r}")
        self.project: nn.Module = nn.Identity()
        if in_channels != out_channels:
            self.project = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, bias=False), batch_norm(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.project(self.pool(x))


class FactorizedReduction(nn.Module):
    """Halves the resolution without dropping pixels: two 1x1 convs on the even and on the
    (shifted) odd pixel grid, concatenated, BN. With stride 1, a 1x1 conv + BN."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        if stride == 1:
            self.path_conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        else:
            half = out_channels // 2
            self.path1_conv = nn.Conv2d(in_channels, half, 1, bias=False)
            # An odd width goes to the second path, as in the newest TF-slim code.
            self.path2_conv = nn.Conv2d(in_channels, out_channels - half, 1, bias=False)
        self.bn = batch_norm(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            return self.bn(self.path_conv(x))
        path1 = self.path1_conv(F.avg_pool2d(x, 1, stride=self.stride))
        shifted = F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:]
        path2 = self.path2_conv(F.avg_pool2d(shifted, 1, stride=self.stride))
        return self.bn(torch.cat([path1, path2], dim=1))


def relu_conv_bn(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    """ReLU, 1x1 conv (stride), BN."""
    return nn.Sequential(
        nn.ReLU(),
        nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
        batch_norm(out_channels),
    )


def make_operation(name: str, in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """Builds one of the NASNet search-space operations named as in TF-slim."""
    if name.startswith("separable_"):
        _, shape, layers = name.split("_")
        kernel = int(shape.split("x")[0])
        return SeparableStack(in_channels, out_channels, kernel, stride, int(layers))
    if name in ("avg_pool_3x3", "max_pool_3x3"):
        return PoolOp(name.split("_")[0], in_channels, out_channels, stride)
    if name == "none":
        if stride > 1 or in_channels != out_channels:
            return relu_conv_bn(in_channels, out_channels, stride)
        return nn.Identity()
    raise ValueError(f"unknown operation {name!r}")


class Cell(nn.Module):
    """One NASNet / PNASNet cell built from a ``CellSpec``; forward(x, prev) -> concat of the
    unused hidden states (``out_channels`` channels)."""

    def __init__(
        self,
        spec: CellSpec,
        in_channels: int,
        prev_channels: int | None,
        prev_is_larger: bool,
        filters: int,
        stride: int,
    ) -> None:
        super().__init__()
        self.hiddenstate_indices = spec.hiddenstate_indices
        # prev_channels None: the first stem cell, whose older input is its own raw input.
        self.use_input_as_prev = prev_channels is None
        self.prev: nn.Module
        if prev_channels is None:
            self.prev = nn.Identity()  # unused: the raw input stands in for the older input
            prev_out = in_channels
        elif prev_is_larger:
            self.prev = nn.Sequential(nn.ReLU(), FactorizedReduction(prev_channels, filters, 2))
            prev_out = filters
        elif prev_channels != filters:
            self.prev = relu_conv_bn(prev_channels, filters)
            prev_out = filters
        else:
            self.prev = nn.Identity()
            prev_out = prev_channels
        self.base = relu_conv_bn(in_channels, filters)

        channels = [filters, prev_out]
        reduced = [False, False]
        self.left = nn.ModuleList()
        self.right = nn.ModuleList()
        for block in range(5):
            sides = []
            for side, ops in ((0, self.left), (1, self.right)):
                index = spec.hiddenstate_indices[2 * block + side]
                op_stride = stride if index < 2 else 1
                ops.append(
                    make_operation(
                        spec.operations[2 * block + side], channels[index], filters, op_stride
                    )
                )
                sides.append(reduced[index] or op_stride > 1)
            if sides[0] != sides[1]:
                raise ValueError(f"block {block} adds tensors of different resolution")
            channels.append(filters)
            reduced.append(sides[0])

        self.outputs = [i for i, used in enumerate(spec.used_hiddenstates) if not used]
        self.fix = nn.ModuleList()
        for index in self.outputs:
            spatial = reduced[index] != reduced[-1]
            if spatial or channels[index] != filters:
                self.fix.append(FactorizedReduction(channels[index], filters, 2 if spatial else 1))
            else:
                self.fix.append(nn.Identity())
        self.out_channels = filters * len(self.outputs)

    def forward(self, x: Tensor, prev: Tensor | None) -> Tensor:
        if self.use_input_as_prev:
            prev_state = x
        else:
            if prev is None:
                raise ValueError("this cell was built with an older input; pass it")
            prev_state = self.prev(prev)
        states = [self.base(x), prev_state]
        for block, (left, right) in enumerate(zip(self.left, self.right)):
            a = self.hiddenstate_indices[2 * block]
            b = self.hiddenstate_indices[2 * block + 1]
            states.append(left(states[a]) + right(states[b]))
        return torch.cat([fix(states[i]) for i, fix in zip(self.outputs, self.fix)], dim=1)


def reduction_layer_indices(num_cells: int, num_reduction_layers: int) -> list[int]:
    """Cell numbers before which a reduction happens (TF-slim ``calc_reduction_layers``)."""
    return [
        int(float(k) / (num_reduction_layers + 1) * num_cells)
        for k in range(1, num_reduction_layers + 1)
    ]


class CellNetwork(nn.Module):
    """ImageNet NASNet-style network: conv stem, 2 stem cells, ``num_cells`` cells with
    reductions, ReLU + global average pool + dropout + FC. With ``reduction`` given (NASNet)
    separate reduction cells are inserted before the reduction indices; without it (PNASNet)
    the cell at a reduction index runs the normal cell with stride 2."""

    def __init__(
        self,
        normal: CellSpec,
        reduction: CellSpec | None,
        num_classes: int,
        num_cells: int,
        num_conv_filters: int,
        stem_multiplier: float,
        filter_scaling_rate: float,
        num_reduction_layers: int,
        skip_reduction_layer_input: bool,
        dropout: float,
        in_channels: int,
    ) -> None:
        super().__init__()
        stem_filters = int(32 * stem_multiplier)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_filters, 3, stride=2, bias=False),
            batch_norm(stem_filters),
        )
        # Static bookkeeping of every output: (channels, number of stride-2 steps so far).
        shapes: list[tuple[int, int] | None] = [None, (stem_filters, 0)]
        self.cells = nn.ModuleList()
        self.wiring: list[int] = []  # index into the output list of each cell's older input

        def add(spec: CellSpec, prev_index: int, filters: int, stride: int) -> None:
            net = shapes[-1]
            prev = shapes[prev_index]
            assert net is not None
            if prev is not None and net[1] - prev[1] not in (0, 1):
                raise ValueError("a cell's older input is more than one reduction behind")
            cell = Cell(
                spec,
                in_channels=net[0],
                prev_channels=None if prev is None else prev[0],
                prev_is_larger=prev is not None and prev[1] < net[1],
                filters=filters,
                stride=stride,
            )
            self.cells.append(cell)
            self.wiring.append(prev_index)
            shapes.append((cell.out_channels, net[1] + (1 if stride > 1 else 0)))

        stem_spec = reduction if reduction is not None else normal
        scaling = 1.0 / filter_scaling_rate**2
        for _ in range(2):
            add(stem_spec, len(shapes) - 2, int(num_conv_filters * scaling), 2)
            scaling *= filter_scaling_rate

        reductions = reduction_layer_indices(num_cells, num_reduction_layers)
        scaling = 1.0
        prev_index = len(shapes) - 2
        for cell_num in range(num_cells):
            is_reduction = cell_num in reductions
            if reduction is not None:
                if skip_reduction_layer_input:
                    prev_index = len(shapes) - 2
                if is_reduction:
                    scaling *= filter_scaling_rate
                    add(reduction, len(shapes) - 2, int(num_conv_filters * scaling), 2)
                if not skip_reduction_layer_input:
                    prev_index = len(shapes) - 2
                add(normal, prev_index, int(num_conv_filters * scaling), 1)
            else:
                if is_reduction:
                    scaling *= filter_scaling_rate
                if skip_reduction_layer_input or not is_reduction:
                    prev_index = len(shapes) - 2
                add(normal, prev_index, int(num_conv_filters * scaling), 2 if is_reduction else 1)

        final = shapes[-1]
        assert final is not None
        self.num_features = final[0]
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(final[0], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        outputs: list[Tensor | None] = [None, self.stem(x)]
        for cell, prev_index in zip(self.cells, self.wiring):
            net = outputs[-1]
            assert net is not None
            outputs.append(cell(net, outputs[prev_index]))
        last = outputs[-1]
        assert last is not None
        features = torch.relu(last).mean(dim=(2, 3))
        return self.fc(self.dropout(features))


def nasnet_large(
    num_classes: int = 1000,
    cells_per_stack: int = 6,
    penultimate_filters: int = 4032,
    stem_multiplier: float = 3.0,
    filter_scaling_rate: float = 2.0,
    num_reduction_layers: int = 2,
    skip_reduction_layer_input: bool = True,
    dropout: float = 0.0,
    in_channels: int = 3,
) -> nn.Module:
    """NASNet-A Large 6@4032 of Zoph et al. 2018 ("Learning transferable architectures for
    scalable image recognition"): N = 6 normal cells per stack, 4032 penultimate filters
    (F = 4032 / 24 = 168), 331x331 input, about 88.9M parameters. The paper's dropout is 0.5
    (keep 0.5); the default 0.0 keeps training steps deterministic."""
    if penultimate_filters % 24 != 0:
        raise ValueError("penultimate_filters must be a multiple of 24 (6 states x 4F)")
    return CellNetwork(
        NASNET_A_NORMAL,
        NASNET_A_REDUCTION,
        num_classes=num_classes,
        num_cells=3 * cells_per_stack,
        num_conv_filters=penultimate_filters // 24,
        stem_multiplier=stem_multiplier,
        filter_scaling_rate=filter_scaling_rate,
        num_reduction_layers=num_reduction_layers,
        skip_reduction_layer_input=skip_reduction_layer_input,
        dropout=dropout,
        in_channels=in_channels,
    )
