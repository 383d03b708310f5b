"""Transformer LLMs described by their shape, and what the stack planners and the pipeline
simulator share about them (issue 33).

* :mod:`~harness.core.llm.spec`: :class:`TransformerSpec`, a decoder-only transformer by its
  shape (dense, GQA, gated MLPs, mixtures of experts), its parameter counts.
* :mod:`~harness.core.llm.flops`: model and hardware FLOPs, MFU and HFU (Korthikanti et al.'s
  definitions, generalised as Megatron-LM's ``num_floating_point_operations``).
* :mod:`~harness.core.llm.stack`: the ``"stack"`` graph, a model as an ordered chain of
  pipeline-partitionable units (embedding, blocks, head; or a CNN's layers).
* :mod:`~harness.core.llm.work`: what one GPU does for one unit under one shard (tensor /
  sequence / context / expert parallel, micro-batch, recomputation): its kernels, collectives
  and activation memory, and their times under a cost model.
* :mod:`~harness.core.llm.source`: ``model=llm`` and the published presets (``conf/model``).
* :mod:`~harness.core.llm.hf_spec`: Hugging Face decoder configs onto a :class:`TransformerSpec`.
* :mod:`~harness.core.llm.plan`: the parallel plan the stack algorithms return.
* :mod:`~harness.core.llm.memory`, :mod:`~harness.core.llm.schedules`,
  :mod:`~harness.core.llm.pipeline_links`: what the pipeline simulator and the plan search
  (``algo=hybrid_search``) share: a plan's model states by ZeRO, the pipeline schedules' orders,
  the send between two stages.
"""
