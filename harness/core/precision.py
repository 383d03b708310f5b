"""Numeric precision of a captured training step (the top-level config key ``precision``).

===========  ==========================  ==================================  ====================
name         tensors                     matmul / convolution math           master weights
===========  ==========================  ==================================  ====================
fp32         FP32                        FP32 matmuls, TF32 convolutions     FP32 (no copy)
tf32         FP32                        TF32 matmuls and convolutions       FP32 (no copy)
amp_fp16     per op, as CUDA autocast    FP16 tensor cores (autocast list)   FP32, loss scaling
amp_bf16     per op, as CUDA autocast    BF16 tensor cores (autocast list)   FP32
fp16         FP16 (``module.half()``)    FP16 tensor cores                   none
bf16         BF16 (``module.bfloat16()``) BF16 tensor cores                  none
fp16_master  FP16 (the model's copy)     FP16 tensor cores                   FP32, loss scaling
amp_fp8      as ``amp_bf16``             linear layers FP8, the rest BF16    FP32
===========  ==========================  ==================================  ====================

``fp32`` is PyTorch's default: ``torch.backends.cuda.matmul.allow_tf32`` is False and
``torch.backends.cudnn.allow_tf32`` is True, so convolutions run in TF32 on GPUs that have it
(Ampere and later) and matmuls do not; ``tf32`` sets both flags.  The math mode recorded on a
kernel (:data:`MATH`) is what the software asks for; a cost model maps it to the rate the
device has (TF32 on a V100 runs at the FP32 rate: it has no TF32 units).

AMP is captured under CUDA autocast's own rules.  This CPU-only build of PyTorch cannot run
CUDA autocast (it needs CUDA tensors), so :func:`cuda_autocast` runs CPU autocast with its op
lists replaced by the CUDA lists of PyTorch's ``ATen/autocast_mode.h`` (the
``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE`` and
``AT_FORALL_PROMOTE`` lists of torch 2.13, the version this project pins): ops on the first
list cast their floating inputs to the autocast dtype, on the second to FP32, the third run
in FP32 by their ``dtype`` argument, the fourth promote to the widest input type, and every
other op runs in the dtype of its inputs.  The casts are autograd ops, so the backward pass
follows (a gradient reaches an FP32 weight through the cast's backward), parameters stay
FP32 (the master weights) and the update runs in FP32.  Casts of a weight are cached within
the autocast region, as CUDA autocast caches them (a weight read at every step of an
unrolled RNN is cast once).  ``amp_fp16`` scales the loss and unscales each gradient before
the update, as ``torch.amp.GradScaler`` does.  This is apex AMP's ``O1`` too (it patches the
same op lists into ``torch`` functions).

``fp16_master`` is the other way mixed precision was run before autocast, and still is by
fairseq's ``--fp16``, apex AMP's ``O2`` (``opt_level="O2"``, the default of NVIDIA's
DeepLearningExamples GNMT and Transformer trainers) and Megatron-LM's ``--fp16``: the model
itself is FP16 (every layer runs in FP16, no per-op casts), an FP32 master copy of the weights
lives in the optimizer, the loss is computed on FP32 logits (fairseq's and GNMT's
``log_softmax(..., dtype=torch.float32)``), the loss is scaled, each FP16 gradient is copied to
its FP32 master gradient with the loss scale divided out in the same pass (apex's
``multi_tensor_scale``), the update runs on the master weights, and they are copied back into
the FP16 model (captured as the cast at the start of the step: one read of the FP32 master and
one write of the FP16 copy per step either way).  Batch norm keeps FP32 parameters
(``keep_batchnorm_fp32``, O2's default).

``amp_fp8`` is FP8 training as torchtitan runs it on Hopper (torchao's ``Float8Linear``, its
default ``tensorwise`` recipe), the GEMMs of NVIDIA Transformer Engine's recipe (Megatron-LM)
with its per-tensor *current* scaling: the GEMMs of the transformer's linear layers in FP8 (E4M3
activations and weights forward, E5M2 gradients backward: the ``HYBRID`` format), each operand
quantized by an amax pass and a cast, everything else (attention, norms, the output head, the
embedding) in BF16 under autocast, FP32 master weights.  What that means for a transformer
block's kernels and memory is :mod:`harness.core.llm.fp8`'s; it applies to a transformer's
stack graph (``model=llm``, the LLM presets, ``model=hf``), and needs a device with FP8 tensor
cores (a ``float8`` peak: :meth:`Precision.check_device`).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from harness.core.errors import UserError

#: the values of the ``precision`` config key
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "amp_fp16", "amp_bf16", "fp16", "bf16", "fp16_master", "amp_fp8")

#: math modes a kernel records: what its inputs are and what the software allows
MATH: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp64", "int", "fp8")
FP32, TF32, FP16, BF16, FP64, INT, FP8 = range(len(MATH))

#: the loss scale ``GradScaler`` starts from (``init_scale=2**16``)
LOSS_SCALE = 2.0**16


class PrecisionError(UserError, ValueError):
    """An unknown precision name."""


@dataclass(frozen=True)
class Precision:
    """One of :data:`PRECISIONS`, with what capture and the cost models need to know."""

    name: str = "fp32"

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise PrecisionError(f"unknown precision {self.name!r}: use one of {', '.join(PRECISIONS)}")

    @property
    def autocast_dtype(self) -> str | None:
        """``float16`` / ``bfloat16`` under AMP (``amp_fp8``: BF16 for all but its FP8 GEMMs), else None."""
        return {"amp_fp16": "float16", "amp_bf16": "bfloat16", "amp_fp8": "bfloat16"}.get(self.name)

    @property
    def param_dtype(self) -> str:
        """dtype of the parameters the step keeps (the master weights under AMP and ``fp16_master``)."""
        return {"fp16": "float16", "bf16": "bfloat16"}.get(self.name, "float32")

    @property
    def model_dtype(self) -> str:
        """dtype the model's layers take their weights and floating inputs in: the FP16 copy under
        ``fp16_master``, else :attr:`param_dtype` (autocast casts per op)."""
        return "float16" if self.name == "fp16_master" else self.param_dtype

    @property
    def compute_dtype(self) -> str:
        """dtype the activations are kept and the matmuls run in: the autocast dtype under AMP, else
        :attr:`model_dtype` (a transformer's stack graph and the MFU's peak read it)."""
        return self.autocast_dtype or self.model_dtype

    @property
    def master_copy(self) -> bool:
        """Does the step keep FP32 master weights beside a half-precision model (``fp16_master``)?"""
        return self.name == "fp16_master"

    @property
    def loss_scaling(self) -> bool:
        """Does the step scale the loss and unscale the gradients (``GradScaler``, apex's loss scaler)?"""
        return self.name in ("amp_fp16", "fp16_master")

    @property
    def fp8_linears(self) -> bool:
        """Do the transformer's linear layers run their GEMMs in FP8 (``amp_fp8``)?"""
        return self.name == "amp_fp8"

    def float_math(self, is_conv: bool) -> int:
        """The math mode of a matmul (``is_conv`` False) or convolution on FP32 tensors."""
        if self.name == "tf32" or (is_conv and self.name in ("fp32", "amp_fp16", "amp_bf16", "fp16_master", "amp_fp8")):
            return TF32
        return FP32

    def check_device(self, kind: str, peaks: Mapping[str, float]) -> None:
        """Refuse a device that cannot run this precision: ``amp_fp8`` needs FP8 tensor cores, a
        ``float8`` entry in the device's ``peak_tflops`` (Hopper and later; an A100 has none)."""
        if self.fp8_linears and not peaks.get("float8"):
            raise PrecisionError(f"precision={self.name} needs FP8 tensor cores, and device {kind} has no float8 peak in its "
                                 "peak_tflops (FP8 runs on Hopper, H100 / H200, and later): use precision=amp_bf16")


def fp8_scope(model: str) -> str:
    """Why ``amp_fp8`` does not apply to an operator or layer graph, in one line."""
    return (f"model {model!r}: precision=amp_fp8 (FP8 linear layers) is costed on a transformer's "
            "stack graph (model=llm, an LLM preset or model=hf with algo=megatron / fsdp); for this graph use precision=amp_bf16")


def math_of(dtype: str, is_conv: bool, precision: Precision) -> int:
    """:data:`MATH` code of a kernel whose inputs are ``dtype`` under ``precision``."""
    if dtype == "float32":
        return precision.float_math(is_conv)
    return {"float16": FP16, "bfloat16": BF16, "float64": FP64}.get(dtype, INT if dtype else FP32)


# ------------------------------------------------------------------ CUDA autocast's op lists
# (op, overload) pairs of ATen/autocast_mode.h, torch 2.13; "" is the default overload.
LOWER_PRECISION_FP: tuple[tuple[str, str], ...] = tuple((op, ov) for op, ov in (
    ("_convolution", "deprecated"), ("_convolution", ""), ("conv1d", ""), ("conv2d", ""), ("conv3d", ""),
    ("conv_tbc", ""), ("conv_transpose1d", ""), ("conv_transpose2d", "input"), ("conv_transpose3d", "input"),
    ("convolution", ""), ("prelu", ""), ("addmm", ""), ("addmv", ""), ("addr", ""), ("matmul", ""), ("einsum", ""),
    ("mm", ""), ("mv", ""), ("linalg_vecdot", ""), ("linear", ""), ("addbmm", ""), ("baddbmm", ""), ("bmm", ""),
    ("chain_matmul", ""), ("linalg_multi_dot", ""), ("_thnn_fused_lstm_cell", ""), ("_thnn_fused_gru_cell", ""),
    ("lstm_cell", ""), ("gru_cell", ""), ("rnn_tanh_cell", ""), ("rnn_relu_cell", ""),
    ("_scaled_dot_product_flash_attention", ""), ("scaled_dot_product_attention", ""),
))
FP32_OPS: tuple[tuple[str, str], ...] = tuple((op, ov) for op, ov in (
    ("acos", ""), ("asin", ""), ("cosh", ""), ("erfinv", ""), ("exp", ""), ("expm1", ""), ("log", ""), ("log10", ""),
    ("log2", ""), ("log1p", ""), ("reciprocal", ""), ("rsqrt", ""), ("sinh", ""), ("tan", ""), ("pow", "Tensor_Scalar"),
    ("pow", "Tensor_Tensor"), ("pow", "Scalar"), ("softplus", ""), ("layer_norm", ""), ("native_layer_norm", ""),
    ("rms_norm", ""), ("group_norm", ""), ("frobenius_norm", "dim"), ("nuclear_norm", ""), ("nuclear_norm", "dim"),
    ("cosine_similarity", ""), ("poisson_nll_loss", ""), ("cosine_embedding_loss", ""), ("nll_loss", ""),
    ("nll_loss2d", ""), ("hinge_embedding_loss", ""), ("kl_div", ""), ("l1_loss", ""), ("smooth_l1_loss", ""),
    ("huber_loss", ""), ("mse_loss", ""), ("margin_ranking_loss", ""), ("multilabel_margin_loss", ""),
    ("soft_margin_loss", ""), ("triplet_margin_loss", ""), ("multi_margin_loss", ""),
    ("binary_cross_entropy_with_logits", ""), ("dist", ""), ("pdist", ""), ("cdist", ""), ("renorm", ""),
    ("logsumexp", ""), ("upsample_nearest1d", ""), ("_upsample_nearest_exact1d", ""), ("upsample_nearest2d", ""),
    ("_upsample_nearest_exact2d", ""), ("upsample_nearest3d", ""), ("_upsample_nearest_exact3d", ""),
    ("upsample_linear1d", ""), ("upsample_bilinear2d", ""), ("_upsample_bilinear2d_aa", ""),
    ("upsample_trilinear3d", ""), ("upsample_bicubic2d", ""), ("_upsample_bicubic2d_aa", ""),
    ("norm", "Scalar"), ("norm", "ScalarOpt_dim"),  # AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE: FP32
))
FP32_SET_OPT_DTYPE: tuple[tuple[str, str], ...] = tuple((op, ov) for op, ov in (
    ("prod", ""), ("prod", "dim_int"), ("softmax", "int"), ("log_softmax", "int"), ("cumprod", ""), ("cumsum", ""),
    ("linalg_vector_norm", ""), ("linalg_matrix_norm", ""), ("linalg_matrix_norm", "str_ord"), ("sum", ""),
    ("sum", "dim_IntList"),
))
PROMOTE: tuple[tuple[str, str], ...] = tuple((op, "") for op in (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
))


def _eligible(t: Any) -> bool:
    """CUDA autocast casts floating tensors other than double."""
    import torch

    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _map_tensors(x: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, fn) for v in x)
    return x


def _tensors(x: Any) -> list[Any]:
    out: list[Any] = []
    _map_tensors(x, lambda t: out.append(t) or t)
    return out


class _CudaAutocast:
    """Python kernels at the ``AutocastCPU`` dispatch key that apply CUDA autocast's policy."""

    def __init__(self, dtype: Any) -> None:
        import torch

        self.torch = torch
        self.dtype = dtype
        self.cache: dict[int, tuple[Any, Any]] = {}  # id(weight) -> (weight, its cast)
        self.exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def _cast(self, t: Any, to: Any) -> Any:
        if not _eligible(t) or t.dtype == to:
            return t
        # CUDA autocast caches lower-precision casts of leaf tensors that require grad (weights)
        cacheable = to == self.dtype and t.is_leaf and t.requires_grad
        if cacheable and id(t) in self.cache:
            return self.cache[id(t)][1]
        out = t.to(to)
        if cacheable:
            self.cache[id(t)] = (t, out)
        return out

    def _below(self, op: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        with self.torch._C._ExcludeDispatchKeyGuard(self.exclude):
            return op(*args, **kwargs)

    def kernel(self, op: Any, policy: str) -> Callable[..., Any]:
        torch = self.torch

        def lower(*args: Any, **kwargs: Any) -> Any:
            cast = lambda t: self._cast(t, self.dtype)  # noqa: E731
            return self._below(op, _map_tensors(args, cast), {k: _map_tensors(v, cast) for k, v in kwargs.items()})

        def fp32(*args: Any, **kwargs: Any) -> Any:
            cast = lambda t: self._cast(t, torch.float32)  # noqa: E731
            return self._below(op, _map_tensors(args, cast), {k: _map_tensors(v, cast) for k, v in kwargs.items()})

        def set_opt_dtype(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else None
            names = [a.name for a in op._schema.arguments]
            pos = names.index("dtype") if "dtype" in names else -1
            given = kwargs.get("dtype") if "dtype" in kwargs else (args[pos] if 0 <= pos < len(args) else None)
            if _eligible(first) and first.dtype != torch.float32 and given is None:
                if 0 <= pos < len(args):
                    args = (*args[:pos], torch.float32, *args[pos + 1:])
                else:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return self._below(op, args, kwargs)

        def promote(*args: Any, **kwargs: Any) -> Any:
            floats = [t for t in _tensors((args, list(kwargs.values()))) if _eligible(t)]
            if not floats:
                return self._below(op, args, kwargs)
            widest = max((t.dtype for t in floats), key=lambda d: torch.finfo(d).bits)
            cast = lambda t: self._cast(t, widest)  # noqa: E731
            return self._below(op, _map_tensors(args, cast), {k: _map_tensors(v, cast) for k, v in kwargs.items()})

        return {"lower": lower, "fp32": fp32, "set_opt_dtype": set_opt_dtype, "promote": promote}[policy]


def _overload(op: str, overload: str) -> Any:
    import torch

    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


@contextlib.contextmanager
def cuda_autocast(dtype_name: str) -> Iterator[None]:
    """CPU autocast to ``dtype_name`` with CUDA autocast's op lists (see the module docstring).

    Use around the forward pass and the loss of a step traced on fake CPU tensors.  The
    kernels are registered for the duration of the block only."""
    import torch

    dtype = getattr(torch, dtype_name)
    rules = _CudaAutocast(dtype)
    policy: dict[str, str] = {}
    for name, lst in (("lower", LOWER_PRECISION_FP), ("fp32", FP32_OPS), ("set_opt_dtype", FP32_SET_OPT_DTYPE),
                      ("promote", PROMOTE)):
        for op, ov in lst:
            policy[f"{op}.{ov}" if ov else op] = name
    # an op CPU autocast has a kernel for and CUDA autocast has not falls through, as under
    # CUDA autocast: a composite op (cross_entropy_loss, conv2d.padding) then decomposes and
    # its parts meet the rules above; any other op runs in its inputs' dtype
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(full, "AutocastCPU"):
            policy.setdefault(full[len("aten::"):], "fallthrough")
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for qual, name in policy.items():
                op, _, ov = qual.partition(".")
                overload = _overload(op, ov)
                if overload is None:
                    continue
                kernel = torch.library.fallthrough_kernel if name == "fallthrough" else rules.kernel(overload, name)
                lib.impl(qual, kernel, "AutocastCPU")
        with torch.autocast("cpu", dtype=dtype):
            yield
    finally:
        rules.cache.clear()
        lib._destroy()
