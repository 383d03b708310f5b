"""Hugging Face ``transformers`` models as graph sources (``model=hf``, ``conf/model/hf.yaml``).

``python -m harness model=hf model.arch=gpt2 +model.config.n_layer=4`` builds the architecture
``arch`` from its config (``AutoConfig.for_model(arch, **model.config)``, then the Auto class of
the task ``.from_config``): random weights, on the ``meta`` device when captured, nothing
downloaded.  The model is then captured like a zoo model (:class:`harness.core.models.TorchModel`,
which :class:`HFModel` extends): the operator graph by :func:`harness.core.capture.capture`, the
layer graph by :mod:`harness.core.layerfx`.

* **Input**: token ids of shape ``(batch, seq_len)`` below the config's ``vocab_size``;
  ``model.seq_len`` (null: the config's context length, ``max_position_embeddings``).
* **Task and loss** (``model.task``): ``causal_lm`` (``AutoModelForCausalLM``; the logits'
  cross-entropy against the next token at every position: the target is the input shifted by
  one, as a data loader makes it), ``masked_lm`` (``AutoModelForMaskedLM``; the logits'
  cross-entropy against the original token at every position) or ``base`` (``AutoModel``; the
  mean squared error of the last hidden state against a target of its shape; a pooler the loss
  would not read is left out, :func:`head_options`).  ``auto`` picks
  ``masked_lm`` for an architecture with a masked-LM head (the encoders: BERT, RoBERTa, ...),
  else ``causal_lm`` (the decoders: GPT-2, Llama, ...), else ``base``.
* **Encoder-decoders** (T5, BART, ...): the decoder reads the input shifted right behind the
  decoder start token (:class:`TokenModel`, :func:`decoder_start`).
* **Capture settings**: the KV cache is off (``use_cache=False`` unless ``model.config`` says
  otherwise: a cache is state the trace cannot follow).  The model runs in training mode
  (dropout included), with the attention implementation transformers picks for the config
  (``++model.config.attn_implementation=eager`` asks for the explicit matmul-softmax-matmul).
* **Checks** (when the source is built, before anything is traced): an unknown model key, an
  architecture transformers does not know, a key under ``model.config`` the architecture's config
  does not have (``model.config.n_layerz``), a task the architecture has no head for and a
  ``seq_len`` beyond the context length are each one line naming the key; so are values the model
  could be built from but not run (:func:`check_config_values`: a size that is not a positive
  integer, heads that do not divide, a ``pad_token_id`` outside the vocabulary).  Without
  ``transformers`` installed, ``model=hf`` says how to install it (``pip install -e '.[hf]'``).
  A model that builds but cannot be traced is one line naming it, the cause and the usual fixes.

Transformers' own warnings about the config (e.g. a ``bos_token_id`` beyond a shrunken
vocabulary, which no training step reads) are silenced while the config and the model are built.
"""

from __future__ import annotations

import contextlib
import inspect
import logging as std_logging
import re
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from harness.core.capture import CaptureError
from harness.core.checks import did_you_mean, positive_int
from harness.core.errors import UserError
from harness.core.layergraph import LayerGraphError
from harness.core.llm.hf_spec import spec_from_hf
from harness.core.llm.stack import StackGraph, transformer_stack
from harness.core.models import ModelConfigError, TorchModel

#: the tasks ``model.task`` takes: the Auto class that builds the model and what its forward returns
TASKS: dict[str, tuple[str, str]] = {
    "causal_lm": ("AutoModelForCausalLM", "logits"),
    "masked_lm": ("AutoModelForMaskedLM", "logits"),
    "base": ("AutoModel", "last_hidden_state"),
}
#: the mapping of architectures (model types) to model classes transformers keeps for each task
TASK_MAPPINGS: dict[str, str] = {
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "base": "MODEL_MAPPING_NAMES",
}
#: the order ``task=auto`` tries them in
AUTO_ORDER = ("masked_lm", "causal_lm", "base")
#: config keys every architecture takes that a config object does not expose under that name
GENERIC_CONFIG_KEYS = frozenset({"attn_implementation", "experts_implementation"})
#: the config defaults a capture needs (a user's ``model.config`` overrides them)
CAPTURE_DEFAULTS: dict[str, Any] = {"use_cache": False}
#: how to install the optional dependency
INSTALL_HINT = "pip install -e '.[hf]'"
#: the logger PyTorch reports an op that fails on fake tensors to
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
#: the longest excerpt of an underlying error quoted in a one-line message
EXCERPT_CHARS = 240
#: the sizes a config may hold (canonical names; an architecture's own spelling through its
#: ``attribute_map``): where the config has one as a number, it must be a positive integer
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
             "head_dim", "d_ff", "num_decoder_layers", "encoder_layers", "decoder_layers", "encoder_attention_heads",
             "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "embedding_size")
#: attention-head counts whose heads split the hidden size (unless the config sets a head size of its own)
HEAD_KEYS = ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads")
#: the oldest transformers release model=hf was tested with (pyproject.toml's ``hf`` extra): 5.0 to 5.3
#: capture GPT-2 but not Llama or GPT-NeoX (rotary embeddings under autocast on the meta device)
MIN_VERSION = (5, 4)


class TransformersMissing(UserError, ImportError):
    """``model=hf`` was asked for and the ``transformers`` package cannot be imported."""


class HFBuildError(CaptureError):
    """A Hugging Face model could not be built from its config; the message names the model."""


def one_line(text: Any, limit: int | None = None) -> str:
    """``text`` with its whitespace runs folded into single spaces, cut to ``limit`` characters."""
    out = " ".join(str(text).split())
    return out if limit is None or len(out) <= limit else out[:limit - 3] + "..."


def transformers_module() -> Any:
    """The ``transformers`` package, or :class:`TransformersMissing` saying how to install it."""
    try:
        import transformers
    except ImportError as e:
        raise TransformersMissing(f"model=hf needs the Hugging Face transformers package, which cannot be imported "
                                  f"({one_line(e, EXCERPT_CHARS)}): install it with {INSTALL_HINT}") from e
    return transformers


def release(version: str) -> tuple[int, ...]:
    """The (major, minor) of a version string: ``"5.23.0"`` -> ``(5, 23)``."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Transformers' logger at ERROR inside the block (its config warnings are not the user's concern here)."""
    logging = transformers_module().utils.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@contextlib.contextmanager
def quiet_fake_tensors() -> Iterator[None]:
    """PyTorch's fake-tensor logger off inside the block: it logs the traceback of an op that
    fails on fake tensors, which a trace failure then reports in one line (with ``debug=true``,
    the traceback)."""
    logger = std_logging.getLogger(FAKE_TENSOR_LOGGER)
    level = logger.level
    logger.setLevel(std_logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def architectures(task: str = "base") -> list[str]:
    """The architectures (model types) transformers has a model class for ``task``."""
    from transformers.models.auto import modeling_auto

    return sorted(getattr(modeling_auto, TASK_MAPPINGS[task]))


def tasks_of(arch: str) -> list[str]:
    """The tasks of :data:`TASKS` that ``arch`` has a model class for, in :data:`AUTO_ORDER`."""
    return [t for t in AUTO_ORDER if arch in architectures(t)]


def default_config(arch: str) -> Any:
    """The default config of architecture ``arch``, or a ModelConfigError naming ``model.arch``."""
    transformers = transformers_module()
    known = sorted(transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)
    if arch not in known:
        raise ModelConfigError(f"model.arch={arch} is not an architecture of transformers {transformers.__version__}: "
                               f"{did_you_mean(arch, known, 'model.arch=')}"
                               "give a model type such as gpt2, llama, gpt_neox or bert")
    with quiet_transformers():
        return transformers.AutoConfig.for_model(arch)


def config_keys(config: Any) -> list[str]:
    """The keys a config of ``config``'s class takes: its constructor's parameters, its attributes
    (aliases such as ``hidden_size`` for GPT-2's ``n_embd`` included) and :data:`GENERIC_CONFIG_KEYS`."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [n for n, p in inspect.signature(type(config).__init__).parameters.items() if n != "self" and p.kind in kinds]
    attrs = [k for k in config.to_dict() if not k.startswith("_")]
    aliases = list(getattr(config, "attribute_map", {}) or {})
    return sorted({*params, *attrs, *aliases, *GENERIC_CONFIG_KEYS})


def check_config_keys(arch: str, config: Any, keys: list[str]) -> None:
    """Refuse the first of ``keys`` that a config like ``config`` does not take, naming ``model.config.<key>``."""
    known = set(config_keys(config))
    for key in keys:
        if key in known or (not key.startswith("_") and hasattr(config, key) and not callable(getattr(config, key))):
            continue
        hint = did_you_mean(key, sorted(known), "model.config.") or "fix the name or remove the key"
        raise ModelConfigError(f"model.config.{key} is not a key of the {arch} config ({type(config).__name__}): {hint.strip()}")


def attribute_name(config: Any, key: str) -> str:
    """The attribute of ``config`` that holds ``key`` (GPT-2's ``n_head`` for ``num_attention_heads``)."""
    return (getattr(config, "attribute_map", None) or {}).get(key, key)


def typed_key(config: Any, attribute: str, overrides: Mapping[str, Any]) -> str:
    """``model.config.<key>`` for a config attribute, spelt as the user gave it (an alias or the
    attribute itself; of two that both set it, the one whose value it holds), else as the attribute."""
    given = sorted((k for k in overrides if attribute_name(config, k) == attribute),
                   key=lambda k: overrides[k] != getattr(config, attribute, None))
    return f"model.config.{given[0] if given else attribute}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config_values(arch: str, config: Any, overrides: Mapping[str, Any]) -> None:
    """Refuse, naming ``model.config.<key>``, what the model could be built from but not run:
    a size of :data:`SIZE_KEYS` that is not a positive integer (``n_head=-1``, ``vocab_size=0``),
    query heads that the key/value heads do not divide, a hidden size the heads do not divide
    (unless the config sets a head size of its own, as T5's ``d_kv``), and a ``pad_token_id`` (the
    embedding's padding index) outside the vocabulary."""
    attrs = list(dict.fromkeys(attribute_name(config, k) for k in SIZE_KEYS))
    for attr in attrs:
        value = getattr(config, attr, None)
        user = any(attribute_name(config, k) == attr for k in overrides)
        if value is None or (not _is_int(value) and not user):  # a list of per-layer sizes by default, say
            continue
        if not _is_int(value) or value < 1:
            raise ModelConfigError(f"{typed_key(config, attr, overrides)} must be a positive integer, got {value!r}")

    def value_of(key: str) -> tuple[int | None, str]:
        attr = attribute_name(config, key)
        value = getattr(config, attr, None)
        return (value if _is_int(value) else None), typed_key(config, attr, overrides)

    heads, heads_key = value_of("num_attention_heads")
    kv, kv_key = value_of("num_key_value_heads")
    if heads and kv and heads % kv:
        raise ModelConfigError(f"{heads_key}={heads} is not a multiple of {kv_key}={kv}: every key/value head serves the same "
                               f"number of query heads; make {heads_key} a multiple of {kv_key}")
    hidden, hidden_key = value_of("hidden_size")
    for key in dict.fromkeys(attribute_name(config, k) for k in HEAD_KEYS):
        n, n_key = value_of(key)
        head_dim = getattr(config, attribute_name(config, "head_dim"), None)
        own_size = _is_int(head_dim) and n and hidden and head_dim != hidden // n  # T5's d_kv: not hidden / heads
        if hidden and n and hidden % n and not own_size:
            raise ModelConfigError(f"{hidden_key}={hidden} is not divisible by {n_key}={n}: the heads split the hidden size; "
                                   f"make {hidden_key} a multiple of {n_key}")
    vocab, vocab_key = value_of("vocab_size")
    pad, pad_key = value_of("pad_token_id")
    if vocab and pad is not None and not -vocab <= pad < vocab:
        given = "" if any(attribute_name(config, k) == "pad_token_id" for k in overrides) else f" (the {arch} default)"
        raise ModelConfigError(f"{pad_key}={pad}{given} is not a token of the vocabulary ({vocab_key}={vocab}): it is the "
                               f"embedding's padding index; set ++model.config.pad_token_id to an id below {vocab}")


def context_length(config: Any) -> tuple[int | None, str]:
    """The config's context length (``max_position_embeddings``, None if it has none or no limit) and the key
    that sets it as the user types it (GPT-2's ``attribute_map`` names it ``n_positions``)."""
    key = "max_position_embeddings"
    value = getattr(config, key, None)
    shown = (getattr(config, "attribute_map", None) or {}).get(key, key)
    known = isinstance(value, int) and not isinstance(value, bool) and value >= 1  # XLNet: -1, no limit
    return (value if known else None), shown


def hf_module(arch: str, config: Mapping[str, Any] | None = None, task: str = "causal_lm") -> TokenModel:
    """A fresh ``arch`` model for ``task`` (a key of :data:`TASKS`) with random weights, built from
    ``AutoConfig.for_model(arch, **config)`` (with :data:`CAPTURE_DEFAULTS` under it) and wrapped
    so that its forward takes token ids and returns one tensor (:class:`TokenModel`)."""
    transformers = transformers_module()
    auto_class, output = TASKS[task]
    with quiet_transformers():
        cfg = transformers.AutoConfig.for_model(arch, **{**CAPTURE_DEFAULTS, **dict(config or {})})
        model = getattr(transformers, auto_class).from_config(cfg, **head_options(arch, task))
    return TokenModel(model, output, decoder_start(cfg, type(model)))


def model_class(arch: str, task: str) -> Any:
    """The transformers class the Auto class of ``task`` builds for ``arch`` (None if there is none)."""
    from transformers.models.auto import modeling_auto

    name = getattr(modeling_auto, TASK_MAPPINGS[task]).get(arch)
    return getattr(transformers_module(), name, None) if isinstance(name, str) else None


def takes_argument(fn: Any, name: str) -> bool:
    """Whether ``fn``'s signature has a parameter ``name`` (False where it has no signature to read)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def head_options(arch: str, task: str) -> dict[str, Any]:
    """Keyword arguments of the model class: a ``base`` model whose class can leave out its pooler
    (BERT's ``add_pooling_layer``) does, since the loss reads the last hidden state and a pooler's
    parameters would get no gradient (which the capture refuses)."""
    if task != "base":
        return {}
    cls = model_class(arch, task)
    return {"add_pooling_layer": False} if cls is not None and takes_argument(cls.__init__, "add_pooling_layer") else {}


def decoder_start(config: Any, cls: Any) -> int | None:
    """The token an encoder-decoder model's decoder starts with, where ``cls`` (the model class)
    takes decoder inputs: the config's ``decoder_start_token_id``, else its ``pad_token_id`` (T5's
    convention); None for a model without a decoder of its own (it then reads the input alone).
    Both None: -1, which :meth:`HFModel._check_decoder_start` refuses."""
    if not getattr(config, "is_encoder_decoder", False) or cls is None or not takes_argument(cls.forward, "decoder_input_ids"):
        return None
    for key in ("decoder_start_token_id", "pad_token_id"):
        value = getattr(config, key, None)
        if _is_int(value):
            return value
    return -1


class TokenModel(nn.Module):
    """A transformers model whose forward takes token ids and returns one tensor (``output`` of its
    model output: the logits or the last hidden state); the model is its child ``hf``, so layer
    and parameter names read ``hf.<the model's own path>``.

    An encoder-decoder model (``start`` not None) gets the decoder inputs a seq2seq training step
    feeds it: the input shifted right by one behind the start token (teacher forcing on the same
    sequence, BART's denoising objective without the noise), so that the logits at position t
    predict token t."""

    def __init__(self, model: nn.Module, output: str, start: int | None = None) -> None:
        super().__init__()
        self.hf = model
        self.output = output
        self.start = start

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.start is None:
            return getattr(self.hf(input_ids=input_ids), self.output)
        first = torch.full_like(input_ids[:, :1], self.start)
        decoder_ids = torch.cat([first, input_ids[:, :-1]], dim=1)
        return getattr(self.hf(input_ids=input_ids, decoder_input_ids=decoder_ids), self.output)


#: config attributes that say an architecture routes tokens to experts (a mixture of experts)
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def trace_failure(name: str, arch: str, config: Any, err: BaseException, graph: str = "operator") -> CaptureError:
    """The one-line error for a model that builds but cannot be traced (its ``graph``: ``operator``
    or ``layer``): the model, the cause and the usual fixes."""
    cause = err.__cause__ or err
    cache_on = "this config turns the cache on: " if getattr(config, "use_cache", False) else ""
    fixes = [f"{cache_on}caches off (++model.config.use_cache=false)"]
    moe = ", MoE experts as batched matmuls (++model.config.experts_implementation=batched_mm)" \
        if any(getattr(config, k, None) for k in EXPERT_KEYS) else ""
    fixes.append(f"no data-dependent control flow: eager attention (++model.config.attn_implementation=eager){moe}, "
                 "fixed shapes (model.seq_len=N within the context length)")
    fixes.append("attention and hidden-state outputs off (++model.config.output_attentions=false "
                 "++model.config.output_hidden_states=false)")
    other = "; an operator-graph algorithm (fddps, m_sct, heft, ...) may still take it" if graph == "layer" else ""
    version = transformers_module().__version__
    if release(version) < MIN_VERSION:
        fixes.insert(0, f"transformers {version} is older than {'.'.join(map(str, MIN_VERSION))}, the oldest model=hf was "
                        f"tested with: {INSTALL_HINT} upgrades it")
    return CaptureError(
        f"model {name!r} (transformers {arch}): its {graph} graph could not be captured: {type(cause).__name__}: "
        f"{one_line(cause, EXCERPT_CHARS)}; the usual fixes: {'; '.join(fixes)}{other}; debug=true shows the traceback")


#: the keys of a ``model=hf`` config
MODEL_KEYS = ("arch", "config", "task", "seq_len", "batch_size", "name")


class HFModel(TorchModel):
    """A Hugging Face ``transformers`` architecture built from its config (see the module docstring).

    ``arch`` is a model type (``gpt2``, ``llama``, ``bert``...), ``config`` the keyword arguments of
    its config (``n_layer``, ``hidden_size``...), ``task`` one of ``auto`` and :data:`TASKS`,
    ``seq_len`` the tokens per sample (None: the config's context length)."""

    def __init__(
        self,
        arch: str,
        batch_size: int,
        config: Mapping[str, Any] | None = None,
        task: str = "auto",
        seq_len: int | None = None,
        name: str | None = None,
        **extra: Any,
    ) -> None:
        self.arch = str(arch)
        model_name = str(name or self.arch)
        if extra:
            key = sorted(str(k) for k in extra)[0]
            raise ModelConfigError(f"model.{key} is not a key of model {model_name!r}: {did_you_mean(key, MODEL_KEYS, 'model.')}HFModel takes {', '.join(MODEL_KEYS)}; "
                                   "a key of the architecture's config goes under model.config (+model.config.n_layer=4)")
        overrides = _mapping(config)
        default = default_config(self.arch)
        check_config_keys(self.arch, default, list(overrides))
        transformers = transformers_module()
        try:
            with quiet_transformers():
                self.config = transformers.AutoConfig.for_model(self.arch, **{**CAPTURE_DEFAULTS, **overrides})
        except Exception as e:  # noqa: BLE001 - a value the config class refuses
            raise ModelConfigError(f"model.config: the {self.arch} config refuses these values: {one_line(e, EXCERPT_CHARS)}") from e
        self.overrides = overrides
        vocab = getattr(self.config, "vocab_size", None)
        if vocab is None:
            raise ModelConfigError(f"model {model_name!r}: the {self.arch} config has no vocab_size, so its token inputs "
                                   "cannot be made; model=hf takes text models")
        check_config_values(self.arch, self.config, overrides)
        self.task = self._task(str(task))
        self._check_decoder_start(vocab)
        self.seq_len = self._seq_len(seq_len)
        tokens = {"shape": [self.seq_len], "dtype": "int64", "high": vocab}
        if self.task == "base":
            hidden = getattr(self.config, "hidden_size", None)
            if not isinstance(hidden, int):
                heads = [t for t in tasks_of(self.arch) if t != "base"]
                raise ModelConfigError(f"model.task=base: the {self.arch} config has no hidden_size to shape the target by"
                                       + (f"; use model.task={heads[0]}" if heads else ""))
            target, loss = {"shape": [self.seq_len, hidden], "dtype": "float32"}, "mse"
        else:
            target, loss = tokens, "cross_entropy"
        module = {"_target_": f"{__name__}.hf_module", "arch": self.arch, "task": self.task, "config": {**CAPTURE_DEFAULTS, **overrides}}
        super().__init__(name=model_name, module=module, batch_size=batch_size, inputs=[tokens], target=target, loss=loss)
        # another transformers release may trace to another graph: the version is part of the
        # graph's identity, which the graph caches key on (TorchModel keys them on module_cfg)
        self.module_cfg["transformers"] = transformers.__version__

    def _task(self, task: str) -> str:
        """``model.task`` checked against what ``arch`` has a head for; ``auto`` resolved."""
        if task != "auto" and task not in TASKS:
            raise ModelConfigError(f"model.task={task} is not a task: use auto, {', '.join(TASKS)}")
        have = tasks_of(self.arch)
        if task == "auto":
            if not have:
                raise ModelConfigError(f"model.arch={self.arch} has no causal-LM, masked-LM or base model class in transformers; "
                                       "model=hf takes text models")
            return have[0]
        if task not in have:
            raise ModelConfigError(f"model.task={task}: transformers has no {TASKS[task][0]} for {self.arch}; "
                                   f"it has {', '.join(have) or 'none of ' + ', '.join(TASKS)}")
        return task

    def _check_decoder_start(self, vocab: int) -> None:
        """An encoder-decoder model's decoder start token (:func:`decoder_start`) exists and is in the vocabulary."""
        start = decoder_start(self.config, model_class(self.arch, self.task))
        if start is None:
            return
        key = typed_key(self.config, "decoder_start_token_id", self.overrides)
        if start == -1:
            raise ModelConfigError(f"{key}: the {self.arch} model is an encoder-decoder, whose decoder reads the input shifted "
                                   "right behind a start token, and its config names none (nor a pad_token_id); set "
                                   "++model.config.decoder_start_token_id=0")
        if not 0 <= start < vocab:
            which = key if getattr(self.config, "decoder_start_token_id", None) is not None else typed_key(self.config, "pad_token_id",
                                                                                                           self.overrides)
            raise ModelConfigError(f"{which}={start} is not a token of the vocabulary (vocab_size={vocab}): the decoder of the "
                                   f"{self.arch} encoder-decoder starts with it; set ++model.config.decoder_start_token_id to an id "
                                   f"below {vocab}")

    def _seq_len(self, seq_len: Any) -> int:
        """``model.seq_len`` (None: the context length), within the context length."""
        limit, key = context_length(self.config)
        if seq_len is None:
            if limit is None:
                raise ModelConfigError(f"model.seq_len: the {self.arch} config has no context length "
                                       "(max_position_embeddings) to default to; set model.seq_len=N")
            return limit
        n = positive_int(seq_len, "model.seq_len", ModelConfigError)
        if limit is not None and n > limit:
            raise ModelConfigError(f"model.seq_len={n} exceeds the {self.arch} config's context length {limit}: "
                                   f"lower model.seq_len or raise ++model.config.{key}")
        return n

    def build(self) -> Any:
        """A fresh model (on whatever device is current), or :class:`HFBuildError` naming it."""
        try:
            return hf_module(self.arch, self.module_cfg["config"], self.task)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - a combination of values the model's code refuses
            raise HFBuildError(f"could not build model {self.name!r} ({self.arch}, {TASKS[self.task][0]}) from model.config: "
                               f"{type(e).__name__}: {one_line(e, EXCERPT_CHARS)}; {self._suspects(e)}") from e

    def _suspects(self, err: BaseException) -> str:
        """The config keys a build error may be about: those its message names, else those the user set."""
        words = list(dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(err))))
        keys = set(config_keys(self.config))
        named = [w for w in words if w in keys]
        if named:
            return "check " + ", ".join(f"model.config.{k}={getattr(self.config, k, None)!r}" for k in named)
        if self.overrides:
            return "the values given: " + ", ".join(f"model.config.{k}={v!r}" for k, v in self.overrides.items())
        return f"the {self.arch} defaults (no model.config given)"

    def op_graph(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`TorchModel.op_graph`, a trace failure reported with the usual fixes (:func:`trace_failure`)."""
        try:
            with quiet_fake_tensors():
                return super().op_graph(*args, **kwargs)
        except HFBuildError:
            raise
        except CaptureError as e:
            if e.__cause__ is None:  # a capture option refused before anything was traced
                raise
            raise trace_failure(self.name, self.arch, self.config, e) from e

    def stack_graph(self, precision: str = "fp32", cache: bool = True) -> StackGraph:
        """The decoder LM (Llama, Mistral, Qwen2, GPT-2, Mixtral) as a transformer described by its
        shape (:func:`harness.core.llm.hf_spec.spec_from_hf`): embedding, blocks and head, nothing
        traced; another architecture is one line naming those supported."""
        spec = spec_from_hf(self.arch, self.config, self.seq_len, self.name)
        return transformer_stack(spec, self.batch_size, precision, self.name, meta={"arch": self.arch, "params": spec.param_count()})

    def layer_graph(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`TorchModel.layer_graph`, a trace failure reported with the usual fixes (:func:`trace_failure`)."""
        try:
            with quiet_fake_tensors():
                return super().layer_graph(*args, **kwargs)
        except HFBuildError:
            raise
        except LayerGraphError as e:
            raise trace_failure(self.name, self.arch, self.config, e, graph="layer") from e


def _mapping(config: Any) -> dict[str, Any]:
    """``model.config`` as a plain dict (None: empty), or a ModelConfigError."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"model.config must be a mapping of config keys (+model.config.n_layer=4), got {config!r}")
    return {str(k): v for k, v in config.items()}
