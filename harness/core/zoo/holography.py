"""Tensor Holography CNN (Shi, Li, Kim, Kellnhofer and Matusik 2021, "Towards real-time
photorealistic 3D holography with deep neural networks", Nature 591).

A fully convolutional network without down-sampling: ``num_layers`` (30) 3x3 convolutions of
``filters`` (24) channels, each conv + bias + BatchNorm + ReLU, mapping an RGB-D image (4
channels) to the mid-point hologram's amplitude and phase (3 + 3 channels). Following the
authors' code (github.com/liangs111/tensor_holography, ``main.py``): the input is shifted to
[-0.5, 0.5]; from layer 3 on, every odd layer's input is the previous output plus the input of
the layer two back (a residual connection around each pair of convs); the last layer sees the
previous features concatenated with the input, uses tanh, and its output is mapped to
amplitude in [0, sqrt(2)] and phase in [0, 1]. Sizes as in Celeritas (30 layers, 24 filters)
and the authors' 384x384 training crops.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _conv_bn(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
        nn.BatchNorm2d(out_channels),
    )


class TensorHolography(nn.Module):
    """Tensor Holography CNN; forward(x: (B, 4, H, W) RGB-D) -> (B, 6, H, W) amplitude+phase."""

    def __init__(
        self,
        num_layers: int = 30,
        filters: int = 24,
        in_channels: int = 4,
        out_channels: int = 6,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        if num_layers < 2:
            raise ValueError("tensor holography needs at least 2 layers")
        if out_channels % 2 != 0:
            raise ValueError("out_channels holds amplitude and phase halves, must be even")
        self.num_layers = num_layers
        self.out_channels = out_channels
        self.layers = nn.ModuleList(
            _conv_bn(in_channels if i == 0 else filters, filters, kernel_size)
            for i in range(num_layers - 1)
        )
        self.last = _conv_bn(filters + in_channels, out_channels, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        x_in = x - 0.5
        outputs: list[Tensor] = []
        inputs: list[Tensor] = []
        for i in range(self.num_layers):
            if i == 0:
                layer_in = x_in
            elif i < 3 or i % 2 == 0:
                layer_in = outputs[i - 1]
            else:
                layer_in = outputs[i - 1] + inputs[i - 2]
            inputs.append(layer_in)
            if i < self.num_layers - 1:
                outputs.append(torch.relu(self.layers[i](layer_in)))
        field = torch.tanh(self.last(torch.cat([inputs[-1], x_in], dim=1)))
        half = self.out_channels // 2
        amplitude = field[:, :half] * math.sqrt(0.5) + math.sqrt(0.5)
        phase = field[:, half:] * 0.5 + 0.5
        return torch.cat([amplitude, phase], dim=1)


def tensor_holography(
    num_layers: int = 30,
    filters: int = 24,
    in_channels: int = 4,
    out_channels: int = 6,
    kernel_size: int = 3,
) -> nn.Module:
    """Tensor Holography CNN of Shi et al. 2021 ("Towards real-time photorealistic 3D
    holography with deep neural networks"): 30 conv layers of 24 filters, RGB-D in, amplitude
    and phase out, residual connections every two layers."""
    return TensorHolography(
        num_layers=num_layers,
        filters=filters,
        in_channels=in_channels,
        out_channels=out_channels,
        kernel_size=kernel_size,
    )
