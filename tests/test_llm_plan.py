"""Parallel plans of a stack graph (harness/core/llm/plan.py): what plan_from_degrees fills in,
the stage partitions (the default one pinned, the balanced one against brute force), the
chunk-to-stage map of interleaving, the JSON round trip, and the published configurations that
must be valid.  Each invalid combination has its own test in tests/test_llm_plan_hostile.py."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from harness.core.llm.plan import (DEFAULT_BUCKET_BYTES, PLAN_FORMAT, ParallelPlan, balanced_stages, default_stages, padded_vocab,
                                   plan_from_degrees, plan_warnings)
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import transformer_stack
from harness.core.llm.work import Shard
from tests.stack_helpers import chain_stack, toy_stack


def test_dp_is_what_the_gpus_leave_and_the_schedule_follows_vpp() -> None:
    g = toy_stack(batch=64)
    p = plan_from_degrees(g, 32, tp=2, pp=4)
    assert (p.tp, p.pp, p.dp, p.cp, p.gpus) == (2, 4, 4, 1, 32)
    assert p.schedule == "1f1b" and p.zero == 0 and p.bucket_bytes == DEFAULT_BUCKET_BYTES
    q = plan_from_degrees(g, 32, tp=2, pp=4, vpp=2)
    assert q.schedule == "interleaved" and q.chunks == 8
    assert plan_from_degrees(g, 32, tp=2, pp=4, dp=4).dp == 4
    assert plan_from_degrees(g, 32, tp=2, pp=4, schedule="gpipe").schedule == "gpipe"


def test_micro_batches_are_the_batch_over_dp_times_the_micro_batch() -> None:
    g = toy_stack(batch=96)
    p = plan_from_degrees(g, 16, tp=2, pp=2, micro_batch=3)
    assert p.dp == 4 and p.micro_batches(96) == 96 // (3 * 4) == 8


def test_the_default_partition_is_even_with_the_embedding_first_and_the_head_last() -> None:
    g = toy_stack(layers=8)  # units: embedding, 8 blocks, head
    assert default_stages(g, 4, 1) == (1 + 2, 2, 2, 2 + 1)
    assert default_stages(g, 2, 2) == (1 + 2, 2, 2, 2 + 1)
    assert default_stages(g, 1, 1) == (10,)
    assert default_stages(g, 8, 1) == (2, 1, 1, 1, 1, 1, 1, 2)


@pytest.mark.parametrize("layers, pp, blocks", [
    (10, 4, (2, 3, 3, 2)),       # the remainder on the two middle stages
    (11, 4, (3, 3, 3, 2)),       # middle stages first, then the first stage (its embedding is a lookup)
    (13, 4, (3, 4, 3, 3)),       # one extra: the most central middle stage, the lower one on a tie
    (9, 2, (5, 4)),              # no middle stage: the first
    (126, 16, (7, *[8] * 14, 7)),  # Llama 3 405B's 126 blocks on 16 stages: the first and last lighter
])
def test_an_uneven_remainder_goes_to_the_middle_stages(layers: int, pp: int, blocks: tuple[int, ...]) -> None:
    got = default_stages(toy_stack(layers=layers), pp, 1)
    assert got[0] - 1 == blocks[0] and got[-1] - 1 == blocks[-1] and got[1:-1] == blocks[1:-1]
    assert sum(got) == layers + 2


def test_every_default_partition_differs_by_at_most_one_block() -> None:
    for layers in range(1, 30):
        g = toy_stack(layers=layers)
        for pp in range(1, layers + 1):
            parts = list(default_stages(g, pp, 1))
            parts[0] -= 1
            parts[-1] -= 1
            assert sum(parts) == layers and max(parts) - min(parts) <= 1 and min(parts) >= 1
            if layers % pp and pp > 2 and layers % pp <= pp - 2:   # a remainder the middle stages can take
                assert parts[0] == parts[-1] == layers // pp


def test_a_cnn_chain_splits_all_its_units() -> None:
    g = chain_stack([1.0] * 10)
    assert default_stages(g, 3, 1) == (3, 4, 3)


def test_chunks_cover_the_units_once_and_run_round_robin_on_the_stages() -> None:
    g = toy_stack(layers=16, batch=64)
    p = plan_from_degrees(g, 8, pp=4, vpp=2)
    units = [u for c in range(p.chunks) for u in p.chunk_units(c)]
    assert units == list(range(g.num_nodes))
    assert [p.stage_of_chunk(c) for c in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert p.chunks_of_stage(1) == [1, 5]
    assert p.stage_units(0) == [*p.chunk_units(0), *p.chunk_units(4)]
    assert sorted(u for s in range(4) for u in p.stage_units(s)) == list(range(g.num_nodes))
    assert p.devices_used() == list(range(8))


def test_the_shard_is_the_plan_seen_from_one_gpu() -> None:
    g = toy_stack(batch=64)
    p = plan_from_degrees(g, 16, tp=4, cp=2, micro_batch=2, recompute="selective", sequence_parallel=True)
    assert p.shard() == Shard(tp=4, sp=True, cp=2, ep=1, micro_batch=2, recompute="selective")


def test_the_plan_round_trips_through_json() -> None:
    g = toy_stack(layers=16, batch=64)
    p = plan_from_degrees(g, 16, tp=2, pp=4, vpp=2, micro_batch=2, recompute="full", zero=1, overlap_grad_reduce=False,
                          meta={"algo": "megatron"})
    d = json.loads(json.dumps(p.to_dict()))
    assert d["format"] == PLAN_FORMAT and d["stages"] == list(p.stages)
    q = ParallelPlan.from_dict(d)
    assert q == p and q.meta == {"algo": "megatron"}
    q.validate(g, 16)
    described = p.describe()
    assert described["gpus"] == 16 and described["chunks"] == 8 and "meta" not in described


def test_zero_3_runs_with_a_pipeline_and_the_vocabulary_is_padded_not_refused() -> None:
    """torchtitan runs FSDP with PP (allowed); Megatron-LM pads the vocabulary to 128 x tp."""
    g = toy_stack(vocab=1001)
    p = plan_from_degrees(g, 16, tp=8, pp=2, zero=3)
    assert p.zero == 3 and p.pp == 2
    assert padded_vocab(1001, 8) == 1024 and padded_vocab(50257, 1) == 50304 and padded_vocab(51200, 8) == 51200


def test_tensor_parallelism_across_nodes_is_a_warning() -> None:
    g = toy_stack(heads=16, kv_heads=16)
    p = plan_from_degrees(g, 16, tp=16)
    assert plan_warnings(p, 8) and "spans nodes of 8 GPUs" in plan_warnings(p, 8)[0]
    assert plan_warnings(plan_from_degrees(g, 16, tp=8), 8) == []
    assert plan_warnings(plan_from_degrees(toy_stack(batch=12), 12, tp=4, dp=3), 6)   # a group of 4 straddles nodes of 6


# ---------------------------------------------------------------------------- balanced partitions
def brute_force_max(weights: list[float], chunks: int) -> float:
    """The least heaviest chunk over every contiguous partition into ``chunks`` non-empty pieces."""
    n = len(weights)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), chunks - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def test_the_balanced_partition_is_optimal_against_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 9)
        w = [rng.choice([0.0, rng.uniform(0, 10), float(rng.randint(1, 4))]) for _ in range(n)]
        pp = rng.randint(1, n)
        vpp = rng.randint(1, max(1, n // pp))
        parts = balanced_stages(chain_stack(w), pp, vpp, w)
        assert len(parts) == pp * vpp and sum(parts) == n and min(parts) >= 1
        bounds = [0, *itertools.accumulate(parts)]
        heaviest = max(sum(w[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert heaviest == pytest.approx(brute_force_max(w, pp * vpp), rel=1e-12, abs=1e-12)


def test_balanced_equals_even_on_uniform_weights_and_lightens_a_heavy_head() -> None:
    g = chain_stack([1.0] * 12)
    assert balanced_stages(g, 4, 1, [1.0] * 12) == (3, 3, 3, 3)
    w = [1.0] * 11 + [4.0]   # a head four times a block: the last stage takes fewer units
    parts = balanced_stages(g, 4, 1, w)
    assert parts[-1] < 3 and max(sum(w[a:b]) for a, b in zip([0, *itertools.accumulate(parts)], itertools.accumulate(parts))) == 4.0


def test_plan_from_degrees_takes_balanced_stages_with_weights() -> None:
    g = toy_stack(layers=6, batch=16)
    w = [0.5] + [1.0] * 6 + [3.0]
    p = plan_from_degrees(g, 4, pp=4, stages="balanced", weights=w)
    assert sum(p.stages) == 8 and max(sum(w[u] for u in p.chunk_units(c)) for c in range(4)) == 3.0
    seen = []
    plan_from_degrees(g, 4, pp=4, stages="balanced", weights=lambda plan: seen.append(plan.pp) or w)
    assert seen == [4]


# ---------------------------------------------------------------------------- published configurations are valid
def gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> TransformerSpec:
    """A Megatron GPT shape (SC'21 Table 1; Korthikanti Table 3): ffn 4h, learned positions, tied embeddings."""
    return TransformerSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden, gated_mlp=False,
                           seq_len=seq, vocab=vocab, tied_embeddings=True, position="learned", norm="layernorm", linear_bias=True)


LLAMA3_405B = TransformerSpec(name="llama3_405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, gated_mlp=True,
                              seq_len=8192, vocab=128256, tied_embeddings=False)   # Llama 3 paper (Dubey et al. 2024), Table 3

#: (shape, batch, GPUs, degrees): Narayanan et al. SC'21 Table 1 (micro-batch not in the table: 1), Korthikanti et al.
#: MLSys'23 Table 3, BLOOM-176B (bigscience tr11-176B-ml: tp 4, pp 12, dp 8, micro-batch 2, batch 2048; 70 blocks, 112 heads,
#: vocab 250,880 padded), Llama 3 405B on 16,384 GPUs (Dubey et al. 2024, Sec. 3.3.2: tp 8, pp 16, dp 128, batch 16M tokens)
PUBLISHED = [
    (gpt(24, 2304, 24), 512, 32, dict(tp=1, pp=1)),
    (gpt(48, 8192, 64), 1536, 512, dict(tp=8, pp=2)),
    (gpt(80, 12288, 96), 2304, 1536, dict(tp=8, pp=8)),
    (gpt(96, 16384, 128), 2160, 1920, dict(tp=8, pp=16)),
    (gpt(105, 20480, 128), 2520, 2520, dict(tp=8, pp=35)),
    (gpt(128, 25600, 160), 3072, 3072, dict(tp=8, pp=64)),
    (gpt(96, 12288, 96), 64, 64, dict(tp=8, pp=8, vpp=3, recompute="selective", sequence_parallel=True)),
    (gpt(105, 20480, 128), 280, 280, dict(tp=8, pp=35, vpp=3, recompute="selective", sequence_parallel=True)),
    (gpt(96, 12288, 96), 1536, 1024, dict(tp=8, pp=8, vpp=3, recompute="selective", sequence_parallel=True)),  # the command
    (TransformerSpec(name="bloom", layers=70, hidden=14336, heads=112, kv_heads=112, ffn_hidden=57344, gated_mlp=False, seq_len=2048,
                     vocab=250880, tied_embeddings=True, position="alibi", norm="layernorm", linear_bias=True),
     2048, 384, dict(tp=4, pp=12, micro_batch=2, zero=1, recompute="full")),
    (LLAMA3_405B, 2048, 16384, dict(tp=8, pp=16, zero=1)),
]


@pytest.mark.parametrize("spec, batch, gpus, degrees", PUBLISHED, ids=lambda x: getattr(x, "name", str(x)))
def test_a_published_configuration_is_valid(spec: TransformerSpec, batch: int, gpus: int, degrees: dict) -> None:
    g = transformer_stack(spec, batch, "amp_bf16")
    p = plan_from_degrees(g, gpus, **degrees)
    assert p.gpus == gpus and sum(p.stages) == spec.layers + 2
    assert p.micro_batches(batch) * p.micro_batch * p.dp == batch
