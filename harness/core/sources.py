"""The seam between a model and the rest of the harness: what a graph source is (the
``_target_`` of a ``conf/model`` file), declared as protocols so that a source from another
package plugs in by having these members, and so that what the harness asks of one is written
down once.

* :class:`GraphSource`: every source.  ``name``, ``batch_size`` (the global batch: data
  parallelism splits it across devices), ``graph_source`` (where the last graph came from:
  ``captured``, ``disk``, ``memory``, a file) and :meth:`~GraphSource.op_graph`.
* :class:`LayerGraphSource`: a source that also gives a layer graph (the OptCNN / PaSE /
  FlexFlow searches plan on one).
* :class:`TorchSource`: a PyTorch model that can be built, so that it can be profiled and run
  for real (``build``, ``inputs``, ``target``, ``loss``).
* :class:`StackSource`: a source that gives a stack graph (a chain of pipeline units: a
  transformer by its shape, ``model=llm``; a zoo model's layers), which the stack algorithms
  (``algo=megatron``, ``fsdp``) plan on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harness.core.graph import OpGraph
    from harness.core.layergraph import LayerGraph
    from harness.core.llm.stack import StackGraph


@runtime_checkable
class GraphSource(Protocol):
    """What ``harness.run`` asks of a model (see the module docstring)."""

    name: str
    batch_size: int
    graph_source: str

    def op_graph(self, granularity: str = "aten", optimizer: str = "sgd", batch_probe: bool = True, keep_fx: bool = False,
                 **graph_cfg: Any) -> OpGraph:
        """The training step's operator graph (``graph.*`` keys of the config as keyword arguments)."""
        ...


@runtime_checkable
class LayerGraphSource(GraphSource, Protocol):
    """A source that also gives a layer graph."""

    def layer_graph(self, precision: str = "fp32", cache: bool = True) -> LayerGraph:
        """The model's layer graph (OptCNN Table 1's parallelizable dims, PaSE's iteration domains)."""
        ...


@runtime_checkable
class TorchSource(GraphSource, Protocol):
    """A PyTorch model that can be built on a device: the profiler and real runs need one."""

    inputs: list[Any]
    target: Any
    loss: str

    def build(self) -> Any:
        """A fresh ``nn.Module`` of the model, on the CPU."""
        ...


@runtime_checkable
class StackSource(GraphSource, Protocol):
    """A source that gives a stack graph (:class:`harness.core.llm.stack.StackGraph`)."""

    def stack_graph(self, precision: str = "fp32") -> StackGraph:
        """The model as an ordered chain of pipeline-partitionable units at ``precision``."""
        ...
