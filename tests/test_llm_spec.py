"""Transformers described by their shape (harness/core/llm/spec.py, source.py, hf_spec.py): the
presets' parameter counts against the published ones, one-line refusals naming the key, the
model=llm source's keys, and Hugging Face configs mapped onto the same description (their
parameter counts equal to the built model's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.app.compose import compose
from harness.app.run import build
from harness.core.errors import ModelConfigError
from harness.core.llm.source import LLMModel
from harness.core.llm.spec import TransformerSpec
from harness.core.sources import GraphSource, StackSource
from tests.helpers import refused

REPO = Path(__file__).resolve().parents[1]

#: published parameter counts (billions) and the precision the source rounds them to
#: (SC'21 Table 1 prints one decimal: 1.7B is 1.652B by the paper's own formula)
PUBLISHED = {
    "gpt_1p7b": (1.7, 0.05), "gpt_3p6b": (3.6, 0.05), "gpt_7p5b": (7.5, 0.05), "gpt_18p4b": (18.4, 0.05),
    "gpt_39p1b": (39.1, 0.05), "gpt_76p1b": (76.1, 0.05), "gpt_145p6b": (145.6, 0.05), "gpt_310p1b": (310.1, 0.05),
    "gpt_529p6b": (529.6, 0.05), "gpt_1t": (1008.0, 0.05),     # Narayanan et al. SC'21, Table 1
    "gpt3_175b": (175.0, 0.5),            # Brown et al. 2020
    "bloom_176b": (176.247271424, 0.0),   # the bigscience/bloom model card: 176,247,271,424
    "llama3_8b": (8.03, 0.005),           # meta-llama/Meta-Llama-3.1-8B model card
    "llama3_70b": (70.6, 0.05),           # meta-llama/Meta-Llama-3.1-70B model card
    "llama3_405b": (405.0, 0.5),          # Llama 3 Herd, Table 3
    "nemotron4_340b": (340.0, 0.5),       # Nemotron-4 340B Technical Report
    "mixtral_8x7b": (46.7, 0.05),         # Jiang et al. 2024, Sec. 2.1
    "deepseek_moe": (16.4, 0.05),         # Dai et al. 2024, Sec. 5.1
    "llm": (1.1, 0.05),                   # TinyLlama-1.1B (Zhang et al. 2024)
}
ACTIVE = {"mixtral_8x7b": (12.9, 0.05), "deepseek_moe": (2.8, 0.05)}


def preset(name: str) -> LLMModel:
    return build(compose([f"model={name}"]))[0]


def test_every_llm_preset_has_a_published_count():
    files = {p.stem for p in (REPO / "conf" / "model").glob("*.yaml") if "harness.core.llm.source.LLMModel" in p.read_text()}
    assert files == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_match_the_papers(name):
    """Within 1 % of the published count, or within the rounding the source prints it with."""
    published, rounding = PUBLISHED[name]
    spec = preset(name).spec
    got = spec.param_count() / 1e9
    assert abs(got - published) <= max(0.01 * published, rounding), f"{name}: {got:.3f}B against {published}B"
    if name in ACTIVE:
        active, rounding = ACTIVE[name]
        assert abs(spec.active_param_count() / 1e9 - active) <= max(0.01 * active, rounding)
    else:
        assert spec.active_param_count() == spec.param_count()


def test_bloom_is_exact_and_megatron_gpt_follows_narayanans_formula():
    assert preset("bloom_176b").spec.param_count() == 176_247_271_424
    for name in ("gpt_1p7b", "gpt_145p6b"):
        s = preset(name).spec
        l, h, V, seq = s.layers, s.hidden, s.vocab, s.seq_len
        narayanan = 12 * l * h * h * (1 + 13 / (12 * h) + (V + seq) / (12 * l * h))
        assert s.param_count() == pytest.approx(narayanan + 2 * h, rel=1e-12)   # + the final LayerNorm


def test_counts_by_hand_for_a_small_gqa_moe_model():
    s = TransformerSpec("t", 3, 64, 8, 2, 256, True, 32, 100, False, experts=4, top_k=2, expert_ffn_hidden=32, shared_experts=1,
                        first_dense_layers=1)
    hd = 64 // 8
    attn = 64 * (64 + 2 * 2 * hd) + 64 * 64
    dense = attn + 2 * 64 + 3 * 64 * 256
    moe_other = attn + 2 * 64 + 64 * 4 + 3 * 64 * 32
    experts = 4 * 3 * 64 * 32
    assert s.block_params(False) == (dense, 0)
    assert s.block_params(True) == (moe_other, experts)
    assert s.embedding_params() == 100 * 64 and s.head_params() == 64 + 100 * 64
    assert s.param_count() == 2 * 100 * 64 + 64 + dense + 2 * (moe_other + experts)
    assert s.active_param_count() == 2 * 100 * 64 + 64 + dense + 2 * (moe_other + experts // 2)
    assert (s.kv_dim, s.moe_layers, s.dense_layers, s.is_moe) == (2 * hd, 2, 1, True)


@pytest.mark.parametrize("overrides, fragment", [
    (["model.heads=24", "model.kv_heads=8"], "model.hidden=2048 is not divisible by model.heads=24: the heads split the hidden size; use model.heads=16"),
    (["model.kv_heads=5"], "model.heads=32 is not a multiple of model.kv_heads=5"),
    (["model.kv_heads=64"], "model.heads=32 is not a multiple of model.kv_heads=64"),
    (["model.layers=0"], "model.layers must be an integer >= 1"),
    (["model.hidden=2.5"], "model.hidden must be an integer >= 1"),
    (["model.vocab=abc"], "model.vocab must be an integer >= 1"),
    (["model.seq_len=null"], "model.seq_len must be an integer >= 1"),
    (["model.gated_mlp=yes"], "model.gated_mlp must be true or false"),
    (["model.position=sinusoidal"], "model.position must be one of rope, learned, alibi"),
    (["model.norm=batchnorm"], "model.norm must be one of rmsnorm, layernorm"),
    (["model.attention=sdpa"], "model.attention must be one of flash, flash_triton, eager"),
    (["model.experts=-1"], "model.experts must be an integer >= 0"),
    (["model.top_k=2"], "model.top_k=2 needs a mixture of experts"),
    (["model.shared_experts=2"], "model.shared_experts=2 needs a mixture of experts"),
    (["model.experts=8", "model.top_k=0"], "model.top_k=0 must be in 1..model.experts=8"),
    (["model.experts=8", "model.top_k=9"], "model.top_k=9 must be in 1..model.experts=8"),
    (["model.experts=8", "model.top_k=2", "model.first_dense_layers=22"], "model.first_dense_layers=22 leaves no MoE layer"),
    (["model.batch_size=0"], "model.batch_size must be an integer >= 1"),
    (["+model.hiden=4"], "model.hiden is not a key of model: did you mean model.hidden?"),
])
def test_a_bad_shape_is_one_line_naming_the_key(overrides, fragment):
    err = refused(lambda: build(compose(["model=llm", *overrides])), fragment, kind=ModelConfigError)
    assert "\n" not in str(err)


def test_head_dim_lifts_the_divisibility_rule():
    s = build(compose(["model=llm", "model.heads=24", "model.kv_heads=8", "model.head_dim=64"]))[0].spec
    assert (s.head_size, s.q_dim, s.kv_dim) == (64, 1536, 512)


def test_the_source_gives_only_a_stack_graph():
    src = preset("llama3_8b")
    assert isinstance(src, StackSource) and isinstance(src, GraphSource) and src.graph_source == "shape"
    g = src.stack_graph(precision="amp_bf16")
    assert g is src.stack_graph(precision="amp_bf16")
    assert [u.kind for u in g.units] == ["embedding"] + ["block"] * 32 + ["head"]
    assert g.params() == src.spec.param_count() and g.batch_size == 512 and g.seq_len == 8192
    for ask in (src.op_graph, src.layer_graph):
        refused(ask, "described by its shape", "algo=megatron", kind=ModelConfigError)


def test_zoo_models_are_stack_sources_too():
    assert isinstance(build(compose(["model=lenet5"]))[0], StackSource)


def test_the_command_line_names_the_misspelt_key():
    r = subprocess.run([sys.executable, "-m", "harness", "model=llm", "+model.hiden=4", "algo=data_parallel"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "model.hiden" in lines[0] and "did you mean model.hidden?" in lines[0], r.stderr


# ---------------------------------------------------------------------------- Hugging Face configs
HF_CASES = [
    ("llama", ["+model.config.num_hidden_layers=2", "+model.config.num_key_value_heads=8", "+model.config.hidden_size=1024",
               "+model.config.intermediate_size=2816", "+model.config.num_attention_heads=16"]),
    ("gpt2", ["+model.config.n_layer=2"]),
    ("mistral", ["+model.config.num_hidden_layers=2", "model.seq_len=4096"]),
    ("qwen2", ["+model.config.num_hidden_layers=2", "model.seq_len=4096"]),
    ("mixtral", ["+model.config.num_hidden_layers=2", "model.seq_len=4096"]),
]


@pytest.mark.parametrize("arch, overrides", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hf_configs_map_onto_the_same_description(arch, overrides):
    """The stack graph's parameter count is the transformers model's, built on the meta device."""
    pytest.importorskip("transformers")
    import torch

    src = build(compose(["model=hf", f"model.arch={arch}", *overrides]))[0]
    graph = src.stack_graph(precision="amp_bf16")
    with torch.device("meta"):
        module = src.build()
    built = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    assert graph.params() == graph.spec.param_count() == built
    assert graph.seq_len == src.seq_len and graph.spec.is_moe == (arch == "mixtral")


def test_hf_mapping_details():
    pytest.importorskip("transformers")
    gpt2 = build(compose(["model=hf", "model.arch=gpt2", "+model.config.n_layer=2"]))[0].stack_graph().spec
    assert (gpt2.position, gpt2.norm, gpt2.linear_bias, gpt2.tied_embeddings, gpt2.gated_mlp, gpt2.dropout) == \
        ("learned", "layernorm", True, True, False, True)
    assert gpt2.ffn_hidden == 4 * gpt2.hidden
    eager = build(compose(["model=hf", "model.arch=llama", "+model.config.num_hidden_layers=2",
                           "++model.config.attn_implementation=eager"]))[0].stack_graph().spec
    assert eager.attention == "eager" and eager.kv_heads == eager.heads
    qwen = build(compose(["model=hf", "model.arch=qwen2", "model.seq_len=128"]))[0].stack_graph().spec
    assert qwen.qkv_bias and not qwen.linear_bias


def test_hf_architectures_without_a_stack_graph_say_which_have_one():
    pytest.importorskip("transformers")
    src = build(compose(["model=hf", "model.arch=bert"]))[0]
    refused(lambda: src.stack_graph(), "model.arch=bert", "llama, mistral, qwen2, gpt2, mixtral", kind=ModelConfigError)
