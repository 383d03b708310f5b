"""The point-to-point time between two pipeline stages under Megatron-LM's rank layout: what the
pipeline simulator (:mod:`simulators.pipeline`) charges a send between stages and what the plan
search (:mod:`algorithms.llm_search_bounds`) puts on a pipeline's dependency chain."""

from __future__ import annotations

import numpy as np

from harness.core.fabric import Fabric, p2p_time


def p2p_time_between(fabric: Fabric, nbytes: float, stride: int, a: int, b: int) -> float:
    """A pipeline send from stage ``a`` to stage ``b`` (``stride`` ranks per stage): every rank of
    ``a`` sends to its partner at once, inside a node when every pair shares one, else across
    (between pods when any pair is in different pods): a boundary is as slow as its slowest pair."""
    j = np.arange(stride)
    g = fabric.gpus_per_node
    same_node = bool(np.all((a * stride + j) // g == (b * stride + j) // g))
    pod = g * fabric.pod_nodes if fabric.pod_nodes else 0
    same_pod = not pod or bool(np.all((a * stride + j) // pod == (b * stride + j) // pod))
    return p2p_time(fabric, nbytes, same_node, same_pod)
