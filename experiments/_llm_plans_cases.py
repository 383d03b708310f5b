"""The cases of ``python -m experiments llm_plans``: every published configuration the harness can
express (the rows of ``harness/data/llm/published_llm_training.csv``, read by
:mod:`experiments._llm_rows`) and every model preset at a few GPU counts from 8 to 16,384.

A :class:`Case` is the problem (model, cluster, GPU count, global batch, precision: the
``python -m harness`` overrides of everything but the plan) and, where one is published, the
hand-tuned plan (its ``algo=...`` overrides).  A preset is run with the configuration its
publication trained with, as ``algo=hybrid_search`` knows it
(:data:`algorithms.llm_search_seeds.PUBLISHED`, with its sources; the data parallelism what the
GPUs leave); a preset that table lacks takes the plan of the published row of the same shape
(the row with the highest published throughput: its TP, PP, schedule, micro-batch,
recomputation, ZeRO stage); a preset with neither is compared with FSDP only.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from experiments._llm_rows import QUIET, RowJob, load_rows, override_value, row_job

#: each model preset (conf/model) at three GPU counts on the cluster of its published runs: counts
#: that are multiples of the published recipe's TP x PP where there is one, from 8 to 16,384 GPUs
PRESET_GPUS: dict[str, tuple[str, tuple[int, ...]]] = {
    "gpt_1p7b": ("superpod_a100", (8, 32, 128)),
    "gpt_3p6b": ("superpod_a100", (16, 64, 256)),
    "gpt_7p5b": ("superpod_a100", (32, 128, 512)),
    "gpt_18p4b": ("superpod_a100", (64, 256, 1024)),
    "gpt_39p1b": ("superpod_a100", (128, 512, 2048)),
    "gpt_76p1b": ("superpod_a100", (256, 1024, 4096)),
    "gpt_145p6b": ("superpod_a100", (512, 1536, 6144)),
    "gpt_310p1b": ("superpod_a100", (1024, 1920, 7680)),
    "gpt_529p6b": ("superpod_a100", (1120, 2520, 10080)),
    "gpt_1t": ("superpod_a100", (1536, 3072, 12288)),
    "gpt3_175b": ("superpod_a100", (256, 1024, 4096)),
    "bloom_176b": ("jean_zay_a100", (96, 384, 1536)),
    "llama3_8b": ("superpod_h100", (8, 64, 512)),
    "llama3_70b": ("superpod_h100", (64, 256, 1024)),
    "llama3_405b": ("superpod_h100", (2048, 8192, 16384)),
    "nemotron4_340b": ("superpod_h100", (768, 3072, 6144)),
    "mixtral_8x7b": ("superpod_h100", (32, 128, 512)),
    "deepseek_moe": ("superpod_h100", (16, 128, 1024)),
}
#: --quick: a few published rows (small GPU counts) and two presets at one count each
QUICK_ROWS = ("MEG21-T1-1", "KOR22-1b", "TT-T1-1", "BLOOM-SWEEP-15", "BLOOM-SWEEP-26")
#: --quick: each search's budget (seconds), so that the smoke run stays under a minute
QUICK_BUDGET_S = 2.0
QUICK_PRESETS: dict[str, tuple[str, tuple[int, ...]]] = {"gpt_1p7b": ("superpod_a100", (32,)), "llama3_8b": ("superpod_h100", (8,))}
#: the group whose rows the ranking check reads (BigScience's topology sweep of one model on 384 A100)
SWEEP_GROUP = "bloom_176b_topology_sweep"


@dataclass(frozen=True)
class Case:
    """One problem with its published plan (see the module docstring)."""

    key: str                       # the row id, or ``preset@gpus``
    kind: str                      # "row" or "preset"
    model: str                     # what the plot and tables call the model
    gpus: int
    base: tuple[str, ...]          # overrides of the problem (model, cluster, batch, precision, quiet flags)
    published: tuple[str, ...]     # overrides of the published plan (``algo=...``); () when none
    reason: str = ""               # why the case cannot run (kept with its reason, never dropped)
    source: str = ""               # where the published plan comes from
    row: RowJob | None = None


def split_overrides(overrides: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the problem's overrides, the plan's ``algo``/``algo.*`` overrides) of a row's job."""
    plan = tuple(o for o in overrides if o == "algo" or o.startswith(("algo=", "algo.")))
    return tuple(o for o in overrides if o not in plan), plan


def row_cases(ids: Sequence[str] | None = None) -> list[Case]:
    """Every published row (or those of ``ids``) as a case; a row the harness cannot express keeps its reason."""
    out = []
    for r in load_rows():
        if ids is not None and r["row_id"] not in ids:
            continue
        job = row_job(r)
        base, plan = split_overrides(job.overrides)
        out.append(Case(job.row_id, "row", job.model, job.gpus, base, plan, job.reason, f"{r['source']} ({r['locator']})", job))
    return out


def _shape_of(job: RowJob) -> tuple[int, int, int] | None:
    """(layers, hidden, heads) a row's job sets, None when it sets none of them."""
    found = {k: int(v) for k, v in (re.match(r"model\.(layers|hidden|heads)=(\d+)$", o).groups()  # type: ignore[union-attr]
                                    for o in job.overrides if re.match(r"model\.(layers|hidden|heads)=\d+$", o))}
    return (found["layers"], found["hidden"], found["heads"]) if len(found) == 3 else None


def _throughput(job: RowJob) -> float:
    """A row's published tokens/s per GPU where it can be had without a FLOP convention (iteration
    time or tokens/s), else its TFLOP/s (rows of one model share a source and a convention)."""
    p = job.published
    if p is None:
        return -math.inf
    if p.kind == "iter_time":
        return job.batch * job.seq_len / (job.gpus * p.value)
    return p.value


#: the fields of a shape a recipe must share with the preset it is taken for
SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "gated_mlp", "experts", "seq_len")


@functools.lru_cache(maxsize=None)
def _spec_of(model: tuple[str, ...]) -> Any:
    from hydra.utils import instantiate

    from harness.app.compose import compose

    return instantiate(compose(list(model)).model, _recursive_=False).spec


def spec_of_overrides(overrides: Sequence[str]) -> Any:
    """The transformer shape the model overrides of a job give (its batch and name left out)."""
    return _spec_of(tuple(o for o in overrides if o.startswith("model") and not o.startswith(("model.name=", "model.batch_size="))))


@functools.lru_cache(maxsize=None)
def gpu_family(cluster: str) -> str:
    """The GPU generation of a cluster preset (``A100``, ``H100``, ``H200``...), from its device's kind."""
    from hydra.utils import instantiate

    from harness.app.compose import compose

    kind = instantiate(compose([f"cluster={cluster}", "cluster.nodes=1"]).cluster, _convert_="all").devices[0].spec.kind
    m = re.search(r"[A-Z]\d{2,3}", kind)
    return m.group(0) if m else kind


def preset_recipes(presets: dict[str, tuple[str, tuple[int, ...]]], rows: Sequence[Case]) -> dict[str, Case]:
    """Per preset, its published configuration (module docstring): ``algo=hybrid_search``'s table
    of them, else the expressed published row of its shape (:data:`SHAPE_FIELDS`) on the preset
    cluster's GPU generation (a recipe sized for another GPU's memory may not fit) with the highest
    published throughput (:func:`_throughput`)."""
    from algorithms.llm_search_seeds import PUBLISHED

    out: dict[str, Case] = {}
    for name, (cluster, _) in presets.items():
        if name in PUBLISHED:
            kw, source = PUBLISHED[name]
            plan = ("algo=megatron", *(f"algo.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kw.items()))
            out[name] = Case(name, "preset", name, 0, (), plan, "", source)
            continue
        spec = spec_of_overrides([f"model={name}"])
        same = []
        for c in rows:
            if c.row is None or not c.row.expressed or _shape_of(c.row) != (spec.layers, spec.hidden, spec.heads):
                continue
            other = spec_of_overrides(c.base)
            row_cluster = override_value(c.base, "cluster") or ""
            if all(getattr(other, f) == getattr(spec, f) for f in SHAPE_FIELDS) and gpu_family(row_cluster) == gpu_family(cluster):
                same.append(c)
        if same:
            out[name] = max(same, key=lambda c: _throughput(c.row))  # type: ignore[arg-type]
    return out


def preset_cases(presets: dict[str, tuple[str, tuple[int, ...]]], recipes: dict[str, Case]) -> list[Case]:
    """Every preset at each of its GPU counts, with the recipe of its published row (dp derived)."""
    out = []
    for name, (cluster, counts) in presets.items():
        recipe = recipes.get(name)
        for gpus in counts:
            base = (f"model={name}", f"cluster={cluster}", f"cluster.nodes={max(gpus // 8, 1)}", *QUIET)
            if recipe is None:
                out.append(Case(f"{name}@{gpus}", "preset", name, gpus, base, (), "", "no published run of this shape: FSDP is the baseline"))
                continue
            plan = tuple(o for o in recipe.published if not o.startswith("algo.dp="))
            prec = next((o for o in recipe.base if o.startswith("precision=")), None)
            source = recipe.source if recipe.kind == "preset" else f"{recipe.key}'s plan"
            out.append(Case(f"{name}@{gpus}", "preset", name, gpus, base + ((prec,) if prec else ()), plan, "",
                            f"{source}; the data parallelism {gpus} GPUs leave"))
    return out


def sweep_key(case: Case) -> tuple[Any, ...]:
    """What makes two sweep rows the same configuration (a repeat): the problem and the plan."""
    return (tuple(o for o in case.base if not o.startswith("model.name=")), case.published)
