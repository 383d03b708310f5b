"""Graph sources: what a ``conf/model/*.yaml`` instantiates.

Every source has a ``name``, a ``batch_size`` and :meth:`op_graph`; PyTorch models also
give a :meth:`TorchModel.layer_graph`.  Three kinds:

* :class:`TorchModel`: any ``nn.Module`` factory (``module._target_``), captured with
  :func:`harness.capture.capture`; the zoo models and ``model=custom`` use it.
* :class:`SyntheticGraph`: a seeded random layered DAG with a chosen size and CCR, for
  scaling studies.
* :class:`GraphFile`: a graph saved with :meth:`OpGraph.save`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.capture import CaptureError, TensorSpec, capture, colocate_gradients
from harness.graph import BATCHED, FORWARD, OpGraph

_CACHE: dict[str, OpGraph] = {}
_LAYER_CACHE: dict[str, Any] = {}


def _plain(x: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    return x


def _is_missing(module: Any) -> bool:
    """True when the config leaves module._target_ as Hydra's mandatory ``???``."""
    try:
        from omegaconf import DictConfig, OmegaConf

        return isinstance(module, DictConfig) and OmegaConf.is_missing(module, "_target_")
    except ImportError:  # pragma: no cover
        return False


class TorchModel:
    """A PyTorch model: the ``module`` config is instantiated on the ``meta`` device when captured."""

    def __init__(
        self,
        name: str,
        module: Mapping[str, Any],
        batch_size: int,
        inputs: Sequence[Mapping[str, Any]],
        target: Mapping[str, Any],
        loss: str = "cross_entropy",
        **extra: Any,
    ) -> None:
        self.name = str(name)
        if isinstance(module, Mapping) and str(module.get("_target_", "")) == "???" or _is_missing(module):
            raise CaptureError(f"model {self.name!r}: set model.module._target_ to an nn.Module factory, e.g. model.module._target_=my_pkg.make_model")
        self.module_cfg = _plain(module)
        if not isinstance(self.module_cfg, Mapping) or "_target_" not in self.module_cfg:
            raise CaptureError(f"model {self.name!r}: `module` needs a _target_ naming an nn.Module factory")
        self.batch_size = int(batch_size)
        self.inputs = [TensorSpec.from_cfg(_plain(s)) for s in inputs]
        self.target = TensorSpec.from_cfg(_plain(target))
        self.loss = str(loss)
        self.extra = {k: _plain(v) for k, v in extra.items()}

    def build(self) -> Any:
        """A fresh module (on whatever device is current)."""
        from hydra.utils import instantiate

        try:
            return instantiate(self.module_cfg)
        except Exception as e:  # noqa: BLE001
            raise CaptureError(f"could not build model {self.name!r} from {self.module_cfg.get('_target_')}: {e}") from e

    def _key(self, **kw: Any) -> str:
        return json.dumps([self.name, self.module_cfg, self.batch_size, [s.__repr__() for s in self.inputs], repr(self.target), self.loss, kw], sort_keys=True, default=str)

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32") -> OpGraph:
        """The joint forward/backward/update aten graph (memoised per configuration in this
        process); ``colocate_gradients`` ties each module's backward ops to its forward ops;
        ``precision`` is one of :data:`harness.precision.PRECISIONS`."""
        key = self._key(granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, precision=precision)
        if key not in _CACHE or (keep_fx and _CACHE[key].fx is None):
            _CACHE[key] = capture(
                self.build, self.inputs, self.target, self.loss, self.batch_size, name=self.name,
                granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, keep_fx=keep_fx, precision=precision,
            )
        return _graph_options(_CACHE[key], colocate_gradients)

    def layer_graph(self, precision: str = "fp32") -> Any:
        """The module-level LayerGraph (OptCNN / PaSE granularity), memoised like :meth:`op_graph`.

        A layer graph costs each layer in one dtype: ``fp32`` / ``tf32`` (``meta["precision"]``
        sets the math mode), ``fp16`` / ``bf16`` (the module and its floating inputs converted);
        AMP, whose dtype changes from op to op inside a layer, is refused."""
        import torch

        from harness.layergraph import build_layer_graph
        from harness.precision import Precision

        prec = Precision(precision)
        if prec.autocast_dtype is not None:
            raise CaptureError(f"model {self.name!r}: precision={precision} needs an operator graph (autocast picks a dtype "
                               "per op); a layer-graph algorithm takes fp32, tf32, fp16 or bf16")
        key = self._key(kind="layer", precision=precision)
        if key not in _LAYER_CACHE:
            with torch.device("meta"):
                module = self.build()
                if prec.param_dtype != "float32":
                    module = module.to(getattr(torch, prec.param_dtype))
            specs = [((self.batch_size, *s.shape), prec.param_dtype if s.dtype.startswith("float") else s.dtype)
                     for s in self.inputs]
            lg = build_layer_graph(module, specs, name=self.name, batch_size=self.batch_size)
            lg.meta["precision"] = prec.name
            _LAYER_CACHE[key] = lg
        return _LAYER_CACHE[key]


def _fixed_precision(name: str, precision: str, why: str) -> None:
    """Refuse a precision that a graph source cannot apply."""
    if precision != "fp32":
        raise CaptureError(f"model {name!r}: precision={precision} cannot apply ({why}); leave precision=fp32")


def _graph_options(g: OpGraph, colocate: bool) -> OpGraph:
    """Options that derive a graph from a captured one (``graph.colocate_gradients``)."""
    return colocate_gradients(g) if colocate else g


class SyntheticGraph:
    """A seeded random layered DAG (a scaling-study workload).

    ``nodes`` operators in layers of about ``width`` nodes; each node reads from
    ``1 + Poisson(degree - 1)`` nodes of the previous layer and, with probability
    ``skip``, from one earlier layer.  Work is uniform in [0.5, 1.5] x ``gflops`` GFLOP;
    edge sizes are scaled so that CCR (Celeritas Eq. 1: total transfer time over total
    compute time) equals ``ccr`` on the reference device (``ref_tflops``) and link
    (``ref_bw_GBps``).  The CCR on a real cluster follows from its own figures
    (``python -m experiments graph_stats`` prints it).
    """

    def __init__(
        self,
        name: str = "synthetic",
        nodes: int = 1000,
        ccr: float = 1.0,
        seed: int = 0,
        width: int | None = None,
        degree: float = 2.0,
        skip: float = 0.1,
        gflops: float = 1.0,
        ref_tflops: float = 10.0,
        ref_bw_GBps: float = 10.0,
        batch_size: int = 1,
        **extra: Any,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"synthetic graph needs nodes >= 1, got {nodes}")
        if ccr < 0:
            raise ValueError(f"synthetic graph needs ccr >= 0, got {ccr}")
        self.name, self.nodes, self.ccr, self.seed = str(name), int(nodes), float(ccr), int(seed)
        self.width = int(width) if width else max(1, int(round(np.sqrt(self.nodes))))
        self.degree, self.skip, self.gflops = float(degree), float(skip), float(gflops)
        self.ref_flops, self.ref_bw = float(ref_tflops) * 1e12, float(ref_bw_GBps) * 1e9
        self.batch_size = int(batch_size)

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32") -> OpGraph:
        """The random DAG (the capture options do not apply; it has no layers to co-locate)."""
        _fixed_precision(self.name, precision, "a synthetic graph has FLOPs and bytes, not dtypes")
        rng = np.random.default_rng(self.seed)
        n = self.nodes
        # layer widths: width +- 50%, covering n nodes
        widths: list[int] = []
        while sum(widths) < n:
            widths.append(int(rng.integers(max(1, self.width // 2), self.width + self.width // 2 + 1)))
        widths[-1] -= sum(widths) - n
        starts = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        layer_of = np.repeat(np.arange(len(widths)), widths)
        v = np.arange(starts[1] if len(widths) > 1 else n, n)  # nodes with a previous layer
        L = layer_of[v]
        k = 1 + rng.poisson(max(self.degree - 1.0, 0.0), size=len(v))
        rows = np.repeat(v, k)
        lo, hi = starts[L - 1], starts[L]
        src = np.repeat(lo, k) + (rng.random(len(rows)) * np.repeat(hi - lo, k)).astype(np.int64)
        sk = np.flatnonzero((rng.random(len(v)) < self.skip) & (L >= 2))
        if len(sk):
            far_layer = (rng.random(len(sk)) * (L[sk] - 1)).astype(np.int64)
            far = starts[far_layer] + (rng.random(len(sk)) * (starts[far_layer + 1] - starts[far_layer])).astype(np.int64)
            rows = np.concatenate([rows, v[sk]])
            src = np.concatenate([src, far])
        pair = np.unique(src * n + rows)
        src, dst = pair // n, pair % n
        flops = rng.uniform(0.5, 1.5, n) * self.gflops * 1e9
        weight = rng.uniform(0.5, 1.5, len(src))
        comp_time = flops.sum() / self.ref_flops
        nb = (weight / weight.sum() * self.ccr * comp_time * self.ref_bw).astype(np.int64) if len(src) else np.zeros(0, np.int64)
        nb = np.maximum(nb, 4 if self.ccr > 0 else 0)
        out_b = np.zeros(n, np.int64)
        np.maximum.at(out_b, src, nb)
        in_b = np.bincount(dst, weights=nb, minlength=n).astype(np.int64)
        return OpGraph(
            names=[f"op{i}" for i in range(n)], targets=["synthetic.op"] * n, phase=np.full(n, FORWARD),
            layer=layer_of.astype(np.int32), layer_names=[f"layer{i}" for i in range(len(widths))], flops=flops,
            out_bytes=out_b, work_bytes=np.zeros(n, np.int64), free=np.zeros(n, bool),
            batch_role=np.full(n, BATCHED), coloc=np.full(n, -1), src=src, dst=dst, nbytes=nb,
            meta={"model": self.name, "batch_size": self.batch_size, "dtype": "float32", "synthetic": True,
                  "ccr_ref": self.ccr, "seed": self.seed, "in_bytes": in_b.sum().item()},
        )


class GraphFile:
    """A graph saved with :meth:`OpGraph.save` (``model=from_file model.path=...``)."""

    def __init__(self, path: str, name: str | None = None, batch_size: int | None = None, **extra: Any) -> None:
        if not path or path == "???":
            raise ValueError("model=from_file needs model.path=<graph.json>")
        self.path = Path(path)
        self._graph: OpGraph | None = None
        self.name = name or self.path.stem
        self._batch = batch_size

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32") -> OpGraph:
        """The saved graph (as saved: the capture options do not apply, co-location does)."""
        _fixed_precision(self.name, precision, "a graph file keeps the dtypes it was captured with")
        if self._graph is None:
            self._graph = OpGraph.load(self.path)
        return _graph_options(self._graph, colocate_gradients)

    @property
    def batch_size(self) -> int:
        return int(self._batch or self.op_graph().meta.get("batch_size", 1))
