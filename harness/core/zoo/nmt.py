"""GNMT-style sequence-to-sequence model with attention (Wu et al. 2016, "Google's neural
machine translation system: bridging the gap between human and machine translation"), in the
size used by Celeritas (Sec. 6.2.1: "a 4-layer model variant of NMT with 2048 hidden units per
LSTM", batch 512).

Structure, following GNMT and its TensorFlow ``nmt`` implementation (``gnmt_v2`` attention
architecture):

* Encoder: the bottom layer is bidirectional (a forward and a backward LSTM of ``hidden_size``
  units each, outputs concatenated), the remaining ``num_layers - 1`` layers are
  unidirectional; residual connections on the top ``num_residual_layers`` layers (default
  ``num_layers - 2``, i.e. "starting from the third layer" as in the paper).
* Attention: additive (Bahdanau) attention, score = v^T tanh(W_q q + W_k m), softmax over the
  source positions, context = weights @ memory, written out with explicit ops.
* Decoder: ``num_layers`` unidirectional layers. The bottom layer reads [embedding, previous
  attention context]; its output is the attention query; every upper layer reads [output of
  the layer below, new context]; residual connections on the top ``num_residual_layers``
  layers. The bottom decoder layer starts from zeros, decoder layer l >= 1 starts from the
  final state of encoder layer l (the backward direction for the bidirectional layer), as the
  ``nmt`` GNMT bridge does. The top layer feeds a linear projection to the vocabulary.

The LSTM cell is written with one ``nn.Linear`` over [x, h] and a Python loop over time steps
(no ``nn.LSTM``), so the captured graph has per-step operators, like the unrolled TensorFlow
graph. Vocabulary 32000 is GNMT's shared wordpiece vocabulary; sequence length 40 is what
Baechi (the placement baseline Celeritas compares against) uses for GNMT. Both are guesses
where Celeritas says nothing; the conf file sets them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LSTMCell(nn.Module):
    """LSTM cell as in TensorFlow's BasicLSTMCell: gates = Linear([x, h]) split into
    (i, g, f, o); c' = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(g); h' = sigmoid(o) *
    tanh(c')."""

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, forget_bias: float = 0.0
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.forget_bias = forget_bias
        self.gates = nn.Linear(input_size + hidden_size, 4 * hidden_size, bias=bias)

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        i, g, f, o = self.gates(torch.cat([x, h], dim=1)).chunk(4, dim=1)
        if self.forget_bias != 0.0:
            f = f + self.forget_bias
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c


def zero_state(x: Tensor, hidden_size: int) -> tuple[Tensor, Tensor]:
    """Zero (h, c) with the batch size, dtype and device of the float tensor ``x`` (B, ...)."""
    zeros = x.new_zeros(x.shape[0], hidden_size)
    return zeros, zeros


class BahdanauAttention(nn.Module):
    """Additive attention over a fixed memory (B, S, H): returns the context (B, H)."""

    def __init__(self, query_size: int, memory_size: int, attention_size: int) -> None:
        super().__init__()
        self.query_layer = nn.Linear(query_size, attention_size, bias=False)
        self.memory_layer = nn.Linear(memory_size, attention_size, bias=False)
        self.v = nn.Linear(attention_size, 1, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        return self.memory_layer(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor) -> Tensor:
        scores = self.v(torch.tanh(keys + self.query_layer(query).unsqueeze(1))).squeeze(2)
        weights = torch.softmax(scores, dim=1)
        return torch.matmul(weights.unsqueeze(1), memory).squeeze(1)


class GNMT(nn.Module):
    """GNMT-style encoder-decoder; forward(src (B, S), tgt_in (B, T)) -> logits (B, T, vocab)."""

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 2048,
        embed_dim: int = 2048,
        num_layers: int = 4,
        num_residual_layers: int | None = None,
        forget_bias: float = 1.0,
    ) -> None:
        super().__init__()
        if num_layers < 2:
            raise ValueError("GNMT needs at least 2 layers (bidirectional bottom + 1)")
        residual = num_layers - 2 if num_residual_layers is None else num_residual_layers
        if not 0 <= residual <= num_layers - 2:
            raise ValueError(f"num_residual_layers must be in [0, {num_layers - 2}]")
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.first_residual = num_layers - residual
        h = hidden_size
        self.src_embed = nn.Embedding(vocab_size, embed_dim)
        self.tgt_embed = nn.Embedding(vocab_size, embed_dim)
        self.enc_fw = LSTMCell(embed_dim, h, forget_bias=forget_bias)
        self.enc_bw = LSTMCell(embed_dim, h, forget_bias=forget_bias)
        self.enc_layers = nn.ModuleList(
            LSTMCell(2 * h if layer == 1 else h, h, forget_bias=forget_bias)
            for layer in range(1, num_layers)
        )
        self.attention = BahdanauAttention(h, h, h)
        self.dec_layers = nn.ModuleList(
            LSTMCell((embed_dim if layer == 0 else h) + h, h, forget_bias=forget_bias)
            for layer in range(num_layers)
        )
        self.projection = nn.Linear(h, vocab_size, bias=False)

    def encode(self, src: Tensor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Returns the memory (B, S, H) and the final (h, c) of each encoder layer."""
        embedded = self.src_embed(src)
        xs = embedded.unbind(1)
        steps = len(xs)
        h, c = zero_state(embedded, self.hidden_size)
        forward_out: list[Tensor] = []
        for t in range(steps):
            h, c = self.enc_fw(xs[t], h, c)
            forward_out.append(h)
        h, c = zero_state(embedded, self.hidden_size)
        backward_out: list[Tensor] = [h] * steps
        for t in reversed(range(steps)):
            h, c = self.enc_bw(xs[t], h, c)
            backward_out[t] = h
        final_states = [(h, c)]
        layer_in = [torch.cat([f, b], dim=1) for f, b in zip(forward_out, backward_out)]

        states = [zero_state(embedded, self.hidden_size) for _ in self.enc_layers]
        outputs: list[Tensor] = []
        for t in range(steps):
            x = layer_in[t]
            for index, cell in enumerate(self.enc_layers):
                h, c = cell(x, *states[index])
                states[index] = (h, c)
                x = h + x if index + 1 >= self.first_residual else h
            outputs.append(x)
        final_states.extend(states)
        return torch.stack(outputs, dim=1), final_states

    def decode(
        self, tgt_in: Tensor, memory: Tensor, encoder_states: list[tuple[Tensor, Tensor]]
    ) -> Tensor:
        """Runs the decoder over ``tgt_in`` (teacher forcing); returns top outputs (B, T, H)."""
        embedded = self.tgt_embed(tgt_in)
        keys = self.attention.keys(memory)
        states = [zero_state(embedded, self.hidden_size)] + encoder_states[1:]
        context = memory.new_zeros(memory.shape[0], self.hidden_size)
        outputs: list[Tensor] = []
        for y in embedded.unbind(1):
            h, c = self.dec_layers[0](torch.cat([y, context], dim=1), *states[0])
            states[0] = (h, c)
            context = self.attention(h, keys, memory)
            x = h
            for index in range(1, self.num_layers):
                h, c = self.dec_layers[index](torch.cat([x, context], dim=1), *states[index])
                states[index] = (h, c)
                x = h + x if index >= self.first_residual else h
            outputs.append(x)
        return torch.stack(outputs, dim=1)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, encoder_states = self.encode(src)
        return self.projection(self.decode(tgt_in, memory, encoder_states))


def nmt(
    vocab_size: int = 32000,
    hidden_size: int = 2048,
    embed_dim: int = 2048,
    num_layers: int = 4,
    num_residual_layers: int | None = None,
    forget_bias: float = 1.0,
) -> nn.Module:
    """GNMT-style seq2seq of Wu et al. 2016 ("Google's neural machine translation system") in
    the Celeritas size: 4 LSTM layers of 2048 units in encoder and decoder, additive
    attention, explicit per-step LSTM cells."""
    return GNMT(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        embed_dim=embed_dim,
        num_layers=num_layers,
        num_residual_layers=num_residual_layers,
        forget_bias=forget_bias,
    )
