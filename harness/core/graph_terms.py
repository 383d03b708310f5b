"""The vocabulary of an operator graph, shared by the IR (:mod:`harness.core.graph`) and the checks
of its file (:mod:`harness.core.graph_file`): phases, batch roles, the file formats, the key of a
time valid on any device, :class:`GraphError` and how a bad number is shown."""

from __future__ import annotations

import numpy as np

from harness.core.errors import UserError

PHASES: tuple[str, ...] = ("forward", "backward", "update")
FORWARD, BACKWARD, UPDATE = 0, 1, 2

#: How a node behaves when its op is split along the sample (batch) dimension:
#: ``batched`` ops work on a slice of the batch and produce a slice; ``partial`` ops
#: consume batched inputs but produce an unbatched tensor (weight gradients, the loss),
#: so each replica holds a partial sum that must be reduced; ``replicated`` ops do not
#: depend on the batch (parameter views, optimizer updates) and run whole on every replica.
BATCH_ROLES: tuple[str, ...] = ("batched", "partial", "replicated")
BATCHED, PARTIAL, REPLICATED = 0, 1, 2

GRAPH_FORMAT = "harness.opgraph/2"
#: the formats :meth:`OpGraph.load` reads: /1 (no ``node_time_s``) and /2
GRAPH_FORMATS: tuple[str, ...] = ("harness.opgraph/1", GRAPH_FORMAT)
#: the ``node_time_s`` key of a time measured on (or valid for) any device kind
ANY_DEVICE = "*"


class GraphError(UserError, ValueError):
    """A graph is malformed (a cycle, an edge to a missing node, arrays of wrong length)."""


def show_number(x: float) -> str:
    """A number as the file wrote it (``-3``, ``1.5``, ``nan``), a huge one in short (``1e+30``)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x) if abs(x) < 10**16 else f"{str(x)[:4]}... ({len(str(abs(x)))} digits)"
    if not np.isfinite(x) or abs(x) < 1e16:
        return str(int(x)) if np.isfinite(x) and x == int(x) else repr(float(x))
    return f"{float(x):.3g}"
