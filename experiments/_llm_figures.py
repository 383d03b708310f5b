"""The figures of ``python -m experiments llm_accuracy``: FLOP conventions, the formula baseline,
Kendall's tau-b and the error summaries.

* **FLOP conventions.**  A published TFLOP/s, MFU or HFU is a FLOP count divided by a time; each
  source counts FLOPs its own way (``harness/data/llm/README.md``), so a row's figure is turned into
  its iteration time with the row's own count (:func:`convention_flops`) and back.
* **The formula baseline** the issue defines: ``hardware FLOPs / (GPUs x peak x eta) x
  (1 + (p - 1) / (v m))``, with one efficiency ``eta`` fitted to all the rows it is compared on, by
  least squares in log space (:func:`fit_efficiency`: the geometric mean of ``ideal / published``).
* **Kendall's tau-b** (:func:`kendall_tau_b`, Kendall 1945: ties in either variable corrected), and
  the tau a perfect simulator would reach against measurements with a given multiplicative noise
  (:func:`noise_tau`), the floor of the BLOOM sweep's ranking goal.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from harness.core.llm.flops import hardware_flops
from harness.core.llm.spec import TransformerSpec

#: the FLOP conventions of the published rows (``flops_convention`` as written, see :func:`convention_key`)
CONVENTIONS: dict[str, str] = {
    "narayanan96": "96 B s l h^2 (1 + s/6h + V/16lh): hardware FLOPs with full recompute (Narayanan et al. SC'21 Eq. 3; BigScience's calculator)",
    "korthikanti": "72 B s l h^2 (1 + s/6h + V/12lh) model FLOPs; HFU adds the recompute's (Korthikanti et al. MLSys'23)",
    "mosaic": "B (6 N s + 12 l h s^2) model FLOPs, 4/3 of it with activation checkpointing (llm-foundry's benchmarking README)",
    "torchtitan": "B s (6 N' + 12 l h s), N' the parameters but the embedding (torchtitan's get_num_flop_per_token)",
}


def convention_key(text: str, group: str) -> str:
    """The :data:`CONVENTIONS` key of a row's ``flops_convention`` text (its group's when blank)."""
    low = (text or "").lower()
    if "96" in low or "narayanan" in low or "hardware tflops" in low:
        return "narayanan96"
    if "72bslh" in low:
        return "korthikanti"
    if "mfu incl. attention" in low:
        return "mosaic"
    return {"megatron_sc21_table1": "narayanan96", "korthikanti_mlsys23": "korthikanti", "bloom_176b": "narayanan96",
            "bloom_176b_topology_sweep": "narayanan96", "mosaic_llm_foundry_fsdp": "mosaic"}.get(group, "torchtitan")


def convention_flops(key: str, spec: TransformerSpec, batch: int, recompute: str, hardware: bool) -> float:
    """FLOPs of one iteration on ``batch`` sequences in convention ``key``; ``hardware`` counts the
    recomputation (a TFLOP/s of Narayanan's or BigScience's is hardware FLOPs, an MFU model FLOPs)."""
    B, s, l, h, V = float(batch), float(spec.seq_len), float(spec.layers), float(spec.hidden), float(spec.vocab)
    if key == "narayanan96":
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if key == "korthikanti":
        if hardware and recompute == "full":
            return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        core = s / (3 * h) if hardware and recompute == "selective" else s / (6 * h)
        return 72 * B * s * l * h * h * (1 + core + V / (12 * l * h))
    if key == "mosaic":
        f = B * (6 * spec.param_count() * s + 12 * l * h * s * s)
        return f * (4 / 3 if hardware and recompute != "none" else 1.0)
    if key == "torchtitan":
        dense = spec.param_count() - spec.embedding_params()
        return B * s * (6 * dense + 12 * l * h * s)
    raise ValueError(f"unknown FLOP convention {key!r}: one of {', '.join(CONVENTIONS)}")


def figure_flops(kind: str, key: str, spec: TransformerSpec, batch: int, recompute: str) -> float:
    """The FLOPs behind a published figure of ``kind``: a TFLOP/s or HFU counts hardware FLOPs, an MFU model FLOPs."""
    return convention_flops(key, spec, batch, recompute, hardware=kind in ("tflops_per_gpu", "hfu"))


def time_of_figure(kind: str, value: float, *, gpus: int, batch: int, seq_len: int, flops: float, peak: float) -> float:
    """The iteration time a figure means: itself (``iter_time``), tokens / (GPUs x tokens/s/GPU),
    FLOPs / (GPUs x TFLOP/s), FLOPs / (GPUs x peak x MFU or HFU)."""
    if kind == "iter_time":
        return value
    if kind == "tokens_per_s_per_gpu":
        return batch * seq_len / (gpus * value)
    if kind == "tflops_per_gpu":
        return flops / (gpus * value * 1e12)
    if kind in ("mfu", "hfu"):
        return flops / (gpus * peak * value)
    raise ValueError(f"unknown figure kind {kind!r}")


def figure_of_time(kind: str, t: float, *, gpus: int, batch: int, seq_len: int, flops: float, peak: float) -> float:
    """The inverse of :func:`time_of_figure`: the figure of kind ``kind`` an iteration of ``t`` seconds gives."""
    if kind == "iter_time":
        return t
    return time_of_figure(kind, t, gpus=gpus, batch=batch, seq_len=seq_len, flops=flops, peak=peak)


# ---------------------------------------------------------------------------- the formula baseline
def bubble_factor(pp: int, vpp: int, micro_batches: int) -> float:
    """``1 + (p - 1) / (v m)``: the pipeline bubble of (interleaved) 1F1B over the ideal time."""
    return 1.0 + (pp - 1) / (max(vpp, 1) * max(micro_batches, 1))


def formula_ideal(spec: TransformerSpec, batch: int, recompute: str, gpus: int, peak: float, pp: int, vpp: int,
                  micro_batches: int) -> float:
    """The formula's time at efficiency 1: hardware FLOPs (:func:`harness.core.llm.flops.hardware_flops`,
    Korthikanti's counts generalised) / (GPUs x peak) x :func:`bubble_factor`."""
    return hardware_flops(spec, batch, recompute) / (gpus * peak) * bubble_factor(pp, vpp, micro_batches)


def fit_efficiency(ideal: Sequence[float], published: Sequence[float]) -> float:
    """The one efficiency ``eta`` minimising ``sum (log(ideal / eta) - log(published))^2``: the
    geometric mean of ``ideal / published`` (the formula then predicts ``ideal / eta``)."""
    a, b = np.asarray(ideal, dtype=float), np.asarray(published, dtype=float)
    if a.size == 0 or a.shape != b.shape or not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("the formula's efficiency needs as many positive ideal and published times, at least one")
    return float(np.exp(np.mean(np.log(a) - np.log(b))))


# ---------------------------------------------------------------------------- rank correlation
def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two samples: ``(concordant - discordant) / sqrt((n0 - n1)(n0 - n2))``,
    ``n0`` the pairs, ``n1`` and ``n2`` the pairs tied in ``x`` and in ``y`` (a pair tied in both
    counts in neither).  NaN when a sample is constant or shorter than two."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("kendall_tau_b takes two 1-d samples of the same length")
    i, j = np.triu_indices(a.size, k=1)
    dx, dy = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n0 = float(i.size)
    n1, n2 = float((dx == 0).sum()), float((dy == 0).sum())
    denom = math.sqrt((n0 - n1) * (n0 - n2))
    return float((dx * dy).sum() / denom) if denom > 0 else math.nan


def noise_tau(values: Sequence[float], sigma: float, draws: int = 2000, seed: int = 0) -> float:
    """The median Kendall's tau-b between ``values`` and ``values x exp(sigma Z)``, ``Z`` standard
    normal (seeded): what a simulator that were exact would score against measurements whose
    repeat-to-repeat noise is ``sigma`` (relative)."""
    v = np.asarray(values, dtype=float)
    if v.size < 2 or not sigma > 0:
        return 1.0 if v.size >= 2 else math.nan
    rng = np.random.default_rng(seed)
    taus = [kendall_tau_b(v, v * np.exp(sigma * rng.standard_normal(v.size))) for _ in range(draws)]
    return float(np.median(taus))


def repeat_sigma(pairs: Sequence[tuple[float, float]]) -> float:
    """The relative noise of one measurement from repeated measurements of the same configuration:
    ``sqrt(mean(log(a / b)^2) / 2)`` over the pairs (NaN without a pair)."""
    if not pairs:
        return math.nan
    d = np.log(np.array([a for a, _ in pairs], dtype=float) / np.array([b for _, b in pairs], dtype=float))
    return float(math.sqrt(float(np.mean(d * d)) / 2))


# ---------------------------------------------------------------------------- error summaries
def error_summary(ratios: Sequence[float]) -> dict[str, Any]:
    """Median, 90th percentile and worst ``|ratio - 1|``, and the rows within 10 % and 20 %."""
    r = np.asarray([x for x in ratios if math.isfinite(x)], dtype=float)
    err = np.abs(r - 1)
    if r.size == 0:
        return {"rows": 0, "median_abs_error": math.nan, "p90_abs_error": math.nan, "worst": math.nan,
                "within_10": 0, "within_20": 0}
    return {"rows": int(r.size), "median_abs_error": float(np.median(err)), "p90_abs_error": float(np.percentile(err, 90)),
            "worst": float(err.max()), "within_10": int((err <= 0.10).sum()), "within_20": int((err <= 0.20).sum())}
