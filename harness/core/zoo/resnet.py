"""ResNet with bottleneck blocks (He, Zhang, Ren and Sun 2016, "Deep residual learning for
image recognition"): ResNet-50 [3, 4, 6, 3], ResNet-101 [3, 4, 23, 3] and ResNet-200
[3, 24, 36, 3] (ResNet-200 comes from He et al. 2016, "Identity mappings in deep residual
networks", which uses pre-activation units; the post-activation unit is used here for all three
depths, the parameter count is the same).

Block layout: 1x1 reduce, 3x3 (carrying the stage's stride, as in TF-slim and torchvision), 1x1
expand by 4, each conv followed by BatchNorm; projection shortcut (1x1 conv + BN) where shape
changes. Stem: 7x7/2 conv, BN, ReLU, 3x3/2 max-pool. Head: global average pool, FC.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

_EXPANSION = 4


class Bottleneck(nn.Module):
    """Bottleneck residual unit: 1x1 -> 3x3 (stride) -> 1x1 (x4), projection if needed."""

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * _EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Bottleneck ResNet (He et al. 2016); forward(x: (B, C, H, W)) -> logits (B, num_classes)."""

    def __init__(
        self,
        layers: Sequence[int],
        num_classes: int = 1000,
        in_channels: int = 3,
        width: int = 64,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages: list[nn.Module] = []
        channels = width
        for index, depth in enumerate(layers):
            stage_width = width * 2**index
            blocks: list[nn.Module] = []
            for block in range(int(depth)):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(Bottleneck(channels, stage_width, stride))
                channels = stage_width * _EXPANSION
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stages(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


def resnet50(
    num_classes: int = 1000,
    layers: Sequence[int] = (3, 4, 6, 3),
    width: int = 64,
    in_channels: int = 3,
) -> nn.Module:
    """ResNet-50 of He et al. 2016 ("Deep residual learning for image recognition"),
    bottleneck blocks [3, 4, 6, 3], about 25.6M parameters."""
    return ResNet(layers, num_classes=num_classes, in_channels=in_channels, width=width)


def resnet101(
    num_classes: int = 1000,
    layers: Sequence[int] = (3, 4, 23, 3),
    width: int = 64,
    in_channels: int = 3,
) -> nn.Module:
    """ResNet-101 of He et al. 2016 ("Deep residual learning for image recognition"),
    bottleneck blocks [3, 4, 23, 3], about 44.5M parameters."""
    return ResNet(layers, num_classes=num_classes, in_channels=in_channels, width=width)


def resnet200(
    num_classes: int = 1000,
    layers: Sequence[int] = (3, 24, 36, 3),
    width: int = 64,
    in_channels: int = 3,
) -> nn.Module:
    """ResNet-200 of He et al. 2016 ("Identity mappings in deep residual networks"),
    bottleneck blocks [3, 24, 36, 3], about 64.7M parameters."""
    return ResNet(layers, num_classes=num_classes, in_channels=in_channels, width=width)
