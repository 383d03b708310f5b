"""What the layer graph's tracer (harness/core/layerfx/tracer.py) makes of Python that plain
``torch.fx`` refuses: an item assignment (``x[:, 1:] = y``, transformers' ``shift_tokens_right``)
and a module the model calls without holding it (a module-level activation, RoBERTa's ``gelu``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from harness.core.layerfx import build_layer_graph
from harness.core.layergraph import LayerGraph, LayerGraphError

#: a module the models below call but do not hold
ACT = nn.GELU()
#: one with a parameter of its own
STRAY = nn.Linear(8, 8)


class Shifted(nn.Module):
    """Token ids shifted right by one with an item assignment, embedded, a global GELU, a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1]
        return self.fc(ACT(self.emb(shifted)))


class Stray(nn.Module):
    """Calls a module with parameters that it does not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return STRAY(self.fc(x))


def reaches(lg: LayerGraph, src: int, dst: int) -> bool:
    """Whether a path of edges leads from node ``src`` to node ``dst``."""
    seen, todo = {src}, [src]
    while todo:
        v = todo.pop()
        for w in lg.dst[lg.src == v].tolist():
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return dst in seen


def test_an_item_assignment_is_a_node_its_later_readers_depend_on() -> None:
    lg = build_layer_graph(Shifted(), [((2, 5), "int64")], name="shifted")
    names = list(lg.names)
    assert names.count("assign") == 1 and lg.kinds[names.index("assign")] == "other"
    emb = names.index("emb")
    # the embedding reads the assigned tensor, which the input feeds: the input reaches every layer
    assert reaches(lg, names.index("ids"), emb) and reaches(lg, names.index("assign"), emb)
    has_in = np.zeros(lg.num_nodes, dtype=bool)
    has_in[lg.dst] = True
    assert [lg.names[v] for v in np.flatnonzero(~has_in)] == ["ids"]


def test_a_module_called_but_not_held_is_inlined() -> None:
    lg = build_layer_graph(Shifted(), [((2, 5), "int64")], name="shifted")
    gelu = [v for v, n in enumerate(lg.names) if n.startswith("gelu")]
    assert len(gelu) == 1 and lg.kinds[gelu[0]] == "elementwise"
    assert reaches(lg, list(lg.names).index("emb"), gelu[0]) and reaches(lg, gelu[0], list(lg.names).index("fc"))


def test_a_module_with_parameters_the_model_does_not_hold_is_refused_in_one_line() -> None:
    with pytest.raises(LayerGraphError) as e:
        build_layer_graph(Stray(), [(2, 8)], name="stray")
    msg = str(e.value)
    assert "\n" not in msg and "model 'stray' calls a Linear that is not one of its submodules" in msg
    assert msg.endswith("make it a submodule of the model")
