"""The decoder a GPU probe times (:mod:`harness.app.block_probe`): plain PyTorch eager, written
for this project from the architectures' papers, so that it runs wherever ``torch`` does.

Two families, the two of the published H100 rows (``harness/data/llm``):

* ``llama`` (Llama 3, as torchtitan trains it in eager mode): RMSNorm computed in FP32 and cast
  back before the weight, separate Q / K / V projections without bias, rotary embeddings applied
  as a complex product in FP32, grouped-query attention with K and V repeated to every query head
  before ``scaled_dot_product_attention`` (causal), the output projection, and the SwiGLU MLP
  ``w2(silu(w1 x) * w3 x)``;
* ``gpt`` (MPT as the harness simulates it: learned positions, ``nn.LayerNorm``, biased linear
  layers, GeLU MLP, multi-head attention).

The loss is ``cross_entropy`` over an FP32 copy of the logits.  Weights are created in the
compute dtype (FSDP's ``param_dtype``): the probe times the kernels of the step, not its
master-weight bookkeeping, which :func:`harness.app.probe_kernels.time_optimizer` times apart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ProbeShape:
    """One decoder configuration: the model's shape and one micro-batch (``batch`` sequences of
    ``seq`` tokens) through ``layers`` blocks."""

    name: str
    family: str  # llama | gpt
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int
    layers: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def row(self) -> dict[str, Any]:
        return asdict(self)


#: the configurations of the published H100 rows the probe checks the simulator on:
#: torchtitan's Llama 3.1 8B (micro-batch 2 of 8192 tokens) and Mosaic's MPT-7B (6 of 2048)
SHAPES: dict[str, ProbeShape] = {
    "llama3_8b": ProbeShape("llama3_8b", "llama", 4096, 32, 8, 14336, 128256, 8192, 2, 4),
    "mpt_7b": ProbeShape("mpt_7b", "gpt", 4096, 32, 32, 16384, 50368, 2048, 6, 4),
    # the other H100 rows' blocks at their micro-batches (Mosaic's MPT-13B, -30B, -70B), and
    # Llama 3 8B at one sequence: the efficiency's dependence on size
    "llama3_8b_mb1": ProbeShape("llama3_8b_mb1", "llama", 4096, 32, 8, 14336, 128256, 8192, 1, 4),
    "mpt_13b": ProbeShape("mpt_13b", "gpt", 5120, 40, 40, 20480, 50368, 2048, 2, 4),
    "mpt_30b": ProbeShape("mpt_30b", "gpt", 7168, 56, 56, 28672, 50368, 2048, 14, 2),
    "mpt_70b": ProbeShape("mpt_70b", "gpt", 8192, 64, 64, 32768, 50368, 2048, 8, 2),
    # torchtitan's long-context rows (one sequence of 32,768 tokens): attention-heavy blocks
    "llama3_8b_32k": ProbeShape("llama3_8b_32k", "llama", 4096, 32, 8, 14336, 128256, 32768, 1, 2),
}

#: the same families at a size a CPU runs in a second (tests, ``--tiny``)
TINY: dict[str, ProbeShape] = {
    "llama_tiny": ProbeShape("llama_tiny", "llama", 64, 4, 2, 160, 96, 32, 2, 2),
    "gpt_tiny": ProbeShape("gpt_tiny", "gpt", 64, 4, 4, 256, 96, 32, 2, 2),
}


class RMSNorm(nn.Module):
    """RMSNorm with the statistics in FP32 and the weight applied after the cast back."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_table(seq: int, head_dim: int, device: Any, theta: float = 500000.0) -> torch.Tensor:
    """The complex rotations ``exp(i t / theta^(2k/d))`` per position ``t`` and pair ``k``."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return torch.polar(torch.ones_like(ang), ang)


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (batch, seq, heads, head_dim) as a complex product in FP32."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * table[None, :, None, :]).flatten(3).type_as(x)


class Block(nn.Module):
    """One pre-norm decoder block of ``shape.family``."""

    def __init__(self, s: ProbeShape) -> None:
        super().__init__()
        self.s = s
        llama = s.family == "llama"
        bias = not llama
        kv = s.kv_heads * s.head_dim
        self.norm1 = RMSNorm(s.hidden) if llama else nn.LayerNorm(s.hidden)
        self.norm2 = RMSNorm(s.hidden) if llama else nn.LayerNorm(s.hidden)
        self.wq = nn.Linear(s.hidden, s.hidden, bias=bias)
        self.wk = nn.Linear(s.hidden, kv, bias=bias)
        self.wv = nn.Linear(s.hidden, kv, bias=bias)
        self.wo = nn.Linear(s.hidden, s.hidden, bias=bias)
        self.w1 = nn.Linear(s.hidden, s.ffn, bias=bias)
        self.w2 = nn.Linear(s.ffn, s.hidden, bias=bias)
        self.w3 = nn.Linear(s.hidden, s.ffn, bias=False) if llama else None

    def attention(self, x: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
        s = self.s
        b, n, _ = x.shape
        q = self.wq(x).view(b, n, s.heads, s.head_dim)
        k = self.wk(x).view(b, n, s.kv_heads, s.head_dim)
        v = self.wv(x).view(b, n, s.kv_heads, s.head_dim)
        if table is not None:
            q, k = rotate(q, table), rotate(k, table)
        rep = s.heads // s.kv_heads
        if rep > 1:  # grouped-query attention: every query head gets its own copy of K and V
            k = k[:, :, :, None, :].expand(b, n, s.kv_heads, rep, s.head_dim).reshape(b, n, s.heads, s.head_dim)
            v = v[:, :, :, None, :].expand(b, n, s.kv_heads, rep, s.head_dim).reshape(b, n, s.heads, s.head_dim)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, n, s.hidden))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))

    def forward(self, x: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.norm1(x), table)
        return h + self.mlp(self.norm2(h))


class Stack(nn.Module):
    """``shape.layers`` blocks (the unit the probe times per block)."""

    def __init__(self, s: ProbeShape) -> None:
        super().__init__()
        self.s = s
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))

    def forward(self, x: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, table)
        return x


class Head(nn.Module):
    """The final norm, the logits GEMM and the loss over an FP32 copy of the logits."""

    def __init__(self, s: ProbeShape) -> None:
        super().__init__()
        self.norm = RMSNorm(s.hidden) if s.family == "llama" else nn.LayerNorm(s.hidden)
        self.out = nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


class Embed(nn.Module):
    """Token embedding (+ learned positions for ``gpt``)."""

    def __init__(self, s: ProbeShape) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.hidden)
        self.pos = nn.Embedding(s.seq, s.hidden) if s.family == "gpt" else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
        return x


def init_(module: nn.Module, seed: int) -> nn.Module:
    """Seeded normal weights of standard deviation ``1/sqrt(fan_in)`` (norm weights stay 1),
    so that activations keep unit scale through the blocks."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            g = torch.Generator(device=p.device).manual_seed(seed)
            seed += 1
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) / math.sqrt(p.shape[-1]))
            elif name.endswith("bias"):
                p.zero_()
    return module
