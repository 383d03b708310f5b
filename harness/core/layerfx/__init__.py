"""The ``torch.fx`` front end of the layer graph: :func:`build_layer_graph` traces a ``torch.nn.Module``
with fake tensors and builds its :class:`harness.core.layergraph.LayerGraph` (OptCNN's / PaSE's
computation graph; the IR and its conventions are described in :mod:`harness.core.layergraph`).

Modules: :mod:`~harness.core.layerfx.tracer` (the tracer and the fake-tensor shape propagation),
:mod:`~harness.core.layerfx.builder` (the entry point and the walk over the fx graph),
:mod:`~harness.core.layerfx.emit` (node and edge accumulation), :mod:`~harness.core.layerfx.classify` (which
handler reads a call), the handlers by op family (:mod:`~harness.core.layerfx.layers`,
:mod:`~harness.core.layerfx.norms`, :mod:`~harness.core.layerfx.elementwise`, :mod:`~harness.core.layerfx.views`)
and :mod:`~harness.core.layerfx.common` (the values they share).

What becomes a node (how :func:`build_layer_graph` reads a ``torch.fx`` graph)
---------------------------------------------------------------------------
* every call of a leaf module (the standard ``torch.nn`` layers, plus ``leaf_modules``); a module
  called several times (a shared layer, an LSTM cell unrolled over time steps) gives one node
  per call, named ``path``, ``path@1``, ``path@2``...;
* every function / method call on a tensor that depends on the model's inputs: ``torch.add``,
  ``operator.add``, ``torch.cat``, ``matmul``, ``softmax``, reductions...;
* view and shape ops (``view``, ``reshape``, ``permute``, ``transpose``, ``flatten``, slicing,
  ``chunk``, ``pad``...) are kept as zero-FLOP nodes of kind ``"view"``, not folded into edges: an edge
  then always carries exactly the producer's output, with the same shape on both sides, and
  the view's own axis maps say how its output axes relate to its input axes (folding a
  reshape into an edge would need a second axis map per edge). Algorithms that want to skip
  them can eliminate them like any in-degree-1 node (OptCNN node elimination). ``chunk`` /
  ``split`` / ``unbind`` produce one view node per piece actually used. Ops that return their
  input unchanged (``nn.Identity``, dropout with p = 0, ``contiguous``, ``clone``, ``detach``)
  are not nodes at all: their consumers read the producer;
* an item assignment ``x[k] = v`` (transformers' ``shift_tokens_right``) is a node of kind
  ``"other"`` (``tracer.assign``) that reads ``x`` and ``v`` and makes the assigned tensor, which
  ``x``'s readers after it read (a view of ``x`` taken before it keeps the old value);
* a module the model calls but does not hold as a submodule (a module-level ``gelu =
  GELUActivation()``, as RoBERTa's LM head and Mamba call) is inlined: its ops are the nodes.  One
  with parameters or buffers of its own is refused, as its parameters belong to no layer;
* shape arithmetic (``x.shape``, ``x.size(1)``, ``len``) is not data: no nodes;
* model inputs become nodes of kind ``"input"`` (zero FLOPs);
* parameters are not nodes: their bytes go to the layer that reads them (``param_bytes``,
  names in ``attrs[v]["params"]``; a shared parameter is counted by each reader, see
  :attr:`~harness.core.layergraph.LayerGraph.unique_param_bytes`). Tensors that do not depend on inputs or parameters
  (positional tables, causal masks, zero initial states) are constants that every shard can
  make locally: they are not nodes and not edges;
* the loss is not part of the graph (configs are about layers): the graph ends at the model's
  outputs (``meta["outputs"]``). A loss module inside the model becomes a node of kind
  ``"loss"`` (split by sample, each shard a partial loss).

Tracing is ``torch.fx.symbolic_trace``'s module-level tracer with fake-tensor values attached
to every proxy, so shapes are concrete while tracing: ``len(x.unbind(1))``, ``for x_t in
x.unbind(1)``, ``range(x.shape[1])`` and ``if x.shape[1] > 1`` work, and Python loops over time
steps unroll (an explicit LSTM cell gives one node per cell op per step; the calls of its
shared gate ``nn.Linear`` are ``layers.0.gates``, ``layers.0.gates@1``, ...). Control flow on
tensor *values* (``if x.sum() > 0``) cannot be traced and raises
:class:`harness.core.layergraph.LayerGraphError`; mark the submodule as a leaf (``leaf_modules``) and it
becomes one node, run once on real zeros with batch 1 to get its output shapes and FLOPs since fake
tensors have no values.
"""

from harness.core.layerfx.builder import build_layer_graph
from harness.core.layerfx.common import InputLike, InputSpec

__all__ = ["InputLike", "InputSpec", "build_layer_graph"]
