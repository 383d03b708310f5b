"""Graph sources: what a ``conf/model/*.yaml`` instantiates.

Every source has a ``name``, a ``batch_size`` and :meth:`op_graph`; PyTorch models also
give a :meth:`TorchModel.layer_graph`.  Three kinds:

* :class:`TorchModel`: any ``nn.Module`` factory (``module._target_``), captured with
  :func:`harness.core.capture.capture`; the zoo models and ``model=custom`` use it.
* :class:`SyntheticGraph`: a seeded random layered DAG with a chosen size and CCR, for
  scaling studies.
* :class:`GraphFile`: a graph saved with :meth:`OpGraph.save` or :meth:`LayerGraph.save`.
* :class:`BuiltLayerGraph`: a layer graph written in code with
  :class:`harness.core.layer_builder.LayerGraphBuilder` (PaSE's graphs: ``model=pase_alexnet``).

Every source checks its config when it is built (by ``harness.app.run.build``, before anything is
traced or simulated), and a mistake is a :class:`harness.core.errors.UserError` whose one-line
message names the key as the user types it (``model.batch_size``, ``model.module.depth``):

* **Keys.**  A model config may hold the parameters of its source's constructor and, for a
  :class:`TorchModel`, the *helper keys* it lists in ``helpers``: values such as
  ``image_size`` or ``vocab`` that exist only to be interpolated into ``module``, ``inputs``
  or ``target`` (``shape: [3, "${....image_size}", ...]``).  Hydra resolves the interpolations
  before a source sees its config, so which keys they read cannot be found out afterwards;
  ``helpers`` declares them.  Any other key (``+model.batchsize=8``) is refused, naming it and
  listing the keys the source takes; so is a listed helper the config does not set.
* **The factory's keys.**  The keys under ``model.module`` (but Hydra's ``_target_``,
  ``_args_``, ...) are the keyword arguments of the factory ``module._target_``: one its
  signature does not take (unless it takes ``**kwargs``) or a required one that is not given
  is refused, naming ``model.module.<key>``.
* **Values.**  ``batch_size`` is an integer >= 1 (2.5, ``null`` and ``abc`` are refused, not
  rounded); a synthetic graph's sizes and reference figures are in range.
* **Graph files.**  The file is read and checked (:meth:`OpGraph.load`) when the source is
  built; what a file graph cannot apply is refused, not ignored: a ``model.batch_size`` other
  than the file's, a ``graph.granularity`` or ``graph.optimizer`` other than the one it was
  captured with, a precision other than fp32.  Without ``model.name`` it is named after the
  file's stem.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from harness.core.capture import CaptureError, TensorSpec, capture
from harness.core.graph_rewrites import colocate_gradients
from harness.core.checks import integer, non_negative_number, positive_int, positive_number
from harness.core.errors import ModelConfigError, UserError
from harness.core.graph_cache import cached, source_file_digest
from harness.core.graph import BATCHED, FORWARD, GRAPH_FORMAT, PARTIAL, GraphError, OpGraph, read_json_object
from harness.core.graph_file import MAX_SIZE
from harness.core.layergraph import LAYERGRAPH_FORMAT, LayerGraph
from harness.core.llm.stack import StackGraph, layer_stack

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


#: keys under ``model.module`` that Hydra's ``instantiate`` reads itself
HYDRA_KEYS = frozenset({"_target_", "_args_", "_recursive_", "_convert_", "_partial_"})


def _one_line(text: Any) -> str:
    """``text`` with its whitespace runs (newlines included) folded into single spaces."""
    return " ".join(str(text).split())


def _parameters(owner: type) -> list[str]:
    """The keyword parameters of ``owner``'s constructor (its config keys)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in inspect.signature(owner.__init__).parameters.items() if n != "self" and p.kind in kinds]


def _refuse_unknown_keys(owner: type, name: str, extra: Mapping[str, Any], helpers: Sequence[str] | None = None) -> None:
    """Refuse the model config keys in ``extra`` (those ``owner``'s constructor did not take)
    that are not listed ``helpers`` (None: the source takes none), and the listed helpers
    ``extra`` does not set."""
    unknown = [str(k) for k in extra if k not in (helpers or ())]
    if unknown:
        listed = "" if helpers is None else (f", and the helpers it lists ({', '.join(helpers)}); a key that only feeds "
                                             "module, inputs or target interpolations must be listed in model.helpers")
        raise ModelConfigError(f"model.{unknown[0]} is not a key of model {name!r}: {owner.__name__} takes "
                               f"{', '.join(_parameters(owner))}{listed}")
    unset = [h for h in helpers or () if h not in extra]
    if unset:
        raise ModelConfigError(f"model.helpers lists {unset[0]!r}, which model {name!r} does not set: "
                               f"set +model.{unset[0]}=... or drop it from model.helpers")


def _helper_list(helpers: Any) -> list[str]:
    """``model.helpers`` as a list of key names."""
    value = _plain(helpers)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(h, str) for h in value):
        raise ModelConfigError(f"model.helpers must be a list of key names, got {value!r}")
    return list(value)


def _factory(target: str) -> Callable[..., Any]:
    """The callable ``model.module._target_`` names, located (and authorised) by Hydra without calling it."""
    from hydra.utils import instantiate

    try:
        return instantiate({"_target_": target}, _partial_=True).func
    except Exception as e:  # noqa: BLE001 - Hydra wraps the import error
        raise CaptureError(f"model.module._target_={target} cannot be imported ({_one_line(e.__cause__ or e)}); "
                           "name an importable nn.Module factory, e.g. model.module._target_=my_pkg.make_model") from e


def _check_factory_keys(module_cfg: Mapping[str, Any]) -> None:
    """Refuse keys under ``model.module`` that its factory does not take, and required
    parameters of the factory that are not given (see the module docstring)."""
    target = str(module_cfg["_target_"])
    try:
        params = inspect.signature(_factory(target)).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        return
    given = [str(k) for k in module_cfg if k not in HYDRA_KEYS]
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in given if k not in named]
        if unknown:
            raise ModelConfigError(f"model.module.{unknown[0]} is not a parameter of {target}: it takes "
                                   f"{', '.join(named) or 'no arguments'}; fix the name or remove the key")
    positional = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_args = positional[:len(module_cfg.get("_args_") or ())]
    required = [n for n, p in params.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and n not in given and n not in by_args]
    if required:
        raise ModelConfigError(f"model.module.{required[0]} is required by {target}: set +model.module.{required[0]}=...")


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
        helpers: Sequence[str] | None = None,
        **extra: Any,
    ) -> None:
        self.name = str(name)
        _refuse_unknown_keys(TorchModel, self.name, extra, _helper_list(helpers))
        if isinstance(module, Mapping) and str(module.get("_target_", "")) == "???" or _is_missing(module):
            raise CaptureError(f"model {self.name!r}: set model.module._target_ to an nn.Module factory, e.g. model.module._target_=my_pkg.make_model")
        self.module_cfg = _plain(module)
        if not isinstance(self.module_cfg, Mapping) or "_target_" not in self.module_cfg:
            raise CaptureError(f"model {self.name!r}: `module` needs a _target_ naming an nn.Module factory")
        _check_factory_keys(self.module_cfg)
        self.batch_size = positive_int(batch_size, "model.batch_size", ModelConfigError)
        self.inputs = [TensorSpec.from_cfg(_plain(s)) for s in inputs]
        self.target = TensorSpec.from_cfg(_plain(target))
        self.loss = str(loss)

    def build(self) -> Any:
        """A fresh module (on whatever device is current)."""
        from hydra.utils import instantiate

        try:
            return instantiate(self.module_cfg)
        except Exception as e:  # noqa: BLE001
            raise CaptureError(f"could not build model {self.name!r} from {self.module_cfg.get('_target_')}: "
                               f"{_one_line(e.__cause__ or e)}") from e

    def _key(self, **kw: Any) -> str:
        return json.dumps([self.name, self.module_cfg, self.batch_size, [s.__repr__() for s in self.inputs], repr(self.target), self.loss, kw], sort_keys=True, default=str)

    #: where the last graph came from: ``"disk"`` (the graph cache), ``"memory"`` (this process
    #: captured it before), ``"captured"`` or ``"captured (cache off)"``
    graph_source: str = "captured"

    def _cache_parts(self, key: str) -> list[Any]:
        """What a cached graph depends on besides the harness's code: the config and the factory's file."""
        return [key, source_file_digest(_factory(str(self.module_cfg["_target_"])))]

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32", cache: bool = True) -> OpGraph:
        """The joint forward/backward/update aten graph (memoised per configuration in this
        process, and on disk unless ``cache`` is false: :mod:`harness.core.graph_cache`);
        ``colocate_gradients`` ties each module's backward ops to its forward ops;
        ``precision`` is one of :data:`harness.core.precision.PRECISIONS`; ``keep_fx`` (a real
        run executes the graph) captures afresh."""
        key = self._key(granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, precision=precision)
        if key not in _CACHE or (keep_fx and _CACHE[key].fx is None):
            def build() -> OpGraph:
                return capture(
                    self.build, self.inputs, self.target, self.loss, self.batch_size, name=self.name,
                    granularity=granularity, optimizer=optimizer, batch_probe=batch_probe, keep_fx=keep_fx, precision=precision,
                )
            use = bool(cache) and not keep_fx
            _CACHE[key], hit = cached("op", self._cache_parts(key), build, use)
            self.graph_source = "disk" if hit else "captured" if use or keep_fx else "captured (cache off)"
        else:
            self.graph_source = "memory"
        return _graph_options(_CACHE[key], colocate_gradients)

    def layer_graph(self, precision: str = "fp32", cache: bool = True) -> Any:
        """The module-level LayerGraph (OptCNN / PaSE granularity), memoised and cached like :meth:`op_graph`.

        A layer graph costs each layer in one dtype: ``fp32`` / ``tf32`` (``meta["precision"]``
        sets the math mode), ``fp16`` / ``bf16`` (the module and its floating inputs converted);
        AMP, whose dtype changes from op to op inside a layer, is refused; ``fp16_master`` is its
        FP16 model (the FP32 master weights are the optimizer's)."""
        import torch

        from harness.core.layerfx import build_layer_graph
        from harness.core.precision import Precision, fp8_scope

        prec = Precision(precision)
        if prec.fp8_linears:
            raise CaptureError(fp8_scope(self.name))
        if prec.autocast_dtype is not None:
            raise CaptureError(f"model {self.name!r}: precision={precision} needs an operator graph (autocast picks a dtype "
                               "per op); a layer-graph algorithm takes fp32, tf32, fp16 or bf16")
        key = self._key(kind="layer", precision=precision)
        if key not in _LAYER_CACHE:
            def build() -> Any:
                with torch.device("meta"):
                    module = self.build()
                    if prec.model_dtype != "float32":
                        module = module.to(getattr(torch, prec.model_dtype))
                specs = [((self.batch_size, *s.shape), prec.model_dtype if s.dtype.startswith("float") else s.dtype)
                         for s in self.inputs]
                lg = build_layer_graph(module, specs, name=self.name, batch_size=self.batch_size)
                lg.meta["precision"] = prec.name
                return lg
            _LAYER_CACHE[key], hit = cached("layer", self._cache_parts(key), build, bool(cache))
            self.graph_source = "disk" if hit else "captured" if cache else "captured (cache off)"
        else:
            self.graph_source = "memory"
        return _LAYER_CACHE[key]

    def stack_graph(self, precision: str = "fp32", cache: bool = True) -> StackGraph:
        """The model as a chain of pipeline units cut from its layer graph
        (:func:`harness.core.llm.stack.layer_stack`: one unit per GEMM-like layer with the cheap
        layers after it), so that the pipeline schedules run on it (GPipe on ResNet).  Under AMP
        the layer graph is built in the autocast dtype (``amp_bf16`` as ``bf16``): a layer graph
        has one dtype per layer, and the stack planners account for the FP32 master weights."""
        layer_precision = {"amp_fp16": "fp16", "amp_bf16": "bf16"}.get(precision, precision)
        return layer_stack(self.layer_graph(precision=layer_precision, cache=cache), self.name, self.batch_size, precision)


def _fixed_precision(name: str, precision: str, why: str) -> None:
    """Refuse a precision that a graph source cannot apply."""
    if precision != "fp32":
        raise CaptureError(f"model {name!r}: precision={precision} cannot apply ({why}); leave precision=fp32")


def _graph_options(g: OpGraph, colocate: bool) -> OpGraph:
    """Options that derive a graph from a captured one (``graph.colocate_gradients``)."""
    return colocate_gradients(g) if colocate else g


def _probability(value: Any, key: str) -> float:
    """``value`` as a float in [0, 1], else a ModelConfigError naming ``key``."""
    p = non_negative_number(value, key, ModelConfigError)
    if p > 1:
        raise ModelConfigError(f"{key} must be in [0, 1], got {value!r}")
    return p


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

    graph_source: str = "generated"

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
        _refuse_unknown_keys(SyntheticGraph, str(name), extra)
        self.name = str(name)
        self.nodes = positive_int(nodes, "model.nodes", ModelConfigError)
        self.ccr = non_negative_number(ccr, "model.ccr", ModelConfigError)
        self.seed = integer(seed, "model.seed", ModelConfigError)
        self.width = max(1, int(round(np.sqrt(self.nodes)))) if width is None else positive_int(width, "model.width", ModelConfigError)
        self.degree = positive_number(degree, "model.degree", ModelConfigError)
        self.skip = _probability(skip, "model.skip")
        self.gflops = positive_number(gflops, "model.gflops", ModelConfigError)
        self.ref_flops = positive_number(ref_tflops, "model.ref_tflops", ModelConfigError) * 1e12
        self.ref_bw = positive_number(ref_bw_GBps, "model.ref_bw_GBps", ModelConfigError) * 1e9
        self.batch_size = positive_int(batch_size, "model.batch_size", ModelConfigError)
        self._check_size()

    #: the most memory a generated graph may take (its arrays, names and the edges while they are drawn)
    MAX_BYTES = 4 * 2**30
    #: what a node costs: its name and target (~70 bytes), its arrays (~45) and what the graph's
    #: users keep per node (~85); an edge: its arrays while drawn and deduplicated, then kept (~120)
    NODE_BYTES, EDGE_BYTES = 200, 120

    def _check_size(self) -> None:
        """Refuse a graph that would take more than :data:`MAX_BYTES` to generate, before allocating it."""
        edges = self.nodes * (self.degree + self.skip)
        need = self.nodes * self.NODE_BYTES + edges * self.EDGE_BYTES
        if need > self.MAX_BYTES:
            raise ModelConfigError(f"model.nodes={self.nodes} with model.degree={self.degree:g} is a graph of about {edges:.3g} "
                                   f"edges, about {need / 2**30:.3g} GiB to generate; the limit is {self.MAX_BYTES / 2**30:g} GiB: "
                                   "take fewer nodes or a smaller degree")
        flops = 1.5 * self.nodes * self.gflops * 1e9  # the most the nodes' work can add up to
        moved = self.ccr * flops / self.ref_flops * self.ref_bw  # the edges' bytes, all together
        if not math.isfinite(flops) or not moved < 2**62:
            raise ModelConfigError(f"model.gflops={self.gflops:g} and model.ccr={self.ccr:g} (against model.ref_tflops and "
                                   f"model.ref_bw_GBps) give {self.nodes} nodes about {flops:.3g} FLOPs and their edges about "
                                   f"{moved:.3g} bytes, more than a count of bytes holds (2^62): take smaller figures")

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32", cache: bool = True) -> OpGraph:
        """The random DAG (the capture options do not apply; it has no layers to co-locate; generated, not cached)."""
        _fixed_precision(self.name, precision, "a synthetic graph has FLOPs and bytes, not dtypes")
        rng = np.random.default_rng(self.seed)
        n = self.nodes
        # layer widths: width +- 50%, covering n nodes
        widths: list[int] = []
        total = 0  # sum(widths), kept: summing in the loop is quadratic in the layers
        while total < n:
            widths.append(int(rng.integers(max(1, self.width // 2), self.width + self.width // 2 + 1)))
            total += widths[-1]
        widths[-1] -= total - n
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

    def layer_graph(self, precision: str = "fp32", cache: bool = True) -> LayerGraph:
        """Refused: a generated DAG of operators has no layers to split."""
        raise ModelConfigError(f"model {self.name!r} is a generated operator graph and has no layer graph; the layer-graph "
                               "algorithms (algo=pase, optcnn, optcnn_dfs, flexflow_mcmc, ...) need a PyTorch model "
                               "(a zoo model or model=custom) or a layer graph file")


class GraphFile:
    """A graph saved with :meth:`OpGraph.save` or :meth:`LayerGraph.save` (``model=from_file
    model.path=...``), told apart by the file's ``format`` tag, read and checked when the source
    is built; ``batch_size`` is the file's (a different ``model.batch_size`` is refused). An
    operator graph feeds the operator-graph algorithms, a layer graph OptCNN, PaSE and the other
    layer-graph searches; asking a file for the other kind is a one-line error."""

    graph_source: str = "file"

    def __init__(self, path: str, name: str | None = None, batch_size: int | None = None, **extra: Any) -> None:
        _refuse_unknown_keys(GraphFile, str(name or path), extra)
        if not path or path == "???":
            raise ModelConfigError("model=from_file needs model.path=<graph.json> (a graph saved with OpGraph.save or LayerGraph.save)")
        self.path = Path(path)
        d = read_json_object(self.path, "graph file", GraphError)
        fmt = d.get("format")
        self._graph: OpGraph | None = None
        self._layer: LayerGraph | None = None
        if isinstance(fmt, str) and fmt.startswith("harness.layergraph/"):
            try:
                self._layer = LayerGraph.from_dict(d)
            except UserError as e:
                raise GraphError(f"layer graph file {self.path}: {e}") from None
            meta = self._layer.meta
        elif isinstance(fmt, str) and fmt.startswith("harness.opgraph/"):
            try:
                self._graph = OpGraph.from_dict(d)
            except UserError as e:
                raise GraphError(f"graph file {self.path}: {e}") from None
            meta = self._graph.meta
        else:
            raise GraphError(f"graph file {self.path}: format is {fmt!r}; expected an operator graph ({GRAPH_FORMAT!r}) "
                             f"or a layer graph ({LAYERGRAPH_FORMAT!r})")
        self.name = name or self.path.stem
        self.batch_size = positive_int(meta.get("batch_size", 1), f"graph file {self.path}: meta.batch_size", GraphError)
        if self.batch_size > MAX_SIZE:
            raise GraphError(f"graph file {self.path}: meta.batch_size must be an integer in 1..{MAX_SIZE}, got {self.batch_size}")
        if batch_size is not None and positive_int(batch_size, "model.batch_size", ModelConfigError) != self.batch_size:
            raise ModelConfigError(f"model.batch_size={batch_size} cannot apply to graph file {self.path}: its batch size "
                                   f"is {self.batch_size}, fixed when it was captured; leave model.batch_size=null")
        #: what the file lacks that a step needs, for result.json's ``warnings`` (docs/graph_format.md)
        self.warnings = self._missing_parts()

    def _missing_parts(self) -> list[str]:
        """Warnings for a file without the parts of a training step data parallelism synchronises:
        an operator graph without a parameter table or without a partial node (a weight gradient,
        batch_role 1), a layer graph without parameter bytes.  Flagged, not refused: a forward-only
        graph is a valid input, but its data-parallel step reduces no gradient."""
        where = f"graph file {self.path}"
        if self._layer is not None:
            if int(self._layer.param_bytes.sum()) == 0:
                return [f"{where} gives no layer parameter bytes (param_bytes all 0): data parallelism of it synchronises no "
                        "weights, so its step is too optimistic for a training step"]
            return []
        g = self._graph
        assert g is not None
        lacks = []
        if len(g.param_bytes) == 0:
            lacks.append("no parameter table (param_bytes): its weights take no memory")
        if not bool((g.batch_role == PARTIAL).any()):
            lacks.append("no partial node (batch_role 1, a weight gradient): data parallelism of it reduces no gradient (no all-reduce)")
        return [f"{where} has {' and '.join(lacks)}; its step is too optimistic for a training step"] if lacks else []

    def layer_graph(self, precision: str = "fp32", cache: bool = True) -> LayerGraph:
        """The saved layer graph (precision as saved; a file needs no cache)."""
        if self._layer is None:
            raise ModelConfigError(f"graph file {self.path} holds an operator graph; this algorithm plans on a layer graph "
                                   "(save one with LayerGraph.save, or pick an operator-graph algorithm)")
        _fixed_precision(self.name, precision, "a graph file keeps the dtypes it was saved with")
        return self._layer

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 colocate_gradients: bool = False, precision: str = "fp32", cache: bool = True) -> OpGraph:
        """The saved graph (as saved: a capture option other than the file's is refused, co-location applies;
        a file needs no cache)."""
        if self._graph is None:
            raise ModelConfigError(f"graph file {self.path} holds a layer graph; this algorithm plans on an operator graph "
                                   "(use a layer-graph algorithm such as algo=pase or algo=optcnn, or save an OpGraph)")
        _fixed_precision(self.name, precision, "a graph file keeps the dtypes it was captured with")
        self._fixed_option("granularity", granularity, str(self._graph.meta.get("granularity", "aten")))
        if "optimizer" in self._graph.meta:
            self._fixed_option("optimizer", optimizer, str(self._graph.meta["optimizer"]))
        return _graph_options(self._graph, colocate_gradients)

    def _fixed_option(self, option: str, asked: str, saved: str) -> None:
        """Refuse ``graph.<option>=asked`` when the file was captured with ``saved``."""
        if str(asked) != saved:
            raise ModelConfigError(f"graph.{option}={asked} cannot apply to graph file {self.path}: it was captured with "
                                   f"{option} {saved}; pass graph.{option}={saved}")


class BuiltLayerGraph:
    """A layer graph written in code (``conf/model/pase_*.yaml``, ``model=built``): ``fn`` names a
    function ``fn(batch_size, **kwargs) -> LayerGraph``, typically built with
    :class:`harness.core.layer_builder.LayerGraphBuilder`. It feeds the layer-graph algorithms only."""

    graph_source: str = "built in code"

    def __init__(self, fn: str, batch_size: int, name: str | None = None, kwargs: Mapping[str, Any] | None = None,
                 **extra: Any) -> None:
        _refuse_unknown_keys(BuiltLayerGraph, str(name or fn), extra)
        if not fn or fn == "???":
            raise ModelConfigError("model=built needs model.fn=<module.function> returning a LayerGraph")
        self.fn = str(fn)
        self.batch_size = positive_int(batch_size, "model.batch_size", ModelConfigError)
        self.name = name or self.fn.rsplit(".", 1)[-1]
        self.kwargs = dict(_plain(kwargs) or {})
        self._layer: LayerGraph | None = None

    def layer_graph(self, precision: str = "fp32", cache: bool = True) -> LayerGraph:
        """The graph ``fn`` builds (once per process; code is not cached), checked to be a :class:`LayerGraph`."""
        _fixed_precision(self.name, precision, "a layer graph built in code has the dtypes its code gives")
        if self._layer is None:
            from hydra.utils import instantiate

            try:
                make = instantiate({"_target_": self.fn}, _partial_=True)
            except Exception as e:  # noqa: BLE001 - Hydra wraps the import error
                raise ModelConfigError(f"model.fn={self.fn} cannot be imported ({_one_line(e.__cause__ or e)}); "
                                       "name an importable function returning a LayerGraph") from e
            lg = make(batch_size=self.batch_size, **self.kwargs)
            if not isinstance(lg, LayerGraph):
                raise ModelConfigError(f"model.fn={self.fn} returned {type(lg).__name__}, not a LayerGraph")
            self._layer = lg
        return self._layer

    def op_graph(self, **_: Any) -> OpGraph:
        """Refused: a layer graph written in code has no operator graph."""
        raise ModelConfigError(f"model {self.name!r} is a layer graph written in code; it feeds the layer-graph algorithms "
                               "(algo=pase, optcnn, optcnn_dfs, flexflow_mcmc, ...), not operator-graph ones")
