"""Which handler reads an fx call: a key per leaf module type or function / method name, and the
dispatch from that key to the handler that turns the call into a :class:`NodeSpec`."""

from __future__ import annotations

from typing import Any

from harness.core.layerfx.common import CallContext, NodeSpec
from harness.core.layerfx.elementwise import elementwise_spec
from harness.core.layerfx.layers import conv_spec, embedding_spec, linear_spec, matmul_spec, pool_spec, rnn_spec
from harness.core.layerfx.norms import batchnorm_spec, layernorm_spec, norm_spec, reduce_spec, softmax_spec
from harness.core.layerfx.views import cast_spec, concat_spec, expand_spec, index_spec, pad_spec, permute_spec, reshape_spec


_ELEMENTWISE = frozenset(
    """add sub mul div truediv floordiv mod neg pos abs pow rsub true_divide floor_divide remainder fmod
    iadd isub imul itruediv idiv and_ or_ xor invert not_ eq ne lt le gt ge logical_and logical_or logical_not
    logical_xor bitwise_and bitwise_or bitwise_not
    relu relu6 gelu silu sigmoid tanh hardtanh hardswish hardsigmoid elu selu celu leaky_relu softplus softsign
    mish prelu rrelu threshold logsigmoid tanhshrink softshrink hardshrink
    exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan erf erfc erfinv sign square
    clamp clip clamp_min clamp_max floor ceil round trunc frac nan_to_num lerp addcmul addcdiv
    where masked_fill maximum minimum fmax fmin isnan isinf isfinite
    dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout""".split()
)
_CASTS = frozenset("to type type_as float double half bfloat16 int long bool short byte char cpu cuda".split())
_CONST_LIKE = frozenset(
    """new_zeros new_ones new_full new_empty new_tensor zeros_like ones_like empty_like full_like rand_like
    randn_like randint_like""".split()
)
_RESHAPES = frozenset("view reshape flatten unflatten squeeze unsqueeze view_as reshape_as".split())
#: ops that return their input unchanged (same values, same shape): not nodes, consumers read the input
_ALIASES = frozenset("contiguous clone detach data requires_grad_ detach_".split())
_PERMUTES = frozenset("permute transpose t swapaxes swapdims movedim moveaxis".split())
_EXPANDS = frozenset(("expand", "expand_as", "broadcast_to"))
_PIECES = frozenset(("chunk", "split", "unbind", "tensor_split", "split_with_sizes"))
_REDUCTIONS = frozenset(
    """sum mean amax amin max min std var prod norm logsumexp all any argmax argmin count_nonzero nansum
    nanmean median""".split()
)
_MATMULS = frozenset(("matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot"))
_CONVS = {"conv1d": 1, "conv2d": 2, "conv3d": 3}
_POOLS = {
    f"{p}_pool{d}d": (p, d)
    for p in ("max", "avg", "adaptive_avg", "adaptive_max", "lp")
    for d in (1, 2, 3)
}


def op_name(node: Any) -> str:
    """The function / method / module target name of an fx call (``getattr`` calls: the attribute)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        if node.target is getattr:
            return str(node.args[1])
        return getattr(node.target, "__name__", str(node.target)).lstrip("_")
    return str(node.target)


def module_handler(m: Any) -> tuple[str, Any]:
    """(handler key, extra) for a leaf module."""
    from torch import nn

    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv", len(m.kernel_size)
    if isinstance(m, nn.Linear):
        return "linear", None
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "batchnorm", None
    if isinstance(m, nn.LayerNorm):
        return "layernorm", None
    if isinstance(m, (nn.GroupNorm, nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)) or type(m).__name__ == "RMSNorm":
        return "norm", None
    for cls, mode in ((nn.modules.pooling._MaxPoolNd, "max"), (nn.modules.pooling._AvgPoolNd, "avg"),
                      (nn.modules.pooling._AdaptiveAvgPoolNd, "adaptive_avg"),
                      (nn.modules.pooling._AdaptiveMaxPoolNd, "adaptive_max"), (nn.modules.pooling._LPPoolNd, "lp")):
        if isinstance(m, cls):
            return "pool", (mode, int(type(m).__name__[-2]))
    if isinstance(m, (nn.Softmax, nn.LogSoftmax, nn.Softmin)):
        return "softmax", None
    if isinstance(m, nn.Embedding):
        return "embedding", None
    if isinstance(m, nn.Identity) or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0):
        return "alias", None
    if isinstance(m, (nn.Flatten, nn.Unflatten)):
        return "reshape", None
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return "elementwise", None
    if isinstance(m, nn.RNNBase):
        return "rnn", None
    if isinstance(m, (nn.modules.padding._ConstantPadNd, nn.modules.padding._ReflectionPadNd,
                      nn.modules.padding._ReplicationPadNd)) or type(m).__name__.startswith(("ZeroPad", "CircularPad")):
        return "pad", None
    if isinstance(m, nn.modules.loss._Loss):
        return "loss", None
    if type(m).__module__ == "torch.nn.modules.activation" and not isinstance(m, (nn.MultiheadAttention, nn.GLU)):
        return "elementwise", None
    return "other", None


def fn_handler(name: str, n_tensors: int) -> tuple[str, Any]:
    """(handler key, extra) for a function or method call named ``name`` with ``n_tensors`` tensor arguments."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    base = base.strip("_") if base.startswith("__") else base
    if base in _CONVS:
        return "conv", _CONVS[base]
    if base == "linear":
        return "linear", None
    if base in _MATMULS:
        return "matmul", None
    if base in _POOLS:
        return "pool", _POOLS[base]
    if base == "batch_norm":
        return "batchnorm", None
    if base == "layer_norm":
        return "layernorm", None
    if base in ("group_norm", "instance_norm", "local_response_norm", "rms_norm", "normalize"):
        return "norm", None
    if base in ("softmax", "log_softmax", "softmin"):
        return "softmax", None
    if base == "embedding":
        return "embedding", None
    if base in ("cat", "concat", "concatenate", "stack"):
        return "concat", None
    if base in _RESHAPES:
        return "reshape", None
    if base in _ALIASES:
        return "alias", None
    if base in _PERMUTES or base in ("T", "mT"):
        return "permute", None
    if base in _EXPANDS:
        return "expand", None
    if base in ("getitem", "narrow", "select"):
        return "index", None
    if base in _PIECES:
        return "pieces", None
    if base == "pad":
        return "pad", None
    if base in _CASTS:
        return "cast", None
    if base in _CONST_LIKE:
        return "const", None
    if base in ("max", "min") and n_tensors >= 2:
        return "elementwise", None
    if base in _REDUCTIONS:
        return "reduce", None
    if base in _ELEMENTWISE:
        return "elementwise", None
    return "other", None


def dispatch(ctx: CallContext, key: str, extra: Any) -> NodeSpec | None:
    """The :class:`NodeSpec` of a call from the handler ``key`` names, or None (the builder then makes an ``other`` node)."""
    if ctx.out is None:
        return None
    if key == "conv":
        return conv_spec(ctx, extra)
    if key == "linear":
        return linear_spec(ctx)
    if key == "matmul":
        return matmul_spec(ctx)
    if key == "pool":
        return pool_spec(ctx, *extra)
    if key == "batchnorm":
        return batchnorm_spec(ctx)
    if key == "layernorm":
        return layernorm_spec(ctx)
    if key == "norm":
        return norm_spec(ctx)
    if key == "softmax":
        return softmax_spec(ctx)
    if key == "embedding":
        return embedding_spec(ctx)
    if key == "concat":
        return concat_spec(ctx)
    if key in ("reshape", "alias"):
        return reshape_spec(ctx)
    if key == "permute":
        return permute_spec(ctx)
    if key == "expand":
        return expand_spec(ctx)
    if key == "index":
        return index_spec(ctx)
    if key == "pad":
        return pad_spec(ctx)
    if key == "cast":
        return cast_spec(ctx)
    if key == "reduce":
        return reduce_spec(ctx)
    if key == "elementwise":
        return elementwise_spec(ctx)
    if key == "rnn":
        return rnn_spec(ctx)
    return None
