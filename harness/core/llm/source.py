"""``model=llm`` and the published presets: a decoder-only transformer described by its shape.

:class:`LLMModel` is the ``_target_`` of ``conf/model/llm.yaml`` and of every preset
(``conf/model/gpt3_175b.yaml``, ``llama3_405b.yaml``, ...).  It is a graph source that gives only
a stack graph (:meth:`LLMModel.stack_graph`, graph kind ``"stack"``): the stack algorithms
(``algo=megatron``, ``fsdp``, ``data_parallel``) plan on it; an operator- or layer-graph
algorithm is refused in one line, since no graph of the whole model is traced.

Its keys are :class:`~harness.core.llm.spec.TransformerSpec`'s fields plus ``batch_size`` (the
global batch, in sequences), ``precision`` (the precision its published runs trained in: the
config's top-level ``precision`` defaults to it, ``precision=...`` on the command line wins) and
``name``; each is checked when the source is built, and a key it
does not take is refused with the nearest one it does (``model.hiden``: did you mean
``model.hidden``?).  ``kv_heads`` null means ``heads`` (multi-head attention), ``ffn_hidden``
null means ``4 x hidden``.
"""

from __future__ import annotations

from typing import Any

from harness.core.checks import known_keys, one_of, positive_int
from harness.core.errors import ModelConfigError
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import StackGraph, transformer_stack
from harness.core.precision import PRECISIONS

#: the keys of a ``model=llm`` config, in the order the docs list them
MODEL_KEYS: tuple[str, ...] = (
    "name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "gated_mlp", "seq_len", "vocab", "tied_embeddings",
    "position", "norm", "linear_bias", "experts", "top_k", "expert_ffn_hidden", "shared_experts", "first_dense_layers",
    "head_dim", "qkv_bias", "embedding_norm", "dropout", "attention", "kernels", "batch_size", "precision",
)
#: the algorithms that plan on a stack graph (what a refusal of the other graph kinds names)
STACK_ALGOS = "algo=megatron, algo=fsdp, algo=data_parallel or algo=hybrid_search"


class LLMModel:
    """A transformer LLM by its shape (see the module docstring)."""

    #: where the graph comes from: built from the shape, never traced or cached
    graph_source: str = "shape"
    #: the graph kinds it gives (harness.app.run.source_graph_kinds): a stack graph only, so that an
    #: algorithm that prefers the operator graph (algo=data_parallel) gets the stack graph here
    graph_kinds: tuple[str, ...] = ("stack",)

    def __init__(
        self,
        name: str = "llm",
        layers: int = 2,
        hidden: int = 256,
        heads: int = 4,
        kv_heads: int | None = None,
        ffn_hidden: int | None = None,
        gated_mlp: bool = True,
        seq_len: int = 2048,
        vocab: int = 32000,
        tied_embeddings: bool = False,
        position: str = "rope",
        norm: str = "rmsnorm",
        linear_bias: bool = False,
        experts: int = 0,
        top_k: int = 0,
        expert_ffn_hidden: int = 0,
        shared_experts: int = 0,
        first_dense_layers: int = 0,
        head_dim: int = 0,
        qkv_bias: bool = False,
        embedding_norm: bool = False,
        dropout: bool = False,
        attention: str = "flash",
        kernels: str = "fused",
        batch_size: int = 8,
        precision: str = "amp_bf16",
        **extra: Any,
    ) -> None:
        known_keys(extra, MODEL_KEYS, "model", ModelConfigError)
        self.name = str(name)
        #: the precision the model trains in by default (conf/config.yaml's precision follows it)
        self.precision = one_of(precision, "model.precision", PRECISIONS, ModelConfigError)
        self.batch_size = positive_int(batch_size, "model.batch_size", ModelConfigError)
        hidden_n = positive_int(hidden, "model.hidden", ModelConfigError)
        self.spec = TransformerSpec(
            name=self.name, layers=layers, hidden=hidden_n, heads=heads, kv_heads=heads if kv_heads is None else kv_heads,
            ffn_hidden=4 * hidden_n if ffn_hidden is None else ffn_hidden, gated_mlp=gated_mlp, seq_len=seq_len, vocab=vocab,
            tied_embeddings=tied_embeddings, position=position, norm=norm, linear_bias=linear_bias, experts=experts, top_k=top_k,
            expert_ffn_hidden=expert_ffn_hidden, shared_experts=shared_experts, first_dense_layers=first_dense_layers,
            head_dim=head_dim, qkv_bias=qkv_bias, embedding_norm=embedding_norm, dropout=dropout, attention=attention,
            kernels=kernels)
        self._graphs: dict[str, StackGraph] = {}

    def stack_graph(self, precision: str = "fp32") -> StackGraph:
        """The model as embedding, blocks and head (:func:`harness.core.llm.stack.transformer_stack`), once per precision."""
        if precision not in self._graphs:
            self._graphs[precision] = transformer_stack(self.spec, self.batch_size, precision, self.name,
                                                        meta={"params": self.spec.param_count(),
                                                              "active_params": self.spec.active_param_count()})
        return self._graphs[precision]

    def _refuse(self, kind: str) -> ModelConfigError:
        return ModelConfigError(f"model {self.name!r} is a transformer described by its shape and has no {kind} graph: it plans with "
                                f"the stack algorithms ({STACK_ALGOS})")

    def op_graph(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: no operator graph of the whole model is traced (see the module docstring)."""
        raise self._refuse("operator")

    def layer_graph(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: no layer graph of the whole model is built (see the module docstring)."""
        raise self._refuse("layer")

    def describe(self) -> dict[str, Any]:
        """The shape, its parameter counts and the batch, for result.json."""
        return {**self.spec.describe(), "batch_size": self.batch_size}
