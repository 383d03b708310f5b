"""Configuration spaces of a layer graph: what OptCNN, its DFS baseline, PaSE, FlexFlow's MCMC
and brute force all search, so that their optima are comparable like with like.

Configurations (OptCNN Sec. 4 and Table 1; PaSE Sec. 1)
-------------------------------------------------------
A configuration of a layer is a degree for each dim it may split; shard k (row-major over the
dims) runs on device k (``mapping: linear``) or spread over the cluster (``mapping: spread``).
Two spaces:

* ``space: optcnn``: the dims are the layer's ``parallel_dims`` (OptCNN Table 1: sample,
  channel, height, width, length; a GEMM's m, n and batch dims), any degree from 1 to the
  dim's size (equal partitioning, :func:`harness.core.layergraph.part`);
* ``space: pase``: PaSE's iteration domains (:func:`harness.core.pase_costs.pase_domain`: a GEMM's
  m, n and k, a convolution's batch, output and input channels and kernel, never its h and
  w), degrees that divide the dim's size d with ``d / degree >= cutoff``.

The degrees of a layer multiply to a divisor of the device count (``product: divides``, our
reading of OptCNN: configs use 1, 2, 4... of the devices) or to at most the device count
(``product: at_most``, PaSE). Inputs have one configuration: the data loader writes each
shard's input where it is needed, so an input costs nothing and moves nothing.

Which space a search uses when it does not say follows the cost model
(:func:`algorithms.layer_costs.resolve_options`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.core.errors import OptionError, UserError
from harness.core.layer_shards import MAPPINGS
from harness.core.layergraph import LayerGraph
from harness.core.pase_costs import pase_domain

SPACES = ("optcnn", "pase")
PRODUCTS = ("divides", "at_most")


class ConfigSpaceError(UserError, ValueError):
    """A layer has no valid configuration, or a strategy's config is outside the space."""


@dataclass(frozen=True)
class SpaceOptions:
    """Which configurations a search may choose from (see the module docstring)."""

    space: str = "optcnn"
    product: str = "divides"
    cutoff: int = 1
    mapping: str = "linear"

    def __post_init__(self) -> None:
        # the values come from the algorithm's options (algo.space, ...) where it sets them
        if self.space not in SPACES:
            raise OptionError(f"algo.space must be one of {SPACES}, got {self.space!r}")
        if self.product not in PRODUCTS:
            raise OptionError(f"algo.product must be one of {PRODUCTS}, got {self.product!r}")
        if self.mapping not in MAPPINGS:
            raise OptionError(f"algo.mapping must be one of {MAPPINGS}, got {self.mapping!r}")
        if self.cutoff < 1:
            raise OptionError(f"algo.cutoff must be >= 1, got {self.cutoff}")


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small = [i for i in range(1, int(math.isqrt(n)) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def config_dims(lg: LayerGraph, v: int, opts: SpaceOptions) -> tuple[str, ...]:
    """The dims a configuration of node v assigns degrees to."""
    if lg.kinds[v] == "input":
        return ()
    return tuple(lg.parallel_dims[v]) if opts.space == "optcnn" else pase_domain(lg, v)


def enumerate_configs(lg: LayerGraph, v: int, num_devices: int, opts: SpaceOptions,
                      memo: dict[tuple, tuple[tuple[str, ...], np.ndarray]] | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Every configuration of node v: ``(dims, degrees [C, len(dims)])``, the all-ones config first.
    With ``memo``, layers whose dims and sizes the space sees alike share one (read-only) array."""
    dims = config_dims(lg, v, opts)
    N = int(num_devices)
    if memo is None:
        return dims, _enumerate(lg, v, dims, N, opts)
    contiguous = opts.space == "pase" and bool(lg.attrs[v].get("contiguous"))
    # OptCNN's space sees a size only up to the device count; PaSE's divisors see all of it
    seen = (min(int(lg.dims[v][d]), N) if opts.space == "optcnn" else int(lg.dims[v][d]) for d in dims)
    key = (dims, tuple(seen), N, opts, tuple(lg.dims[v].items()) if contiguous else None)
    hit = memo.get(key)
    if hit is None:
        deg = _enumerate(lg, v, dims, N, opts)
        deg.setflags(write=False)
        hit = memo[key] = (dims, deg)
    return hit


def _enumerate(lg: LayerGraph, v: int, dims: tuple[str, ...], N: int, opts: SpaceOptions) -> np.ndarray:
    choices = []
    for d in dims:
        size = int(lg.dims[v][d])
        if opts.space == "optcnn":
            cand = range(1, min(size, N) + 1)
        else:
            cand = [e for e in divisors(size) if e <= N and size // e >= opts.cutoff] or [1]
        if opts.product == "divides":
            cand = [e for e in cand if N % e == 0]
        choices.append(sorted(set(cand) | {1}))
    out: list[tuple[int, ...]] = []

    def rec(k: int, prod: int, acc: tuple[int, ...]) -> None:
        if k == len(dims):
            if prod <= N and (opts.product == "at_most" or N % prod == 0):
                out.append(acc)
            return
        for e in choices[k]:
            if prod * e > N:
                break
            rec(k + 1, prod * e, acc + (e,))

    rec(0, 1, ())
    if opts.space == "pase" and lg.attrs[v].get("contiguous"):
        out = [c for c in out if _contiguous(lg.dims[v], dict(zip(dims, c)))]
    deg = np.asarray(out, dtype=np.int64).reshape(len(out), len(dims))
    if len(deg) == 0:  # pragma: no cover - the all-ones config always fits
        raise ConfigSpaceError(f"layer {lg.names[v]} ({lg.kinds[v]}) has no valid configuration for {N} devices")
    return deg


def _contiguous(sizes: dict[str, int], degree: dict[str, int]) -> bool:
    """PaSE's Ravel / Unravel configs (``ConfigureReshape``): in dim order, whole splits of the
    leading dims, then at most one partial split, then none."""
    it = iter(sizes.items())
    for name, size in it:
        if degree.get(name, 1) != size:
            break
    return all(degree.get(name, 1) == 1 for name, _ in it)
