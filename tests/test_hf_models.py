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
        "error: model.config.n_layerz is not a key of the gpt2 config (GPT2Config): did you mean n_layer?"]
    refused(lambda: source(*TINY_GPT2, "+model.batchsize=3"), "model.batchsize", "did you mean model.batch_size", kind=ModelConfigError)
    refused(lambda: source("model=hf", "model.arch=gtp2"), "model.arch=gtp2", "did you mean gpt2", kind=ModelConfigError)
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


def test_a_config_the_model_cannot_be_built_from_is_one_line(transformers: Any) -> None:
    src = source(*TINY_GPT2, "model.config.n_embd=33")  # 33 is not divisible by 2 heads
    refused(lambda: src.op_graph(), "could not build model 'gpt2'", "AutoModelForCausalLM", "divisible", kind=CaptureError)
