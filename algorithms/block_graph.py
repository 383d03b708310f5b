"""One transformer block as a layer graph, for the layer-graph searches (PaSE's DP, OptCNN's
elimination) to split over a tensor-parallel group, and Megatron's split of it.

:func:`block_layer_graph` writes the block of a :class:`~harness.core.llm.spec.TransformerSpec`
with :class:`~harness.core.layer_builder.LayerGraphBuilder`, one node per operator, as PaSE's
public code writes its Transformer (``graph.py``: attention as einsums whose every index is a dim
of the iteration domain, so that a head is a dim a configuration may split):

* ``attn_norm`` (the pre-norm) on ``x (b, l, e)``;
* ``qkv_proj`` ``ble,egjk->jbglk``: Q, K and V as one GEMM, as Megatron-LM fuses them
  (``linear_qkv``) and as its weight is laid out for grouped-query attention: ``g`` the
  key/value heads, ``j`` the ``r`` query heads of each then its key and its value (``r + 2``),
  ``k`` the head size; ``qkv_split`` (PaSE's Unstack along ``j``) and ``q_stack`` (the ``r``
  query slices stacked back, ``(b, g, r, l, k)``: one view when ``r`` is 1). One GEMM, not
  three, matters to the costs: each column-parallel GEMM all-reduces its input's gradient in
  both models, and Megatron-LM does that once for Q, K and V;
* the attention core ``attn_scores`` ``bgrlk,bgmk->bgrlm``, ``attn_softmax`` over the key
  positions ``m``, ``attn_context`` ``bgrlm,bgmk->bgrlk``;
* ``out_proj`` ``bgrlk,grke->ble`` and the residual ``attn_residual``;
* ``mlp_norm``; ``mlp_up`` (``ble,sef->sblf`` with the gate and up halves as ``s`` for a gated
  MLP, Megatron-LM's fused ``linear_fc1``; ``ble,ef->blf`` otherwise), ``gate_split``, the
  activation ``mlp_act`` (PaSE's ``pw``: one fused pointwise op), ``mlp_down`` ``blf,fe->ble``
  and ``mlp_residual``.

Letters name the dims (``b`` is ``sample``; :data:`DIM_MEANING`).  ``blocks`` blocks are chained
(default 3): the first block's input is the graph's input, which costs nothing and moves
nothing in either search, so the first block may take any split of its input for free, and
the last block's output feeds nothing, so its output may end in any split for free; the middle
block (:attr:`BlockGraph.middle`) reads a block's output and feeds a block, as every block of a
deep stack does: it is the steady state :mod:`algorithms.block_splits` reports.  A
mixture-of-experts block is its attention half only (experts are split by expert parallelism,
outside the TP group this graph is split over).  Not written: biases, dropout, rotary
embeddings (elementwise work that any split of the attention keeps local), the causal mask (the
core is counted whole, as Korthikanti counts it) and the fused attention kernel (its scores are
a tensor of the graph, whose moves a split of the sequence pays).

:func:`megatron_degrees` is Shoeybi et al.'s split of this graph over ``t`` GPUs (Megatron-LM,
2019, Sec. 3): the QKV projections column-parallel (split on their output channels: the heads),
the attention core split by heads, the output projection row-parallel (split on its input
channels, the heads: partial sums all-reduced), the MLP's first matrix column-parallel (on
``f``), its second row-parallel (on ``f``); no communication inside either pair.  The norms,
residuals and dropouts are replicated on every rank in Megatron-LM, which a layer graph cannot
express (a configuration's shards run on distinct devices): unsplit here (one device), or with
``sequence_parallel`` split along the sequence (Korthikanti et al., 2023: Megatron's SP).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.checks import positive_int
from harness.core.layer_builder import LayerGraphBuilder, Tensor, Weight
from harness.core.layergraph import LayerGraph
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import activation_dtype

#: what each dim of the block's layers is (the einsum letters, and the names the builder gives
#: the norms' and residuals' axes)
DIM_MEANING: dict[str, str] = {
    "sample": "batch", "l": "sequence", "length": "sequence", "m": "key positions", "e": "hidden",
    "channel": "hidden", "g": "KV heads", "r": "query heads per KV head", "k": "head channel",
    "f": "FFN", "j": "q/k/v", "s": "gate/up",
}

#: the role of each layer of a block (by its name without the block prefix)
ROLES: dict[str, str] = {
    "attn_norm": "norm", "qkv_proj": "column", "qkv_split": "attention", "q_stack": "attention",
    "attn_scores": "attention", "attn_softmax": "attention", "attn_context": "attention", "out_proj": "row",
    "attn_residual": "residual", "mlp_norm": "norm", "mlp_up": "column", "gate_split": "mlp", "mlp_act": "mlp",
    "mlp_down": "row", "mlp_residual": "residual",
}

#: Megatron's split of each layer: the dim it splits ``t`` ways (None: replicated, or SP's sequence split)
MEGATRON_DIM: dict[str, str | None] = {
    "qkv_proj": "g", "qkv_split": "g", "q_stack": "g", "attn_scores": "g", "attn_softmax": "g", "attn_context": "g",
    "out_proj": "g", "mlp_up": "f", "gate_split": "f", "mlp_act": "f", "mlp_down": "f",
    "attn_norm": None, "attn_residual": None, "mlp_norm": None, "mlp_residual": None,
}

#: the layers between a column-parallel and a row-parallel layer (both included): Megatron's
#: pairs, inside which its split communicates nothing
ATTENTION_PAIR = ("qkv_proj", "qkv_split", "q_stack", "attn_scores", "attn_softmax", "attn_context", "out_proj")
MLP_PAIR = ("mlp_up", "gate_split", "mlp_act", "mlp_down")


@dataclass(frozen=True)
class BlockGraph:
    """A block's layer graph with, per node, its block (-1: the input), its layer name without
    the block prefix (``qkv_proj``) and its role (:data:`ROLES`; ``input`` for the input)."""

    graph: LayerGraph
    block: tuple[int, ...]
    layer: tuple[str, ...]
    role: tuple[str, ...]
    blocks: int
    moe: bool

    @property
    def middle(self) -> int:
        """The block reported: ``blocks // 2`` (with 3 blocks, the one between two others)."""
        return self.blocks // 2

    def nodes_of(self, block: int) -> list[int]:
        """The nodes of block ``block`` (-1: the last), in order."""
        b = self.blocks - 1 if block < 0 else block
        return [v for v, x in enumerate(self.block) if x == b]


def _attention(bld: LayerGraphBuilder, x: Tensor, spec: TransformerSpec, tag: str) -> Tensor:
    """Pre-norm attention with its residual (see the module docstring); returns the residual's output."""
    h, g, d = spec.hidden, spec.kv_heads, spec.head_size
    r = spec.heads // spec.kv_heads
    n = bld.layernorm(x, name=f"{tag}attn_norm")
    qkv = bld.einsum("ble,egjk->jbglk", n, Weight((h, g, r + 2, d)), name=f"{tag}qkv_proj")
    *qs, key, value = bld.unstack(qkv, name=f"{tag}qkv_split")
    q = bld.stack(qs, axis=2, name=f"{tag}q_stack")
    scores = bld.einsum("bgrlk,bgmk->bgrlm", q, key, name=f"{tag}attn_scores")
    probs = bld.softmax(scores, axis=4, name=f"{tag}attn_softmax")
    ctx = bld.einsum("bgrlm,bgmk->bgrlk", probs, value, name=f"{tag}attn_context")
    out = bld.einsum("bgrlk,grke->ble", ctx, Weight((g, r, d, h)), name=f"{tag}out_proj")
    return bld.elementwise(x, out, name=f"{tag}attn_residual")


def _mlp(bld: LayerGraphBuilder, x: Tensor, spec: TransformerSpec, tag: str) -> Tensor:
    """Pre-norm MLP (gated: gate and up fused, as Megatron-LM's ``linear_fc1``) with its residual."""
    h, f = spec.hidden, spec.ffn_hidden
    n = bld.layernorm(x, name=f"{tag}mlp_norm")
    if spec.gated_mlp:
        up = bld.einsum("ble,sef->sblf", n, Weight((2, h, f)), name=f"{tag}mlp_up")
        gate, val = bld.unstack(up, name=f"{tag}gate_split")
        act = bld.elementwise(gate, val, pw=1, name=f"{tag}mlp_act")
    else:
        up = bld.einsum("ble,ef->blf", n, Weight((h, f)), name=f"{tag}mlp_up")
        act = bld.elementwise(up, pw=1, name=f"{tag}mlp_act")
    down = bld.einsum("blf,fe->ble", act, Weight((f, h)), name=f"{tag}mlp_down")
    return bld.elementwise(x, down, name=f"{tag}mlp_residual")


def block_layer_graph(spec: TransformerSpec, micro_batch: int, precision: str = "amp_bf16", blocks: int = 3,
                      seq_len: int | None = None) -> BlockGraph:
    """``blocks`` chained transformer blocks of ``spec`` on a micro-batch of ``micro_batch``
    sequences of ``seq_len`` tokens (None: the spec's), activations in ``precision``'s dtype
    (see the module docstring)."""
    s = int(seq_len or spec.seq_len)
    blocks = positive_int(blocks, "blocks")
    dtype = activation_dtype(precision)
    bld = LayerGraphBuilder(f"{spec.name}_block", int(micro_batch), dtype=dtype)
    x = bld.input("x", (int(micro_batch), s, spec.hidden), axes=("sample", "length", "channel"))
    for i in range(int(blocks)):
        x = _attention(bld, x, spec, f"b{i}.")
        if not spec.is_moe:
            x = _mlp(bld, x, spec, f"b{i}.")
    lg = bld.build(source="algorithms.block_graph", spec=spec.name, micro_batch=int(micro_batch), seq_len=s, blocks=int(blocks))
    block, layer, role = [], [], []
    for name in lg.names:
        head, _, tail = name.partition(".")
        if not tail:
            block.append(-1)
            layer.append(name)
            role.append("input")
        else:
            block.append(int(head[1:]))
            layer.append(tail)
            role.append(ROLES[tail])
    return BlockGraph(lg, tuple(block), tuple(layer), tuple(role), int(blocks), spec.is_moe)


def megatron_degrees(bg: BlockGraph, tp: int, sequence_parallel: bool = False) -> list[dict[str, int]]:
    """Megatron's split of every node of ``bg`` over ``tp`` GPUs (see the module docstring): a
    dict of degrees per node; norms and residuals ``{}`` (one device: the layer graph's nearest
    to Megatron's replicas) or, with ``sequence_parallel``, ``{"length": tp}``."""
    out: list[dict[str, int]] = []
    for v, name in enumerate(bg.layer):
        if bg.role[v] == "input" or tp == 1:
            out.append({})
            continue
        dim = MEGATRON_DIM[name]
        if dim is None:
            out.append({"length": tp} if sequence_parallel else {})
        else:
            out.append({dim: tp})
    return out
