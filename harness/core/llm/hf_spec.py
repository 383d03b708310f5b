"""Hugging Face decoder configs onto a :class:`~harness.core.llm.spec.TransformerSpec`, so that
``model=hf model.arch=llama +model.config.num_hidden_layers=32 algo=megatron`` plans the same
description as ``model=llm`` (:meth:`harness.core.hf.HFModel.stack_graph`).

The config is read by its attributes (an architecture's own spellings go through its
``attribute_map``: GPT-2's ``n_layer`` is ``num_hidden_layers``), nothing is built or downloaded:

==================  =====================================================================
spec field          config attribute
==================  =====================================================================
layers              ``num_hidden_layers`` (GPT-2: ``n_layer``)
hidden              ``hidden_size`` (``n_embd``)
heads               ``num_attention_heads`` (``n_head``)
kv_heads            ``num_key_value_heads`` (absent or null: the heads)
ffn_hidden          ``intermediate_size`` (GPT-2: ``n_inner``, null meaning 4 x hidden); Mixtral's is one expert's
head_dim            ``head_dim`` where it differs from hidden / heads
vocab               ``vocab_size``
tied_embeddings     ``tie_word_embeddings``
experts, top_k      Mixtral's ``num_local_experts``, ``num_experts_per_tok``
seq_len             the source's ``model.seq_len`` (null: ``max_position_embeddings``)
==================  =====================================================================

Per architecture: Llama, Mistral, Qwen2 and Mixtral are RoPE, RMSNorm, SwiGLU (gated);
Qwen2 has biases on Q, K and V (so has a config with ``attention_bias``, whose output-projection
bias, ``hidden`` parameters a block, is left out); GPT-2
is learned positions, LayerNorm, GeLU, biases everywhere, tied embeddings.  ``attention`` is
``eager`` when the config asks for eager attention (``attn_implementation``), else ``flash``
(SDPA and FlashAttention keep only the softmax statistics); ``dropout`` when any of the config's
dropout probabilities is above 0.  Mistral's sliding window is not modelled (full attention).
"""

from __future__ import annotations

from typing import Any

from harness.core.errors import ModelConfigError
from harness.core.llm.spec import TransformerSpec

#: the architectures (transformers model types) a stack graph is made for
SUPPORTED: tuple[str, ...] = ("llama", "mistral", "qwen2", "gpt2", "mixtral")
#: the config attributes of dropout probabilities, across the supported architectures
DROPOUT_KEYS: tuple[str, ...] = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")
#: the user's spelling of each spec field (``model.config.<attribute>``), for the spec's checks
KEYS: dict[str, str] = {
    "layers": "model.config.num_hidden_layers", "hidden": "model.config.hidden_size", "heads": "model.config.num_attention_heads",
    "kv_heads": "model.config.num_key_value_heads", "ffn_hidden": "model.config.intermediate_size", "vocab": "model.config.vocab_size",
    "head_dim": "model.config.head_dim", "experts": "model.config.num_local_experts", "top_k": "model.config.num_experts_per_tok",
    "seq_len": "model.seq_len",
}


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = getattr(config, key, default)
    return default if value is None else value


def spec_from_hf(arch: str, config: Any, seq_len: int, name: str | None = None) -> TransformerSpec:
    """The :class:`TransformerSpec` of a transformers config of a supported architecture (see
    the module docstring); another architecture is one line naming those supported."""
    if arch not in SUPPORTED:
        raise ModelConfigError(f"model.arch={arch}: a stack graph (algo=megatron, fsdp) is made for the decoder LMs "
                               f"{', '.join(SUPPORTED)}; plan {arch} with an operator- or layer-graph algorithm, or describe "
                               "it by its shape with model=llm")
    hidden = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads")
    gpt2 = arch == "gpt2"
    ffn = _get(config, "n_inner" if gpt2 else "intermediate_size")
    if ffn is None and gpt2 and isinstance(hidden, int):
        ffn = 4 * hidden
    head_dim = _get(config, "head_dim", 0)
    if isinstance(hidden, int) and isinstance(heads, int) and heads and head_dim == hidden // heads:
        head_dim = 0
    dropout = any(isinstance(_get(config, k, 0.0), (int, float)) and _get(config, k, 0.0) > 0 for k in DROPOUT_KEYS)
    eager = str(getattr(config, "_attn_implementation", None) or "") == "eager"
    moe = {}
    if arch == "mixtral":
        moe = {"experts": _get(config, "num_local_experts", 0), "top_k": _get(config, "num_experts_per_tok", 0)}
    return TransformerSpec(
        name=name or arch, layers=_get(config, "num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=_get(config, "num_key_value_heads", heads), ffn_hidden=ffn, gated_mlp=not gpt2, seq_len=seq_len,
        vocab=_get(config, "vocab_size"), tied_embeddings=bool(_get(config, "tie_word_embeddings", gpt2)),
        position="learned" if gpt2 else "rope", norm="layernorm" if gpt2 else "rmsnorm",
        linear_bias=gpt2, qkv_bias=arch == "qwen2" or bool(_get(config, "attention_bias", False)), head_dim=head_dim, dropout=dropout, attention="eager" if eager else "flash",
        keys=KEYS, **moe)
