"""LSTM language model as benchmarked by PaSE (Elango 2021, "PaSE: Parallelization strategies
for efficient DNN training", IPDPS).

Sizes from the public PaSE code (github.com/baidu-research/PaSE): ``graph.py`` builds RNNLM
with 2 layers, 2048 units, vocabulary 50000 and sequence length 64, and the Mesh-TensorFlow
benchmark (``benchmarks/rnnlm.py``, ``rnnlm_data.py``) uses the same 2 x 2048 LSTM: embedding
(vocab x 2048), two LSTM layers whose gates are one bias-free matmul of [x, h] with a
(2*2048, 4*2048) weight, and a bias-free dense projection to the vocabulary. That benchmark
reads its sequence length from the command line (default 256); the 64 of ``graph.py`` is the
default here and in the conf file.

The LSTM cell is the explicit one of ``harness.core.zoo.nmt`` (one ``nn.Linear`` over [x, h], Python
loop over time steps, stacked layers advanced step by step like a Keras ``RNN`` over stacked
cells), so the captured graph has per-step operators.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.core.zoo.nmt import LSTMCell, zero_state


class RNNLM(nn.Module):
    """Stacked-LSTM language model; forward(tokens (B, T)) -> logits (B, T, vocab)."""

    def __init__(
        self,
        vocab_size: int = 50000,
        hidden_size: int = 2048,
        embed_dim: int = 2048,
        num_layers: int = 2,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.layers = nn.ModuleList(
            LSTMCell(embed_dim if layer == 0 else hidden_size, hidden_size, bias=bias)
            for layer in range(num_layers)
        )
        self.projection = nn.Linear(hidden_size, vocab_size, bias=bias)

    def forward(self, tokens: Tensor) -> Tensor:
        embedded = self.embed(tokens)
        states = [zero_state(embedded, self.hidden_size) for _ in self.layers]
        outputs: list[Tensor] = []
        for x in embedded.unbind(1):
            for index, cell in enumerate(self.layers):
                h, c = cell(x, *states[index])
                states[index] = (h, c)
                x = h
            outputs.append(x)
        return self.projection(torch.stack(outputs, dim=1))


def rnnlm(
    vocab_size: int = 50000,
    hidden_size: int = 2048,
    embed_dim: int = 2048,
    num_layers: int = 2,
    bias: bool = False,
) -> nn.Module:
    """RNN (LSTM) language model benchmarked by PaSE (Elango 2021, "PaSE: Parallelization
    strategies for efficient DNN training"): 2 LSTM layers of 2048 units, vocabulary 50000,
    bias-free gates and projection as in the PaSE code."""
    return RNNLM(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        embed_dim=embed_dim,
        num_layers=num_layers,
        bias=bias,
    )
