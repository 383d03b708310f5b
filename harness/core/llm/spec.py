"""A decoder-only transformer by its shape (:class:`TransformerSpec`) and its parameter counts.

One block is pre-norm attention then an MLP (or a mixture of experts), each behind a residual:

* attention: Q (``heads x head_size``), K and V (``kv_heads x head_size``: grouped-query
  attention when ``kv_heads < heads``, multi-query at 1) projections from the hidden state,
  the output projection back to it; biases on all four with ``linear_bias`` (GPT-2/3, BLOOM),
  on Q, K, V only with ``qkv_bias`` (Qwen2);
* MLP: two matrices ``hidden x ffn_hidden`` (GeLU, squared ReLU), three with ``gated_mlp``
  (SwiGLU / GeGLU: gate, up, down); biases with ``linear_bias``;
* MoE (``experts > 0``, every block after the ``first_dense_layers``): a router
  ``hidden x experts`` (no bias), ``experts`` MLPs of ``expert_ffn_hidden`` each, of which each
  token goes through ``top_k``, plus ``shared_experts`` MLPs of the same size every token goes
  through (DeepSeekMoE, Dai et al. 2024);
* two norms per block (``rmsnorm``: a weight; ``layernorm``: a weight and a bias).

The embedding is ``vocab x hidden`` (plus ``seq_len x hidden`` learned positions, plus a norm
with ``embedding_norm``, BLOOM's); the head is the final norm and the output projection, which
``tied_embeddings`` shares with the embedding.  With these rules Megatron's GPT shapes give
Narayanan et al.'s count ``P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))`` (SC'21, Sec. 5.1)
plus the final norm, and BLOOM-176B its published 176,247,271,424 parameters exactly.

Two fields are not the shape but change the memory of a step: ``dropout`` (Megatron's GPT runs
drop out after attention and the MLP and on the attention probabilities: Korthikanti's byte
masks) and ``attention``: ``eager`` keeps the ``s x s`` attention scores for the backward
(Korthikanti Table 2's ``5 a s / h`` term), ``flash`` is a fused kernel that keeps only the
softmax statistics (FlashAttention, Dao et al. 2022), as Megatron-LM (``--use-flash-attn``,
Transformer Engine) and torchtitan (SDPA) run today.  ``kernels`` is how the memory-bound steps
run (:mod:`harness.core.llm.eager`): ``fused`` one kernel per norm, RoPE, activation and loss at
its fewest bytes (Megatron-LM's fused kernels), ``eager`` the ATen kernels PyTorch eager runs for
torchtitan's Llama code (FP32 RMSNorm and complex RoPE, SwiGLU's two kernels, the loss over an
FP32 copy of the logits), ``compiled`` that code with its blocks and its loss under
``torch.compile``, ``compiled_blocks`` with its blocks only (torchtitan of 2024: the loss eager).

Every size is checked when a spec is built: a mistake is a one-line
:class:`~harness.core.errors.ModelConfigError` naming the key as the user typed it
(``model.<key>`` unless the source passes its own names in ``keys``, as ``model=hf`` does).
"""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass
from typing import Any, Mapping

from harness.core.checks import boolean, non_negative_int, one_of, positive_int
from harness.core.errors import ModelConfigError

POSITIONS: tuple[str, ...] = ("rope", "learned", "alibi")
NORMS: tuple[str, ...] = ("rmsnorm", "layernorm")
#: the attention core: a fused kernel (FlashAttention-2; llm-foundry's Triton FlashAttention, priced
#: at its measured rate against FlashAttention-2 where it was measured) or PyTorch's eager ops
ATTENTIONS: tuple[str, ...] = ("flash", "flash_triton", "eager")
#: how the memory-bound steps run (:mod:`harness.core.llm.eager`): one fused kernel each, PyTorch eager's ATen kernels,
#: torchtitan's code under torch.compile (its blocks and its loss), or with only its blocks compiled (its loss eager)
KERNEL_STYLES: tuple[str, ...] = ("fused", "eager", "compiled", "compiled_blocks")
#: the sizes that must be integers >= 1, and those that may be 0 ("none" or "the default")
POSITIVE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab")
COUNT_FIELDS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "first_dense_layers", "head_dim")
FLAG_FIELDS = ("gated_mlp", "tied_embeddings", "linear_bias", "qkv_bias", "embedding_norm", "dropout")


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer by its shape (see the module docstring)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int                 # = heads for multi-head attention; fewer for GQA / MQA
    ffn_hidden: int               # the dense MLP's inner size
    gated_mlp: bool               # SwiGLU / GeGLU: three matrices instead of two
    seq_len: int
    vocab: int
    tied_embeddings: bool
    position: str = "rope"        # "rope" | "learned" (learned adds seq_len * hidden parameters) | "alibi"
    norm: str = "rmsnorm"         # "rmsnorm" | "layernorm" (layernorm has a bias)
    linear_bias: bool = False     # biases on the linear layers (GPT-2/3, BLOOM)
    experts: int = 0              # 0: dense
    top_k: int = 0
    expert_ffn_hidden: int = 0    # the inner size of one expert's MLP (defaults to ffn_hidden when experts > 0)
    shared_experts: int = 0       # experts every token goes through (DeepSeek)
    first_dense_layers: int = 0   # MoE models whose first layers are dense (DeepSeek)
    head_dim: int = 0             # 0: hidden // heads
    qkv_bias: bool = False        # biases on Q, K and V only (Qwen2); implied by linear_bias
    embedding_norm: bool = False  # a norm right after the token embedding (BLOOM)
    dropout: bool = False         # dropout after attention and MLP and on the attention probabilities
    attention: str = "flash"      # "flash" / "flash_triton" (fused, keep softmax statistics) | "eager" (keeps the s x s scores)
    kernels: str = "fused"        # "fused" | "eager" | "compiled" | "compiled_blocks": how the norms, RoPE, activations, loss run
    keys: InitVar[Mapping[str, str] | None] = None  # how the user spells each field (default model.<field>)

    def __post_init__(self, keys: Mapping[str, str] | None) -> None:
        def key(f: str) -> str:
            return (keys or {}).get(f, f"model.{f}")

        def put(f: str, value: Any) -> None:
            object.__setattr__(self, f, value)

        put("name", str(self.name))
        for f in POSITIVE_FIELDS:
            put(f, positive_int(getattr(self, f), key(f), ModelConfigError))
        for f in COUNT_FIELDS:
            put(f, non_negative_int(getattr(self, f), key(f), ModelConfigError))
        for f in FLAG_FIELDS:
            put(f, boolean(getattr(self, f), key(f), ModelConfigError))
        one_of(self.position, key("position"), POSITIONS, ModelConfigError)
        one_of(self.norm, key("norm"), NORMS, ModelConfigError)
        one_of(self.attention, key("attention"), ATTENTIONS, ModelConfigError)
        one_of(self.kernels, key("kernels"), KERNEL_STYLES, ModelConfigError)
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ModelConfigError(f"{key('heads')}={self.heads} is not a multiple of {key('kv_heads')}={self.kv_heads}: every "
                                   f"key/value head serves the same number of query heads; use {key('kv_heads')}="
                                   f"{_divisor_near(self.heads, self.kv_heads)}")
        if not self.head_dim and self.hidden % self.heads:
            raise ModelConfigError(f"{key('hidden')}={self.hidden} is not divisible by {key('heads')}={self.heads}: the heads split "
                                   f"the hidden size; use {key('heads')}={_divisor_near(self.hidden, self.heads)} or give "
                                   f"{key('head_dim')}")
        self._check_experts(key)

    def _check_experts(self, key: Any) -> None:
        """The MoE fields: all 0 for a dense model; ``1 <= top_k <= experts`` and at least one MoE layer otherwise."""
        if not self.experts:
            for f in ("top_k", "expert_ffn_hidden", "shared_experts", "first_dense_layers"):
                if getattr(self, f):
                    raise ModelConfigError(f"{key(f)}={getattr(self, f)} needs a mixture of experts: set {key('experts')} "
                                           f"(the routed experts per MoE layer) or {key(f)}=0")
            return
        if not 1 <= self.top_k <= self.experts:
            raise ModelConfigError(f"{key('top_k')}={self.top_k} must be in 1..{key('experts')}={self.experts} (the experts "
                                   f"each token is routed to); e.g. {key('top_k')}={min(2, self.experts)}")
        if self.first_dense_layers >= self.layers:
            raise ModelConfigError(f"{key('first_dense_layers')}={self.first_dense_layers} leaves no MoE layer of "
                                   f"{key('layers')}={self.layers}: use at most {self.layers - 1}, or {key('experts')}=0")
        if not self.expert_ffn_hidden:
            object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)

    # ------------------------------------------------------------------ derived sizes
    @property
    def fused_attention(self) -> bool:
        """Does one fused kernel run the attention core (any ``attention`` but ``eager``)?"""
        return self.attention != "eager"

    @property
    def head_size(self) -> int:
        """Channels per attention head: ``head_dim``, else ``hidden // heads``."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): ``heads x head_size``."""
        return self.heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): ``kv_heads x head_size``."""
        return self.kv_heads * self.head_size

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Blocks with a mixture of experts (all after the first dense ones)."""
        return self.layers - self.first_dense_layers if self.is_moe else 0

    @property
    def dense_layers(self) -> int:
        """Blocks with a dense MLP."""
        return self.layers - self.moe_layers

    @property
    def mlp_matrices(self) -> int:
        """Matrices of one MLP: 3 gated (gate, up, down), else 2."""
        return 3 if self.gated_mlp else 2

    def is_moe_layer(self, i: int) -> bool:
        """Is block ``i`` (0-based) a mixture of experts?"""
        return self.is_moe and i >= self.first_dense_layers

    # ------------------------------------------------------------------ parameters
    def norm_params(self) -> int:
        """One norm: a weight (RMSNorm) or a weight and a bias (LayerNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def attention_params(self) -> int:
        """Q, K, V and output projections with their biases."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        bias = (q + 2 * kv if self.linear_bias or self.qkv_bias else 0) + (h if self.linear_bias else 0)
        return h * (q + 2 * kv) + q * h + bias

    def mlp_params(self, ffn: int) -> int:
        """One MLP of inner size ``ffn`` (an expert's too) with its biases."""
        bias = (ffn * (self.mlp_matrices - 1) + self.hidden) if self.linear_bias else 0
        return self.mlp_matrices * self.hidden * ffn + bias

    def block_params(self, moe: bool) -> tuple[int, int]:
        """(non-expert parameters, expert parameters) of one block: a dense block has no expert
        parameters; a MoE block's router and shared experts are non-expert (every token uses
        them; expert parallelism does not shard them)."""
        base = self.attention_params() + 2 * self.norm_params()
        if not moe:
            return base + self.mlp_params(self.ffn_hidden), 0
        shared = self.shared_experts * self.mlp_params(self.expert_ffn_hidden)
        return base + self.hidden * self.experts + shared, self.experts * self.mlp_params(self.expert_ffn_hidden)

    def embedding_params(self) -> int:
        """Token embedding (+ learned positions, + the embedding norm)."""
        pos = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos + (self.norm_params() if self.embedding_norm else 0)

    def head_params(self) -> int:
        """Final norm + output projection (no projection of its own when tied to the embedding)."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def param_count(self) -> int:
        """All parameters."""
        dense, moe = sum(self.block_params(False)), sum(self.block_params(True)) if self.is_moe else 0
        return self.embedding_params() + self.dense_layers * dense + self.moe_layers * moe + self.head_params()

    def active_param_count(self) -> int:
        """Parameters one token goes through: a MoE block's ``top_k`` routed experts (and the shared ones), not all."""
        if not self.is_moe:
            return self.param_count()
        other, experts = self.block_params(True)
        moe = other + experts * self.top_k // self.experts
        return self.embedding_params() + self.dense_layers * sum(self.block_params(False)) + self.moe_layers * moe + self.head_params()

    def describe(self) -> dict[str, Any]:
        """The shape and its parameter counts, for result.json."""
        return {**asdict(self), "params": self.param_count(), "active_params": self.active_param_count()}


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` nearest ``k`` (the smaller of two equally near)."""
    divs = [d for d in range(1, n + 1) if n % d == 0] if n <= 10**6 else [1, n]
    return min(divs, key=lambda d: (abs(d - k), d))
