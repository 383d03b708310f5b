"""Encoder-decoder Transformer (Vaswani et al. 2017, "Attention is all you need") in the size
used by Celeritas (Xu, Liao, Xie and Zhou, "Celeritas: Fast optimizer for large dataflow
graphs", Sec. 6.2.1: "a Transformer variant with 12 layers and 16 heads containing 2048
hidden units", batch 256).

Reading of the Celeritas sizes (the paper gives nothing more):

* "12 layers" is read as the total over both stacks, 6 encoder + 6 decoder layers. The
  sentence right before introduces the model as "consisting of an encoder and a decoder" and
  counts layers for the model as a whole; 6 + 6 is the N = 6 of every configuration in
  Vaswani et al.; and 12 + 12 layers at width 2048 (about 1.5B parameters, plus Adam state and
  batch-256 activations) could not have been trained on the paper's 4 x 32 GB V100s, whereas
  the 6 + 6 model (0.78B) is the "exceeds one GPU, fits four" case the paper targets.
* "2048 hidden units" is read as the model width d_model (as "2048 hidden units per LSTM" in
  the NMT sentence of the same paragraph is the state width, and as tensor2tensor's
  ``hidden_size``), so d_head = 2048 / 16 = 128; the feed-forward width keeps the paper's
  ratio d_ff = 4 * d_model = 8192.

Both stacks are constructor arguments (``num_encoder_layers``, ``num_decoder_layers``), as are
all widths, so the other reading is one override away. Other choices, from Vaswani et al.:
post-layer-norm residual sublayers, sinusoidal positions (computed from the sequence length
in forward, as tensor2tensor does, so there is no table size to configure), embeddings scaled
by sqrt(d_model), one embedding matrix shared by source, target and the pre-softmax projection
(``share_embeddings``), ReLU feed-forward. Vocabulary 37000 (the paper's shared EN-DE BPE
vocabulary) and lengths 256 (tensor2tensor's default ``max_length``) are guesses where
Celeritas says nothing; the conf file sets them.

Attention is written out (projections, matmul, scale, additive mask, softmax, matmul) so that
the captured graph has the same operators as the TensorFlow graphs of the papers. No padding
mask: the harness feeds dense synthetic batches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def sinusoidal_positions(
    length: int, d_model: int, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """(length, d_model) table with PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    position = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    index = torch.arange(0, d_model, 2, device=device, dtype=torch.float32)
    inv_freq = torch.exp(index * (-math.log(10000.0) / d_model))
    angle = position * inv_freq
    table = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).reshape(length, d_model)
    return table.to(dtype)


def causal_mask(length: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(length, length) additive mask: 0 on and below the diagonal, -inf above."""
    return torch.full((length, length), float("-inf"), device=device, dtype=dtype).triu(1)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``num_heads`` heads, written with explicit matmuls."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.num_heads, self.d_head).transpose(1, 2)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        batch, length, d_model = query.shape
        q = self._split(self.q_proj(query))
        k = self._split(self.k_proj(memory))
        v = self._split(self.v_proj(memory))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        if mask is not None:
            scores = scores + mask
        weights = self.dropout(torch.softmax(scores, dim=-1))
        context = torch.matmul(weights, v).transpose(1, 2).reshape(batch, length, d_model)
        return self.out_proj(context)


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(d_model, d_ff), ReLU, Linear(d_ff, d_model)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Self-attention and FFN sublayers, each x = LayerNorm(x + Dropout(sublayer(x)))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, x)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention and FFN sublayers (post-norm)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, x, mask)))
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory)))
        return self.norm3(x + self.dropout(self.ffn(x)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer; forward(src (B, S), tgt_in (B, T)) -> logits (B, T, vocab)."""

    def __init__(
        self,
        vocab_size: int = 37000,
        d_model: int = 2048,
        num_heads: int = 16,
        d_ff: int = 8192,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dropout: float = 0.0,
        share_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if d_model % 2 != 0:
            raise ValueError("sinusoidal positions need an even d_model")
        self.d_model = d_model
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = self.src_embed if share_embeddings else nn.Embedding(vocab_size, d_model)
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_decoder_layers)
        )
        self.generator = None if share_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        self.dropout = nn.Dropout(dropout)

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.d_model)
        positions = sinusoidal_positions(tokens.shape[1], self.d_model, x.device, x.dtype)
        return self.dropout(x + positions)

    def encode(self, src: Tensor) -> Tensor:
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x)
        return x

    def decode(self, tgt_in: Tensor, memory: Tensor) -> Tensor:
        x = self._embed(self.tgt_embed, tgt_in)
        mask = causal_mask(tgt_in.shape[1], x.device, x.dtype)
        for layer in self.decoder:
            x = layer(x, memory, mask)
        return x

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        x = self.decode(tgt_in, self.encode(src))
        if self.generator is None:
            return F.linear(x, self.tgt_embed.weight)
        return self.generator(x)


def transformer(
    vocab_size: int = 37000,
    d_model: int = 2048,
    num_heads: int = 16,
    d_ff: int = 8192,
    num_encoder_layers: int = 6,
    num_decoder_layers: int = 6,
    dropout: float = 0.0,
    share_embeddings: bool = True,
) -> nn.Module:
    """Encoder-decoder Transformer of Vaswani et al. 2017 ("Attention is all you need") at the
    Celeritas size (6 + 6 layers, 16 heads, d_model 2048; see the module docstring for how the
    paper's "12 layers ... 2048 hidden units" is read). The paper's dropout is 0.1; the default
    0.0 keeps training steps deterministic."""
    return Transformer(
        vocab_size=vocab_size,
        d_model=d_model,
        num_heads=num_heads,
        d_ff=d_ff,
        num_encoder_layers=num_encoder_layers,
        num_decoder_layers=num_decoder_layers,
        dropout=dropout,
        share_embeddings=share_embeddings,
    )
