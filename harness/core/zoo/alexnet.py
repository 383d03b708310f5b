"""AlexNet (Krizhevsky, Sutskever and Hinton 2012, "ImageNet classification with deep
convolutional neural networks").

The paper's layer sizes: 227x227 input (the paper says 224, but 227 is what makes its
stride-4 11x11 first layer produce 55x55), conv 96@11x11/4, LRN, max-pool 3/2, conv 256@5x5,
LRN, max-pool, conv 384@3x3, conv 384@3x3, conv 256@3x3, max-pool, FC 4096, FC 4096, FC 1000.
The paper splits conv2, conv4 and conv5 over its two GPUs (grouped convolutions); that split was
a memory workaround, and the single-tower layout used by OptCNN / PaSE / FlexFlow is the default
here (``groups=1``, about 62.4M parameters; ``groups=2`` gives the paper's 61.0M).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


def _out(side: int, kernel: int, stride: int, pad: int) -> int:
    return (side + 2 * pad - kernel) // stride + 1


class AlexNet(nn.Module):
    """AlexNet (Krizhevsky et al. 2012); forward(x: (B, 3, H, W)) -> logits (B, num_classes)."""

    def __init__(
        self,
        num_classes: int = 1000,
        image_size: int = 227,
        in_channels: int = 3,
        widths: Sequence[int] = (96, 256, 384, 384, 256),
        fc_width: int = 4096,
        groups: int = 1,
        lrn: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(widths) != 5:
            raise ValueError(f"AlexNet has 5 conv layers, got widths={list(widths)}")
        w1, w2, w3, w4, w5 = (int(w) for w in widths)

        def norm() -> nn.Module:
            # Paper: k=2, n=5, alpha=1e-4, beta=0.75.
            return nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0) if lrn else nn.Identity()

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, w1, 11, stride=4),
            nn.ReLU(),
            norm(),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(w1, w2, 5, padding=2, groups=groups),
            nn.ReLU(),
            norm(),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(w2, w3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(w3, w4, 3, padding=1, groups=groups),
            nn.ReLU(),
            nn.Conv2d(w4, w5, 3, padding=1, groups=groups),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2),
        )
        side = _out(image_size, 11, 4, 0)
        side = _out(side, 3, 2, 0)
        side = _out(side, 3, 2, 0)
        side = _out(side, 3, 2, 0)
        if side < 1:
            raise ValueError(f"image_size {image_size} is too small for AlexNet")
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(w5 * side * side, fc_width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(fc_width, fc_width),
            nn.ReLU(),
            nn.Linear(fc_width, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def alexnet(
    num_classes: int = 1000,
    image_size: int = 227,
    in_channels: int = 3,
    widths: Sequence[int] = (96, 256, 384, 384, 256),
    fc_width: int = 4096,
    groups: int = 1,
    lrn: bool = True,
    dropout: float = 0.0,
) -> nn.Module:
    """AlexNet of Krizhevsky et al. 2012 ("ImageNet classification with deep convolutional
    neural networks"), single-tower layout, 227x227 input. The paper's dropout is 0.5; the
    default 0.0 keeps training steps deterministic."""
    return AlexNet(
        num_classes=num_classes,
        image_size=image_size,
        in_channels=in_channels,
        widths=widths,
        fc_width=fc_width,
        groups=groups,
        lrn=lrn,
        dropout=dropout,
    )
