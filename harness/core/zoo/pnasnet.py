"""PNASNet-5 Mobile (Liu, Zoph, Neumann, Shlens, Hua, Li, Fei-Fei, Yuille, Huang and Murphy
2018, "Progressive neural architecture search"), 224x224 input.

PNASNet-5 uses a single cell type; a reduction is the same cell run with stride 2. The cell
(TF-slim ``nets/nasnet/pnasnet.py``, ``PNasNetNormalCell``), with h0 the processed current
input and h1 the processed previous cell output:

* block 0: sep 5x5 (h1) + max 3x3 (h1)
* block 1: sep 7x7 (h0) + max 3x3 (h0)
* block 2: sep 5x5 (h0) + sep 3x3 (h0)
* block 3: sep 3x3 (block 2) + max 3x3 (h0)
* block 4: sep 3x3 (h1) + identity (h0)

and the output concatenates all five blocks (5 x filters channels). Mobile configuration
(TF-slim ``mobile_imagenet_config``): 9 cells with stride-2 cells at positions 3 and 6, F = 54
filters doubling at each reduction, stem multiplier 1 (32-filter 3x3/2 stem conv, then two
stride-2 cells with F/4 = 13 and F/2 = 27 filters), older input always the cell two back
(``skip_reduction_layer_input``). Head: ReLU, global average pool, dropout, FC. Auxiliary head
and drop-path are left out. About 5.1M parameters.

Operations and wiring are those of NASNet-A (``harness.core.zoo.nasnet``), whose cell machinery this
module reuses.
"""

from __future__ import annotations

from torch import nn

from harness.core.zoo.nasnet import CellNetwork, CellSpec

PNASNET5_CELL = CellSpec(
    operations=(
        "separable_5x5_2", "max_pool_3x3",
        "separable_7x7_2", "max_pool_3x3",
        "separable_5x5_2", "separable_3x3_2",
        "separable_3x3_2", "max_pool_3x3",
        "separable_3x3_2", "none",
    ),
    hiddenstate_indices=(1, 1, 0, 0, 0, 0, 4, 0, 1, 0),
    used_hiddenstates=(1, 1, 0, 0, 0, 0, 0),
)


def pnasnet_mobile(
    num_classes: int = 1000,
    num_cells: int = 9,
    num_conv_filters: int = 54,
    stem_multiplier: float = 1.0,
    filter_scaling_rate: float = 2.0,
    num_reduction_layers: int = 2,
    skip_reduction_layer_input: bool = True,
    dropout: float = 0.0,
    in_channels: int = 3,
) -> nn.Module:
    """PNASNet-5 Mobile of Liu et al. 2018 ("Progressive neural architecture search"): 9 cells
    (N = 3 per stage, the stride-2 cells included), F = 54, 224x224 input, about 5.1M
    parameters. The paper's dropout is 0.5; the default 0.0 keeps steps deterministic."""
    return CellNetwork(
        PNASNET5_CELL,
        None,
        num_classes=num_classes,
        num_cells=num_cells,
        num_conv_filters=num_conv_filters,
        stem_multiplier=stem_multiplier,
        filter_scaling_rate=filter_scaling_rate,
        num_reduction_layers=num_reduction_layers,
        skip_reduction_layer_input=skip_reduction_layer_input,
        dropout=dropout,
        in_channels=in_channels,
    )
