"""Inception-v3 (Szegedy, Vanhoucke, Ioffe, Shlens and Wojna 2016, "Rethinking the Inception
architecture for computer vision").

The standard 299x299 network as in TF-slim's ``inception_v3``: the conv stem, three
Inception-A blocks (Mixed_5b-d, 35x35), the grid reduction Mixed_6a, four Inception-C blocks
with factorized 7x7 convolutions (Mixed_6b-e, 17x17), the grid reduction Mixed_7a, two
Inception-E blocks (Mixed_7b-c, 8x8), global average pool and a linear classifier. Every conv is
conv (no bias) + BatchNorm (eps 1e-3) + ReLU. Average pools exclude padding, as TF's SAME
pooling does. 23.8M parameters without the auxiliary head.

The auxiliary classifier (after Mixed_6e) is off by default. With ``aux_logits=True`` forward
returns ``(logits, aux_logits)``; the harness's single-output loss expects the default.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class BasicConv2d(nn.Module):
    """conv (no bias) + BatchNorm + ReLU, the unit every Inception-v3 conv is made of."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-3)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.bn(self.conv(x)))


def _avg_pool_same(x: Tensor) -> Tensor:
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class InceptionA(nn.Module):
    """35x35 block: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1."""

    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, 1)
        self.branch5x5 = nn.Sequential(
            BasicConv2d(in_channels, 48, 1), BasicConv2d(48, 64, 5, padding=2)
        )
        self.branch3x3dbl = nn.Sequential(
            BasicConv2d(in_channels, 64, 1),
            BasicConv2d(64, 96, 3, padding=1),
            BasicConv2d(96, 96, 3, padding=1),
        )
        self.branch_pool = BasicConv2d(in_channels, pool_features, 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch5x5(x),
                self.branch3x3dbl(x),
                self.branch_pool(_avg_pool_same(x)),
            ],
            dim=1,
        )


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17 (Mixed_6a)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            BasicConv2d(in_channels, 64, 1),
            BasicConv2d(64, 96, 3, padding=1),
            BasicConv2d(96, 96, 3, stride=2),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [self.branch3x3(x), self.branch3x3dbl(x), F.max_pool2d(x, 3, stride=2)], dim=1
        )


class InceptionC(nn.Module):
    """17x17 block with factorized 7x7 convolutions (1x7 and 7x1)."""

    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, 1)
        self.branch7x7 = nn.Sequential(
            BasicConv2d(in_channels, c7, 1),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, 192, (7, 1), padding=(3, 0)),
        )
        self.branch7x7dbl = nn.Sequential(
            BasicConv2d(in_channels, c7, 1),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, (1, 7), padding=(0, 3)),
        )
        self.branch_pool = BasicConv2d(in_channels, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch7x7(x),
                self.branch7x7dbl(x),
                self.branch_pool(_avg_pool_same(x)),
            ],
            dim=1,
        )


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8 (Mixed_7a)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(
            BasicConv2d(in_channels, 192, 1), BasicConv2d(192, 320, 3, stride=2)
        )
        self.branch7x7x3 = nn.Sequential(
            BasicConv2d(in_channels, 192, 1),
            BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)),
            BasicConv2d(192, 192, 3, stride=2),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, 3, stride=2)], dim=1
        )


class InceptionE(nn.Module):
    """8x8 block with expanded filter banks (1x3 and 3x1 side by side)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 320, 1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, 192, 1)

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], dim=1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], dim=1)
        return torch.cat(
            [self.branch1x1(x), b3, bd, self.branch_pool(_avg_pool_same(x))], dim=1
        )


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 grid: avgpool 5/3, 1x1 (128), 5x5 (768), FC."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(in_channels, 128, 1)
        self.conv1 = BasicConv2d(128, 768, 5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.avg_pool2d(x, 5, stride=3)
        x = self.conv1(self.conv0(x))
        return self.fc(x.mean(dim=(2, 3)))


class Inception3(nn.Module):
    """Inception-v3 (Szegedy et al. 2016); forward(x: (B, 3, 299, 299)) -> logits."""

    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        aux_logits: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            BasicConv2d(in_channels, 32, 3, stride=2),
            BasicConv2d(32, 32, 3),
            BasicConv2d(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            BasicConv2d(64, 80, 1),
            BasicConv2d(80, 192, 3),
            nn.MaxPool2d(3, stride=2),
        )
        self.mixed_5 = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64)
        )
        self.mixed_6 = nn.Sequential(
            InceptionB(288),
            InceptionC(768, 128),
            InceptionC(768, 160),
            InceptionC(768, 160),
            InceptionC(768, 192),
        )
        self.aux = InceptionAux(768, num_classes) if aux_logits else None
        self.mixed_7 = nn.Sequential(InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        x = self.mixed_6(self.mixed_5(self.stem(x)))
        aux = self.aux(x) if self.aux is not None else None
        x = self.mixed_7(x)
        logits = self.fc(self.dropout(x.mean(dim=(2, 3))))
        if aux is not None:
            return logits, aux
        return logits


def inception_v3(
    num_classes: int = 1000,
    in_channels: int = 3,
    aux_logits: bool = False,
    dropout: float = 0.0,
) -> nn.Module:
    """Inception-v3 of Szegedy et al. 2016 ("Rethinking the Inception architecture for
    computer vision"), 299x299 input, 23.8M parameters without the auxiliary head. The paper's
    dropout before the classifier is 0.2 (keep 0.8); the default 0.0 keeps steps deterministic."""
    return Inception3(
        num_classes=num_classes, in_channels=in_channels, aux_logits=aux_logits, dropout=dropout
    )
