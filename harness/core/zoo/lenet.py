"""LeNet-5 (LeCun, Bottou, Bengio and Haffner 1998, "Gradient-based learning applied to
document recognition").

The classic layout on 32x32 single-channel images: C1 conv 5x5 (6 maps), S2 average
subsampling, C3 conv 5x5 (16 maps, fully connected to S2 rather than the paper's sparse
connection table), S4 average subsampling, C5 (120 units, written as a linear layer over the
flattened 16x5x5 map, which is the same computation as the paper's 5x5 convolution on a 5x5
map), F6 (84 units), output layer. tanh activations as in the paper; the RBF output layer is
replaced by an ordinary linear classifier. 61,706 parameters at the defaults.
"""

from __future__ import annotations

from torch import Tensor, nn


def _lenet_spatial(image_size: int, kernel: int) -> int:
    """Side of the S4 feature map: two (valid conv, 2x2 subsampling) stages."""
    side = image_size
    for _ in range(2):
        side = (side - kernel + 1) // 2
    if side < 1:
        raise ValueError(f"image_size {image_size} is too small for LeNet-5")
    return side


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998); forward(x: (B, C, H, W)) -> logits (B, num_classes)."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 32,
        c1: int = 6,
        c3: int = 16,
        c5: int = 120,
        f6: int = 84,
        kernel_size: int = 5,
    ) -> None:
        super().__init__()
        side = _lenet_spatial(image_size, kernel_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(c1, c3, kernel_size),
            nn.Tanh(),
            nn.AvgPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c3 * side * side, c5),
            nn.Tanh(),
            nn.Linear(c5, f6),
            nn.Tanh(),
            nn.Linear(f6, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def lenet5(
    num_classes: int = 10,
    in_channels: int = 1,
    image_size: int = 32,
    c1: int = 6,
    c3: int = 16,
    c5: int = 120,
    f6: int = 84,
    kernel_size: int = 5,
) -> nn.Module:
    """LeNet-5 of LeCun et al. 1998 ("Gradient-based learning applied to document
    recognition"), 32x32 grayscale input, 10 classes, about 61.7k parameters."""
    return LeNet5(
        num_classes=num_classes,
        in_channels=in_channels,
        image_size=image_size,
        c1=c1,
        c3=c3,
        c5=c5,
        f6=f6,
        kernel_size=kernel_size,
    )
