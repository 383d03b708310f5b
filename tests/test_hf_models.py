"""``model=hf`` (harness/core/hf.py): Hugging Face architectures built from their configs and
captured like the zoo models, the keys checked, the optional dependency and a trace failure each
one line.  Tiny configs (one or two layers, width 32-64, vocabulary 100-1000, 16 tokens) keep
every test to seconds; the tests that need ``transformers`` skip without it (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.app.compose import compose
from harness.core.capture import CaptureError
from harness.core import hf
from harness.core.graph import BACKWARD, FORWARD, UPDATE
from harness.core.models import ModelConfigError
from harness.app.run import build
from tests.helpers import REPO, refused, run_harness

#: a one-layer GPT-2, 32 wide, 100 tokens, 16 per sample, batch 4
TINY_GPT2 = ["model=hf", "model.arch=gpt2", "+model.config.n_layer=1", "+model.config.n_embd=32", "+model.config.n_head=2",
             "+model.config.vocab_size=100", "model.seq_len=16", "model.batch_size=4"]
#: a one-layer BERT of the same size
TINY_BERT = ["model=hf", "model.arch=bert", "+model.config.num_hidden_layers=1", "+model.config.hidden_size=32",
             "+model.config.num_attention_heads=2", "+model.config.intermediate_size=64", "+model.config.vocab_size=100",
             "model.seq_len=16", "model.batch_size=4"]
QUIET = ["cluster=p100x4", "output.gantt=false", "output.trace=false", "output.worth=false"]


@pytest.fixture
def transformers() -> Any:
    """The transformers package; the test skips without it."""
    return pytest.importorskip("transformers")


def source(*overrides: str) -> Any:
    """The graph source of the composed config."""
    return build(compose(list(overrides)))[0]


# ---------------------------------------------------------------------------- end to end
def test_cli_runs_a_tiny_gpt2_on_both_graph_levels(transformers: Any, tmp_path: Path) -> None:
    """One sweep (one process): an operator-graph algorithm (FD-DPS) and a layer-graph one (OptCNN)."""
    r = run_harness("-m", "hydra/launcher=basic", "algo=fddps,optcnn", *TINY_GPT2, *QUIET, f"hydra.sweep.dir={tmp_path}",
                "hydra.sweep.subdir=${algo.name}")
    assert r.returncode == 0, r.stderr[-3000:]
    for algo in ("fddps", "optcnn"):
        row = json.loads((tmp_path / algo / "result.json").read_text())
        assert row["model"] == "gpt2" and row["algo"] == algo and row["batch_size"] == 4
        assert row["graph_nodes"] > 10 and row["step_time_s"] >= row["lower_bound_s"] > 0


# ---------------------------------------------------------------------------- what is captured
def test_a_causal_lm_step_is_captured_like_a_zoo_model(transformers: Any) -> None:
    src = source(*TINY_GPT2)
    assert (src.task, src.seq_len, src.loss) == ("causal_lm", 16, "cross_entropy")
    assert src.inputs[0].shape == (16,) and src.inputs[0].dtype == "int64" and src.inputs[0].high == 100
    assert src.target == src.inputs[0]  # the next token at every position
    g = src.op_graph()
    counts = np.bincount(g.phase, minlength=3)
    assert counts[FORWARD] > 0 and counts[BACKWARD] > 0 and counts[UPDATE] > 0
    assert g.meta["batch_probe"] and g.meta["loss_node"] >= 0
    with torch.device("meta"):
        n_params = sum(p.numel() for p in src.build().parameters())  # the tied embedding counted once
    trainable = [i for i, _ in enumerate(g.param_names) if g.grad_node[i] >= 0]
    assert g.param_bytes[trainable].sum() == 4 * n_params
    assert (g.update_node[trainable] >= 0).all()
    assert any(name.startswith("hf.transformer.h.0.attn") for name in g.layer_names)
    assert src.layer_graph().num_nodes > 10


def test_an_encoder_is_a_masked_lm_and_its_backbone_a_base_model(transformers: Any) -> None:
    mlm = source(*TINY_BERT)
    assert (mlm.task, mlm.loss, mlm.target.shape) == ("masked_lm", "cross_entropy", (16,))
    base = source(*TINY_BERT, "model.task=base")
    assert (base.task, base.loss, base.target.shape, base.target.dtype) == ("base", "mse", (16, 32), "float32")
    assert base.op_graph(batch_probe=False).num_nodes > 10


def test_caches_are_off_and_the_context_length_is_the_default_seq_len(transformers: Any) -> None:
    src = source("model=hf", "model.arch=gpt2", "+model.config.n_positions=24")
    assert src.config.use_cache is False and src.seq_len == 24
    assert source("model=hf", "++model.config.use_cache=true").config.use_cache is True


# ---------------------------------------------------------------------------- one-line errors
def test_a_misspelt_key_is_one_line_naming_it(transformers: Any, tmp_path: Path) -> None:
    r = run_harness(*TINY_GPT2, "+model.config.n_layerz=2", "algo=single_device", *QUIET, f"hydra.run.dir={tmp_path}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "error: model.config.n_layerz is not a key of the gpt2 config (GPT2Config): did you mean model.config.n_layer?"]
    refused(lambda: source(*TINY_GPT2, "+model.batchsize=3"), "model.batchsize", "did you mean model.batch_size", kind=ModelConfigError)
    refused(lambda: source("model=hf", "model.arch=gtp2"), "model.arch=gtp2", "did you mean model.arch=gpt2", kind=ModelConfigError)
    refused(lambda: source(*TINY_GPT2, "model.task=masked_lm"), "model.task=masked_lm", "causal_lm", kind=ModelConfigError)
    refused(lambda: source(*TINY_GPT2, "model.seq_len=2000"), "model.seq_len=2000", "++model.config.n_positions",
            kind=ModelConfigError)
    refused(lambda: source(*TINY_GPT2, "model.config.n_layer=abc"), "model.config", "n_layer", kind=ModelConfigError)
    assert source(*TINY_GPT2, "++model.config.attn_implementation=eager").config._attn_implementation == "eager"


def test_without_transformers_model_hf_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    msg = str(refused(lambda: source(*TINY_GPT2), "transformers", "pip install -e '.[hf]'", kind=hf.TransformersMissing))
    assert msg.startswith("model=hf needs")


def test_without_transformers_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "transformers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named transformers')\n")
    r = run_harness(*TINY_GPT2, "algo=single_device", *QUIET, f"hydra.run.dir={tmp_path / 'job'}",
                    env={"PYTHONPATH": f"{shim.parent}{os.pathsep}{REPO}"})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model=hf needs") and "pip install -e '.[hf]'" in lines[0], r.stderr


def test_a_trace_failure_names_the_model_and_the_usual_fixes(transformers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fixes = ("++model.config.use_cache=false", "++model.config.attn_implementation=eager", "model.seq_len=N",
             "++model.config.output_attentions=false", "++model.config.output_hidden_states=false")
    # a cache (the step concatenates onto a tensor that is no fake one)
    msg = str(refused(lambda: source(*TINY_GPT2, "++model.config.use_cache=true").op_graph(batch_probe=False),
                      "model 'gpt2' (transformers gpt2)", "could not be captured", "this config turns the cache on", *fixes,
                      kind=CaptureError))
    assert len(msg) < 1500
    # data-dependent control flow (a branch on a tensor's value), in either graph
    def branchy(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
        out = getattr(self.hf(input_ids=input_ids), self.output)
        return out if bool(input_ids.sum() > 0) else -out

    monkeypatch.setattr(hf.TokenModel, "forward", branchy)
    src = source(*TINY_GPT2, "model.name=branchy")
    refused(lambda: src.op_graph(batch_probe=False), "model 'branchy' (transformers gpt2): its operator graph", *fixes,
            kind=CaptureError)
    refused(lambda: src.layer_graph(), "model 'branchy' (transformers gpt2): its layer graph", *fixes, "operator-graph algorithm",
            kind=CaptureError)


def test_a_config_the_model_cannot_be_built_from_is_one_line(transformers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the checks let through and the model's own code refuses: one line naming the keys its
    message names, else the keys the user gave."""
    src = source(*TINY_GPT2)

    def refusing(message: str) -> Any:
        def build(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(message)
        return build

    monkeypatch.setattr(hf, "hf_module", refusing("n_inner must exceed n_embd"))
    refused(lambda: src.build(), "could not build model 'gpt2'", "AutoModelForCausalLM", "AssertionError: n_inner must exceed n_embd",
            "check model.config.n_inner=None, model.config.n_embd=32", kind=CaptureError)
    monkeypatch.setattr(hf, "hf_module", refusing("Padding_idx must be within num_embeddings"))
    refused(lambda: src.build(), "could not build model 'gpt2'", "the values given: model.config.n_layer=1, model.config.n_embd=32",
            kind=CaptureError)


# ---------------------------------------------------------------------------- config values (issue 32)
#: a one-layer Phi-3 of the same size: its default pad_token_id (32000) lies beyond this vocabulary
TINY_PHI3 = ["model=hf", "model.arch=phi3", "+model.config.num_hidden_layers=1", "+model.config.hidden_size=32",
             "+model.config.num_attention_heads=2", "+model.config.intermediate_size=64", "+model.config.vocab_size=100",
             "model.seq_len=16", "model.batch_size=4"]
#: a one-layer Llama: 4 query heads over 2 key/value heads
TINY_LLAMA = ["model=hf", "model.arch=llama", "+model.config.num_hidden_layers=1", "+model.config.hidden_size=32",
              "+model.config.num_attention_heads=4", "+model.config.num_key_value_heads=2", "+model.config.intermediate_size=64",
              "+model.config.vocab_size=100", "model.seq_len=16", "model.batch_size=4"]


@pytest.mark.parametrize("overrides,fragments", [
    ((*TINY_GPT2, "model.config.n_head=-1"), ("model.config.n_head must be a positive integer, got -1",)),
    ((*TINY_GPT2, "model.config.vocab_size=0"), ("model.config.vocab_size must be a positive integer, got 0",)),
    ((*TINY_BERT, "model.config.num_hidden_layers=0"), ("model.config.num_hidden_layers must be a positive integer, got 0",)),
    ((*TINY_GPT2, "++model.config.num_hidden_layers=-2"), ("model.config.num_hidden_layers must be a positive integer, got -2",)),
    ((*TINY_GPT2, "model.config.n_embd=33"), ("model.config.n_embd=33 is not divisible by model.config.n_head=2",)),
    ((*TINY_LLAMA, "model.config.num_key_value_heads=3"),
     ("model.config.num_attention_heads=4 is not a multiple of model.config.num_key_value_heads=3",)),
    ((*TINY_BERT, "model.config.num_attention_heads=3"),
     ("model.config.hidden_size=32 is not divisible by model.config.num_attention_heads=3",)),
    (TINY_PHI3, ("model.config.pad_token_id=32000 (the phi3 default) is not a token of the vocabulary (model.config.vocab_size=100)",
                 "set ++model.config.pad_token_id to an id below 100")),
    ((*TINY_BERT, "++model.config.pad_token_id=100"), ("model.config.pad_token_id=100 is not a token of the vocabulary",)),
])
def test_a_value_the_model_cannot_run_with_names_its_key(transformers: Any, overrides: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    """Refused when the source is built, before anything is traced: the message names
    ``model.config.<key>`` as the user spelt it (GPT-2's ``n_head``, not ``num_attention_heads``)."""
    refused(lambda: source(*overrides), *fragments, kind=ModelConfigError)


def test_the_values_the_checks_pass_capture(transformers: Any) -> None:
    """The checks refuse nothing that runs: grouped-query attention, a pad id set into a shrunken
    vocabulary, a head size of its own (T5's ``d_kv``, not d_model / heads)."""
    assert source(*TINY_LLAMA).op_graph(batch_probe=False).num_nodes > 10
    assert source(*TINY_PHI3, "++model.config.pad_token_id=0").op_graph(batch_probe=False).num_nodes > 10
    assert source(*TINY_T5, "model.config.num_heads=3", "model.config.d_kv=24").config.d_kv == 24


def test_a_bad_value_on_the_command_line_is_one_line(transformers: Any, tmp_path: Path) -> None:
    r = run_harness(*TINY_GPT2, "model.config.n_head=-1", "algo=single_device", *QUIET, f"hydra.run.dir={tmp_path}")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: model.config.n_head must be a positive integer, got -1"]
    assert not (tmp_path / "result.json").exists()


# ---------------------------------------------------------------------------- encoder-decoders and layer graphs (issue 32)
#: a one-layer T5 (its base model: T5Model, which reads decoder inputs)
TINY_T5 = ["model=hf", "model.arch=t5", "+model.config.num_layers=1", "+model.config.d_model=32", "+model.config.num_heads=2",
           "+model.config.d_kv=16", "+model.config.d_ff=64", "+model.config.vocab_size=100", "model.seq_len=16", "model.batch_size=4"]
#: a one-layer BART (its masked-LM head: BartForConditionalGeneration)
TINY_BART = ["model=hf", "model.arch=bart", "+model.config.encoder_layers=1", "+model.config.decoder_layers=1", "+model.config.d_model=32",
             "+model.config.encoder_attention_heads=2", "+model.config.decoder_attention_heads=2", "+model.config.encoder_ffn_dim=64",
             "+model.config.decoder_ffn_dim=64", "+model.config.vocab_size=100", "model.seq_len=16", "model.batch_size=4"]
#: a one-layer RoBERTa (its LM head calls a module-level GELU module)
TINY_ROBERTA = ["model=hf", "model.arch=roberta", *TINY_BERT[2:]]


def decoder_inputs(src: Any, ids: torch.Tensor) -> torch.Tensor | None:
    """The decoder_input_ids the built model of ``src`` hands its transformers model for ``ids``."""
    model = src.build()
    seen: dict[str, Any] = {}
    model.hf.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    model.eval()
    with torch.no_grad():
        model(ids)
    return seen.get("decoder_input_ids")


@pytest.mark.parametrize("case,start", [(TINY_T5, 0), (TINY_BART, 2)])
def test_an_encoder_decoder_reads_the_input_shifted_behind_its_start_token(transformers: Any, case: list[str], start: int) -> None:
    """T5 (decoder_start_token_id unset: its pad token, 0) and BART (its decoder_start_token_id, 2):
    the decoder's inputs are the input shifted right by one behind the start token; both graphs capture."""
    src = source(*case)
    ids = torch.randint(3, 100, (2, 16))
    dec = decoder_inputs(src, ids)
    assert dec is not None and dec.shape == ids.shape
    assert (dec[:, 0] == start).all() and torch.equal(dec[:, 1:], ids[:, :-1])
    assert src.op_graph(batch_probe=False).num_nodes > 10
    lg = src.layer_graph()
    has_in = np.zeros(lg.num_nodes, dtype=bool)
    has_in[lg.dst] = True
    assert lg.kinds[int(np.flatnonzero(~has_in)[0])] == "input"  # the decoder's embedding is fed from the input, not a source


def test_a_decoder_only_head_of_an_encoder_decoder_reads_the_input_alone(transformers: Any) -> None:
    assert decoder_inputs(source(*TINY_BART, "model.task=causal_lm"), torch.randint(0, 100, (2, 16))) is None


def test_an_encoder_decoder_without_a_start_token_is_one_line(transformers: Any) -> None:
    refused(lambda: source(*TINY_T5, "++model.config.pad_token_id=null"), "model.config.decoder_start_token_id",
            "encoder-decoder", "set ++model.config.decoder_start_token_id=0", kind=ModelConfigError)
    refused(lambda: source(*TINY_BART, "++model.config.decoder_start_token_id=100"), "model.config.decoder_start_token_id=100",
            "below 100", kind=ModelConfigError)


@pytest.mark.parametrize("case", [TINY_ROBERTA, TINY_BART], ids=["roberta", "bart"])
def test_layer_graph_algorithms_take_roberta_and_bart(transformers: Any, case: list[str], tmp_path: Path) -> None:
    """RoBERTa's LM head calls a GELU module it does not hold, BART is an encoder-decoder: both
    layer graphs build, and OptCNN plans on them."""
    from harness.app.run import run

    row = run(compose([*case, "algo=optcnn", *QUIET])).row
    assert row["graph_nodes"] > 10 and row["step_time_s"] >= row["lower_bound_s"] > 0
