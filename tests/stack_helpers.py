"""Small stack graphs for the plan and stack-algorithm tests (shared helpers, not a test module)."""

from __future__ import annotations

from typing import Any, Sequence

from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import StackGraph, StackUnit, transformer_stack


def toy_spec(**kw: Any) -> TransformerSpec:
    """A small dense decoder (8 blocks, 16 heads, GQA with 8 KV heads) unless ``kw`` says otherwise."""
    shape: dict[str, Any] = dict(name="toy", layers=8, hidden=512, heads=16, kv_heads=8, ffn_hidden=2048, gated_mlp=True,
                                 seq_len=256, vocab=1000, tied_embeddings=False)
    shape.update(kw)
    return TransformerSpec(**shape)


def toy_stack(batch: int = 64, precision: str = "amp_bf16", **kw: Any) -> StackGraph:
    """The stack graph of :func:`toy_spec` (embedding, blocks, head) at global batch ``batch``."""
    return transformer_stack(toy_spec(**kw), batch, precision)


def chain_stack(weights: Sequence[float], batch: int = 32, name: str = "chain") -> StackGraph:
    """A chain of ``layer`` units (a CNN's stack graph without its layer graph) whose forward
    FLOPs are ``weights``: enough for plans, not for costing."""
    units = [StackUnit("layer", f"l{i}", 1000, 0, float(w), 1024.0) for i, w in enumerate(weights)]
    return StackGraph(name, units, batch, 1, "fp32", None)
