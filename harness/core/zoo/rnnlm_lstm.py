"""The RNNLM of PaSE's own search graph (Elango 2021; baidu-research/PaSE ``graph.py``): the two
LSTM layers are *one* operator (PaSE's ``LSTM`` op, iteration domain (layers, seq, batch, n,
k)) instead of the per-step cells of :mod:`harness.core.zoo.rnnlm`. Same sizes and parameter count
as that model (bias-free gates: ``nn.LSTM(bias=False)`` holds the same (4h, in) and (4h, h)
weights as one bias-free linear layer over [x, h]).

Not registered in ``conf/model``: use it through the rnnlm config,
``model=rnnlm model.module._target_=harness.core.zoo.rnnlm_lstm.rnnlm_lstm model.name=rnnlm_lstm``
(the PaSE experiments do). Its layer graph has an ``lstm`` node, which PaSE's cost model
costs as PaSE does; the unrolled model's layer graph has a tree width near 7 (two hubs, the
embedding and the output stack, plus four state tensors per step), which makes exact vertex
elimination impractical beyond a few devices.
"""

from __future__ import annotations

from torch import Tensor, nn


class RNNLMLSTM(nn.Module):
    """Embedding -> nn.LSTM (all layers, all steps) -> projection to the vocabulary."""

    def __init__(self, vocab_size: int = 50000, hidden_size: int = 2048, embed_dim: int = 2048,
                 num_layers: int = 2, bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=num_layers, bias=bias, batch_first=True)
        self.projection = nn.Linear(hidden_size, vocab_size, bias=bias)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.projection(out)


def rnnlm_lstm(vocab_size: int = 50000, hidden_size: int = 2048, embed_dim: int = 2048, num_layers: int = 2,
               bias: bool = False) -> nn.Module:
    """PaSE's RNNLM graph: 2 x 2048 LSTM as one operator, vocabulary 50000, bias-free."""
    return RNNLMLSTM(vocab_size, hidden_size, embed_dim, num_layers, bias)
