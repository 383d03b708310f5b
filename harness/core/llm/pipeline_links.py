"""The point-to-point time between two pipeline stages under Megatron-LM's rank layout: what the
pipeline simulator (:mod:`simulators.pipeline`) charges a send between stages and what the plan
search (:mod:`algorithms.llm_search_costing`) puts on a pipeline's dependency chain.

Megatron-LM's scatter/gather optimisation (Narayanan et al., SC'21, Sec. 4.1; on by default,
``--no-scatter-gather-tensors-in-pipeline`` turns it off): without sequence parallelism every
tensor-parallel rank holds the whole boundary activation, so each sends only its ``1/t`` of it and
the receiving stage all-gathers the pieces over its tensor-parallel group (NVLink).  DeepSpeed's
pipeline engine does the same for activations and their gradients (``is_pipe_partitioned`` and
``is_grad_partitioned`` are its model-parallel flag).  ``split=1``: every rank sends the whole
tensor (``algo.scatter_gather=false``)."""

from __future__ import annotations

import numpy as np

from harness.core.fabric import Fabric, Group, collective_time, p2p_time


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


def stage_send_time(fabric: Fabric, nbytes: float, stride: int, a: int, b: int, split: int = 1) -> float:
    """A pipeline send of ``nbytes`` per rank from stage ``a`` to ``b`` (:func:`p2p_time_between`);
    with ``split = t > 1`` Megatron-LM's scatter/gather (module docstring): ``nbytes / t`` across,
    then an all-gather of ``nbytes`` over the ``t`` consecutive ranks of the tensor-parallel group."""
    if split <= 1:
        return p2p_time_between(fabric, nbytes, stride, a, b)
    return p2p_time_between(fabric, nbytes / split, stride, a, b) + collective_time(fabric, "all_gather", nbytes, Group(split, 1))
