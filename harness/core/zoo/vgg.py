"""VGG-16 (Simonyan and Zisserman 2014, "Very deep convolutional networks for large-scale
image recognition"), configuration D: 13 conv 3x3 layers in 5 blocks (2, 2, 3, 3, 3) with
max-pooling after each block, then FC 4096, FC 4096, FC num_classes. 138.4M parameters at
224x224. The flattened size of the last feature map is computed from ``image_size`` (no
adaptive pooling), so the graph is the paper's.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

_BLOCK_DEPTHS_D: tuple[int, ...] = (2, 2, 3, 3, 3)


class VGG(nn.Module):
    """VGG network (Simonyan and Zisserman 2014); forward(x) -> logits (B, num_classes)."""

    def __init__(
        self,
        num_classes: int = 1000,
        image_size: int = 224,
        in_channels: int = 3,
        widths: Sequence[int] = (64, 128, 256, 512, 512),
        block_depths: Sequence[int] = _BLOCK_DEPTHS_D,
        fc_width: int = 4096,
        batch_norm: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(widths) != len(block_depths):
            raise ValueError("widths and block_depths must have the same length")
        layers: list[nn.Module] = []
        channels = in_channels
        side = image_size
        for width, depth in zip(widths, block_depths):
            for _ in range(depth):
                layers.append(nn.Conv2d(channels, width, 3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(width))
                layers.append(nn.ReLU())
                channels = width
            layers.append(nn.MaxPool2d(2, stride=2))
            side //= 2
        if side < 1:
            raise ValueError(f"image_size {image_size} is too small for {len(widths)} pools")
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * side * side, fc_width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(fc_width, fc_width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(fc_width, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def vgg16(
    num_classes: int = 1000,
    image_size: int = 224,
    in_channels: int = 3,
    widths: Sequence[int] = (64, 128, 256, 512, 512),
    fc_width: int = 4096,
    batch_norm: bool = False,
    dropout: float = 0.0,
) -> nn.Module:
    """VGG-16 (configuration D) of Simonyan and Zisserman 2014 ("Very deep convolutional
    networks for large-scale image recognition"), 224x224 input, about 138.4M parameters. The
    paper's dropout is 0.5; the default 0.0 keeps training steps deterministic."""
    return VGG(
        num_classes=num_classes,
        image_size=image_size,
        in_channels=in_channels,
        widths=widths,
        block_depths=_BLOCK_DEPTHS_D,
        fc_width=fc_width,
        batch_norm=batch_norm,
        dropout=dropout,
    )
