"""Which precision each published training run of the GPU accuracy experiment ran in.

``published_throughput.csv`` says ``FP32``, ``AMP`` or ``AMP/FP16``; "AMP" covers two recipes
with different costs (``docs/precision.md``): autocast (``torch.cuda.amp`` or apex AMP ``O1``:
per-op casts around FP32-list ops, ``precision=amp_fp16``) and an FP16 model with FP32 master
weights (apex AMP ``O2``, fairseq's ``--fp16``: ``precision=fp16_master``).  The trainer a row
names decides, as its code at the README version that publishes the figure runs it
(:data:`AMP_RECIPES`, matched against the row's ``source``); an AMP row of a trainer not listed
gets autocast, PyTorch's own recipe.
"""

from __future__ import annotations

import re
from typing import Any

#: (pattern of a row's ``source``, the precision its AMP rows ran, what its trainer does: the fact behind it)
AMP_RECIPES: tuple[tuple[str, str, str], ...] = (
    (r"PyTorch/Translation/GNMT", "fp16_master",
     "DeepLearningExamples GNMT, `--math fp16`: apex `amp.initialize(model, optimizer, cast_model_outputs=torch.float16, "
     "keep_batchnorm_fp32=False, opt_level='O2')` (`seq2seq/train/trainer.py` at the README revision of 2020-08 that "
     "publishes 76438 tok/s); label smoothing on `log_softmax(..., dtype=torch.float32)`"),
    (r"PyTorch/Translation/Transformer", "fp16_master",
     "DeepLearningExamples Transformer, `--amp`: apex AMP at `--amp-level O2` by default; its README (2022-08): "
     "'Forward and backward pass are computed with FP16 precision with exclusion of a loss function which is computed "
     "in FP32', and `O1` costs 20 % of the throughput"),
    (r"PyTorch/Classification/ConvNets", "amp_fp16",
     "DeepLearningExamples ConvNets, `--amp`: `torch.cuda.amp` autocast with a `GradScaler` (`main.py`), channels-last "
     "tensors (`memory_format: nhwc` in `configs.yml`)"),
)


def amp_recipe(source: str) -> tuple[str, str]:
    """(precision, the fact behind it) of an AMP row from its ``source``: the first of
    :data:`AMP_RECIPES` whose pattern it matches, else autocast."""
    for pattern, precision, why in AMP_RECIPES:
        if re.search(pattern, source):
            return precision, why
    return "amp_fp16", "autocast (torch.cuda.amp), PyTorch's own recipe: the trainer is not one of AMP_RECIPES"


def row_precision(row: Any) -> str:
    """The zoo precision of a published row: ``fp32`` for FP32, else its trainer's AMP recipe."""
    label = str(row["precision"])
    if "AMP" not in label and "FP16" not in label:
        return "fp32"
    return amp_recipe(str(row["source"]))[0]


def recipe_lines(pub: Any) -> list[str]:
    """README lines: the recipe each trainer with AMP rows here ran, and the precision it is simulated in."""
    amp = pub[[row_precision(r) != "fp32" for _, r in pub.iterrows()]]
    seen: dict[str, str] = {}
    for _, r in amp.iterrows():
        precision, why = amp_recipe(str(r["source"]))
        seen.setdefault(f"`precision={precision}`: {why}", "")
    return [f"* {line}." for line in seen]
