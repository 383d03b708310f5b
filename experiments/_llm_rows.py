"""The published LLM training runs (``harness/data/llm/published_llm_training.csv``) as harness jobs.

Every row becomes a :class:`RowJob`: the ``python -m harness`` overrides that run its configuration
(the model's shape, the cluster, the parallel plan, the precision, the global batch and sequence),
what is assumed where the row is blank or where the harness runs the step otherwise than the
published framework did (``assumptions``, one sentence each), and the figure the row publishes
(:class:`Published`).  A row the harness cannot express yet keeps its overrides and says why in
``reason``: it is listed with the reason, never dropped.

What each source's framework did, where the row leaves it blank, comes from that framework's own
scripts and defaults at the version the source names (cited at each table below): nothing here is
fitted to the published figures.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from harness.core.llm.plan import padded_vocab
from harness.core.llm.schedules import INTERLEAVED
from harness.core.precision import PRECISIONS

#: the published rows (a copy of the project's shared data, harness/data/llm/README.md)
PUBLISHED = Path(__file__).resolve().parents[1] / "harness" / "data" / "llm" / "published_llm_training.csv"
#: BigScience's one-node runs at BLOOM's width (not in the shared data set; harness/data/llm/README.md)
SINGLE_NODE = PUBLISHED.parent / "bloom_single_node.csv"

#: what a row publishes, in the order a comparison prefers them: the iteration time when given, else
#: tokens/s per GPU, else a FLOP rate in the row's own convention (TFLOP/s per GPU, MFU, HFU)
FIGURES: tuple[tuple[str, str], ...] = (("iter_time_s", "iter_time"), ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
                                        ("tflops_per_gpu", "tflops_per_gpu"), ("mfu_pct", "mfu"), ("hfu_pct", "hfu"))

#: flags every job of the experiment sets: no trace, Gantt chart or worth references (seconds saved per row)
QUIET = ("output.gantt=false", "output.trace=false", "output.worth=false")

#: NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (the SC'21 paper's script for its Table 1), by
#: (layers, hidden): micro-batch size, --num-layers-per-virtual-pipeline-stage (0: none, plain 1F1B)
#: and --DDP-impl (torch: PyTorch DDP, its bucketed all-reduce overlapped with the backward; local:
#: Megatron's own, one all-reduce after the backward); examples/sc21/CONFIG.sh adds --fp16
SC21_SCRIPT: dict[tuple[int, int], tuple[int, int, str]] = {
    (24, 2304): (16, 0, "torch"), (30, 3072): (16, 0, "torch"), (36, 4096): (16, 0, "torch"), (40, 6144): (8, 0, "torch"),
    (48, 8192): (4, 0, "local"), (60, 10240): (2, 5, "local"), (80, 12288): (2, 5, "local"), (96, 16384): (1, 3, "local"),
    (105, 20480): (1, 1, "local"), (128, 25600): (1, 0, "local"),
}

#: MPT's shapes at the time of llm-foundry's benchmark table (mosaicml/llm-foundry@8c8dd48
#: scripts/train/yamls/pretrain/mpt-*.yaml: d_model, n_layers, n_heads; vocab_size 50368, expansion_ratio 4)
#: with MPTConfig's defaults of then (learned positions, biases, LayerNorm with bias, tied embeddings):
#: the parameter counts this gives are the table's NumParams exactly (64,862,437,376 for 70b)
MPT_SHAPES: dict[str, tuple[int, int, int]] = {"7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64)}
MPT_ARCH = ("model.position=learned", "model.norm=layernorm", "model.linear_bias=true", "model.tied_embeddings=true",
            "model.gated_mlp=false", "model.dropout=false", "model.vocab=50368")

#: the attention kernel the benchmark ran (attn_impl: triton, the default of scripts/train/benchmarking/submit_benchmarks.py
#: and of the MPT yamls when the tables were added, mosaicml/llm-foundry@b2a43a1): on an A100 simulated as that kernel
#: (its rate measured beside FlashAttention-2), on an H100, where nobody timed it, as FlashAttention-2
MPT_ATTENTION_SOURCE = ("llm-foundry's Triton FlashAttention (attn_impl: triton, the default of "
                        "scripts/train/benchmarking/submit_benchmarks.py and of the MPT yamls when the tables were added, "
                        "mosaicml/llm-foundry@b2a43a1)")
MPT_ATTENTION = {True: f"attention: {MPT_ATTENTION_SOURCE}, model.attention=flash_triton: FlashAttention's benchmark timed that "
                       "kernel forward + backward on an A100 at 0.42-0.52 of FlashAttention-2's rate (a100_h100/attention.csv)",
                 False: f"attention: {MPT_ATTENTION_SOURCE} simulated as FlashAttention-2: that kernel was not timed on an H100 (on "
                        "an A100 it ran at 0.42-0.52 of FlashAttention-2's rate); attention is 2-4 % of these steps' FLOPs"}

#: torchtitan's train_configs (pytorch/torchtitan@9dec370 and @820504e, llama3_*.toml): seq_len 8192
TORCHTITAN_SEQ = 8192
#: FP8 recipes a row may name and the precision that runs each (None: not in the harness yet)
FP8_PRECISION = "amp_fp8"


@dataclass(frozen=True)
class Published:
    """The figure a row publishes: ``kind`` (``iter_time``, ``tokens_per_s_per_gpu``,
    ``tflops_per_gpu``, ``mfu``, ``hfu``), its value (MFU and HFU as fractions) and the row's FLOP
    convention (``flops_convention``, as written)."""

    kind: str
    value: float
    convention: str = ""


@dataclass(frozen=True)
class RowJob:
    """One published row as a harness job (see the module docstring)."""

    row_id: str
    group: str
    model: str
    overrides: tuple[str, ...]
    reason: str
    assumptions: tuple[str, ...]
    gpus: int
    batch: int
    seq_len: int
    precision: str
    recompute: str
    pp: int
    vpp: int
    micro_batch: int
    dp: int
    schedule: str
    published: Published | None
    mem_gib: float | None
    published_oom: bool
    #: the row's own notes (``notes``: the date of a BLOOM sweep snapshot, the framework's options)
    notes: str = ""
    #: ``model.kernels`` of its job (fused, eager, compiled or compiled_blocks)
    kernels: str = "fused"
    #: whether ``mem_gib`` counts the CUDA context and NCCL (nvidia-smi's figure: :func:`counts_runtime`)
    mem_smi: bool = False

    @property
    def expressed(self) -> bool:
        """Whether the harness can run this row (no ``reason``)."""
        return not self.reason

    @property
    def micro_batches(self) -> int:
        """``m = batch / (dp * micro_batch)``, the micro-batches a pipeline runs per step."""
        return max(self.batch // max(self.dp * self.micro_batch, 1), 1)


def load_rows(path: Path = PUBLISHED) -> list[dict[str, str]]:
    """The published rows as read (every cell a string)."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def lead_int(cell: str) -> int | None:
    """The integer a cell starts with (``"8192 (default; not stated)"`` -> 8192), None when it starts with none."""
    m = re.match(r"\s*(?:local batch\s*)?(\d+)(?![\d.]*k)", cell or "")
    return int(m.group(1)) if m else None


def annotated(cell: str) -> bool:
    """Whether a cell says more than its number (a default, an inference: an assumption to state)."""
    return bool(cell) and not re.fullmatch(r"\s*\d+(\.\d+)?\s*", cell)


def memory_gib(cell: str) -> tuple[float | None, bool]:
    """(published memory per GPU in GiB or None, whether the row published an out-of-memory).  A
    ``GiB`` figure is torch's (torchtitan logs the allocator's peak reserved bytes / 2^30); BLOOM's
    ``GB`` figures were read off nvidia-smi, which prints MiB, and are taken as GiB (see the README)."""
    if (cell or "").strip().upper() == "OOM":
        return None, True
    m = re.match(r"\s*([\d.]+)\s*Gi?B", cell or "")
    return (float(m.group(1)) if m else None), False


def counts_runtime(cell: str) -> bool:
    """Whether a published memory figure counts what the CUDA context and NCCL hold beside the
    tensors: nvidia-smi's (BLOOM's ``GB``) does, and so does an out-of-memory (the whole device ran
    out); torch's allocator figures (``GiB``) do not."""
    return bool(re.match(r"\s*[\d.]+\s*GB", cell or "")) or (cell or "").strip().upper() == "OOM"


def published_figure(row: Mapping[str, str]) -> Published | None:
    """The figure a row publishes, in :data:`FIGURES`' order of preference."""
    for col, kind in FIGURES:
        try:
            v = float(row.get(col) or "nan")
        except ValueError:
            continue
        if math.isfinite(v) and v > 0:
            return Published(kind, v / 100 if kind in ("mfu", "hfu") else v, row.get("flops_convention", ""))
    return None


def precision_of(label: str) -> tuple[str, str]:
    """(harness precision, reason when the harness has none for it) of a row's precision label."""
    low = label.lower()
    if "rowwise" in low:
        return FP8_PRECISION, ("FP8 with row-wise scaling (torchao's rowwise recipe: a scale per row, another scaled GEMM) is not "
                               "modelled: the harness's FP8 is Transformer Engine's per-tensor recipe")
    if "fp8" in low:
        if FP8_PRECISION not in PRECISIONS:
            return FP8_PRECISION, f"FP8 linears need precision={FP8_PRECISION}, which this harness does not have yet"
        return FP8_PRECISION, ""
    first = low.split()[0] if low.split() else ""
    return ("amp_bf16" if first == "bf16" else "amp_fp16"), ""  # fp16, "mixed", "mixed (... float16)", "mixed fp16/bf16"


@dataclass
class _Draft:
    """A row's job being built: the parts each group fills in."""

    row: Mapping[str, str]
    base: str
    cluster: str
    algo: list[str]
    precision: str
    recompute: str
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    micro_batch: int = 1
    batch: int = 0
    seq_len: int = 2048
    schedule: str = "1f1b"
    shape: tuple[str, ...] = ()
    reason: str = ""
    kernels: str = "fused"   # model.kernels: how the framework runs the memory-bound steps

    def __post_init__(self) -> None:
        self.notes: list[str] = []


def _shape(row: Mapping[str, str], d: _Draft, vocab: int | None = None) -> tuple[str, ...]:
    """The model-shape overrides of a row (layers, hidden, heads, KV heads, FFN, sequence, vocabulary, batch)."""
    h, heads = lead_int(row["hidden"]), lead_int(row["heads"])
    kv = lead_int(row["kv_heads"]) or heads
    ffn = lead_int(row["ffn_hidden"]) or 4 * (h or 0)
    v = vocab if vocab is not None else lead_int(row["vocab"])
    return (f"model.layers={lead_int(row['layers'])}", f"model.hidden={h}", f"model.heads={heads}", f"model.kv_heads={kv}",
            f"model.ffn_hidden={ffn}", f"model.seq_len={d.seq_len}", f"model.vocab={v}", f"model.batch_size={d.batch}")


#: what a Megatron-LM row's pipeline sends do (megatron/p2p_communication.py of 2021 and 2022)
MEGATRON_SENDS = ("Megatron-LM waits for each batch_isend_irecv and then calls torch.cuda.synchronize() (p2p_communication.py, "
                  "'to protect against race condition'): each send holds its stage until delivered: algo.blocking_sends=true")


def _megatron_sc21(row: Mapping[str, str]) -> _Draft:
    layers, h = lead_int(row["layers"]) or 0, lead_int(row["hidden"]) or 0
    d = _Draft(row, "gpt3_175b", "superpod_a100", [], "amp_fp16", "full")
    d.tp, d.pp, d.dp, d.batch = int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["global_batch_seqs"])
    if (layers, h) not in SC21_SCRIPT:
        d.reason = "no Table 1 entry of Megatron-LM's examples/sc21/run_table_1.sh has this shape (its micro-batch is unknown)"
        return d
    d.micro_batch, per_chunk, ddp = SC21_SCRIPT[(layers, h)]
    d.vpp = layers // (d.pp * per_chunk) if per_chunk else 1
    d.schedule = "interleaved" if d.vpp > 1 else "1f1b"
    d.algo = ["algo=megatron", "algo.zero=0", f"algo.overlap_grad_reduce={'true' if ddp == 'torch' else 'false'}",
              "algo.grad_accumulation=autograd", "algo.blocking_sends=true"]
    d.notes.append(f"micro-batch {d.micro_batch}, {'interleaved 1F1B with ' + str(d.vpp) + ' chunks per stage' if d.vpp > 1 else '1F1B'} "
                   f"and --DDP-impl {ddp} from Megatron-LM examples/sc21/run_table_1.sh (the row leaves them blank); --fp16 (CONFIG.sh)")
    d.notes.append("the FP16 gradients of micro-batches after the first added into param.grad by PyTorch's AccumulateGrad, a pass of "
                   "their own: Megatron-LM of spring 2021 had no contiguous gradient buffer (default from 2021-08-18) and no "
                   "gradient-accumulation fusion (2022): algo.grad_accumulation=autograd")
    if d.pp > 1:
        d.notes.append(MEGATRON_SENDS)
    return d


def _korthikanti(row: Mapping[str, str]) -> _Draft:
    d = _Draft(row, "gpt3_175b", "superpod_a100", ["algo=megatron", "algo.zero=0", "algo.overlap_grad_reduce=false"], "amp_fp16",
               "selective" if row["recompute"].startswith("selective") else "full")
    d.tp, d.pp, d.dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    d.micro_batch = lead_int(row["micro_batch"]) or 1
    d.vpp = lead_int(row["vpp"]) or 1
    d.batch = lead_int(row["global_batch_seqs"]) or 0
    if not row["global_batch_seqs"]:  # the abstract's 2240-GPU runs: Table 3's 530B configuration on 8 replicas
        d.vpp, d.batch = 3, 280 * d.dp
        d.notes.append(f"global batch {d.batch}, micro-batch 1 and 3 interleaved chunks per stage: Table 3's 530B configuration "
                       f"(batch 280, micro-batch 1, v = 3) on the row's {d.dp} data-parallel replicas (the abstract gives neither)")
    d.schedule = "interleaved" if d.vpp > 1 else "1f1b"
    sp = row["seq_parallel"].strip().lower() == "yes"
    d.algo.append(f"algo.sequence_parallel={'true' if sp else 'false'}")
    d.notes.append("Megatron-LM's local DDP of 2022 (one gradient all-reduce after the backward), fp16 (Calculon encodes it)")
    d.algo += ["algo.grad_accumulation=hook", "algo.blocking_sends=true"]
    if d.pp > 1:
        d.notes.append(MEGATRON_SENDS)
    d.notes.append("each micro-batch's FP16 gradients added into the FP16 main_grad buffer by the local DDP's hook, a pass of their own: "
                   "Megatron-LM turned gradient-accumulation fusion off without FP32 accumulation until 2022-09-27 (arguments.py): "
                   "algo.grad_accumulation=hook")
    return d


def torchtitan_stages(layers: int, pp: int, per_rank: int) -> list[int]:
    """Units (embedding, blocks, head) per virtual stage as torchtitan splits a model without
    ``pipeline_parallel_split_points`` (pytorch/torchtitan@9dec370 torchtitan/parallelisms/pipelining_utils.py
    ``generate_split_points``): ``layers // stages`` blocks on the first and last stage, one more on
    each middle stage while the remainder lasts; the embedding rides the first, norm and output the last."""
    stages = pp * per_rank
    base, extra = divmod(layers, stages)
    counts = [base]
    for _ in range(1, stages - 1):
        counts.append(base + (1 if extra > 0 else 0))
        extra -= 1 if extra > 0 else 0
    counts.append(layers - sum(counts))
    counts[0] += 1
    counts[-1] += 1
    return counts


def _torchtitan(row: Mapping[str, str]) -> _Draft:
    h200 = "H200" in row["gpu"]
    precision, why = precision_of(row["precision"])
    rc = row["recompute"].lower()
    d = _Draft(row, "llama3_8b", "whitefiber_h200" if h200 else "torchtitan_h100", [], precision, "full" if "full" in rc else "op")
    d.reason = why
    d.tp, d.pp, d.dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    cp = lead_int(row["cp"]) or 1
    local = lead_int(row["micro_batch"]) or 1
    d.seq_len = lead_int(row["seq_len"]) or TORCHTITAN_SEQ
    if not row["seq_len"] or annotated(row["seq_len"]):
        d.notes.append(f"sequence {d.seq_len}: torchtitan's llama3 train_configs at the page's commit (the table does not say)")
    d.batch = local * d.dp
    if not row["global_batch_seqs"]:
        d.notes.append(f"global batch {d.batch}: the local batch {local} on each of the {d.dp} data-parallel (FSDP) ranks")
    if d.recompute == "op":
        d.notes.append("torchtitan's selective AC is its per-op policy (llama3 train_configs: selective_ac_option 'op'), "
                       "simulated as algo.recompute=op: it keeps attention's output and every other matmul's and recomputes "
                       "the rest (of Llama 3 8B's seven projections k, o and w3, about 37 % of a block's forward matmul FLOPs, "
                       "and the norms, RoPE and SwiGLU)")
    if d.pp == 1:
        d.micro_batch = local
        d.algo = ["algo=fsdp", f"algo.tp={d.tp}", f"algo.cp={cp}", f"algo.micro_batch={local}",
                  f"algo.sequence_parallel={'true' if d.tp > 1 else 'false'}"]
    else:
        interleaved = "interleaved" in row["pp_schedule"].lower()
        d.vpp = 2 if interleaved else 1
        d.micro_batch = max(local // d.pp, 1)
        d.schedule = "interleaved_torch" if interleaved else "1f1b"
        layers = lead_int(row["layers"]) or 0
        stages = torchtitan_stages(layers, d.pp, d.vpp)
        d.algo = ["algo=megatron", "algo.zero=3", "algo.gather_once=true", f"algo.tp={d.tp}", f"algo.pp={d.pp}", f"algo.dp={d.dp}", f"algo.cp={cp}",
                  f"algo.vpp={d.vpp}", f"algo.schedule={d.schedule}", f"algo.micro_batch={d.micro_batch}", "algo.sequence_parallel=true",
                  f"algo.stages=[{','.join(map(str, stages))}]"]
        d.notes.append(f"{d.pp} micro-batches of {d.micro_batch} (torchtitan's pipeline_parallel_microbatches default: the pipeline "
                       f"degree), {'2 stages per rank (its default for a looped schedule), ' if interleaved else ''}blocks split as "
                       f"its generate_split_points does; torchtitan's FSDP under PP gathers a stage's weights once and reduce-scatters "
                       "its gradients once per step (reshard_after_forward=False, and torch.distributed.pipelining keeps them "
                       "unsharded and unsynchronised until the last micro-batch): algo.gather_once=true"
                       + ("; torch.distributed.pipelining's Interleaved1F1B order, whose later stages start their backwards "
                          "before every forward has run where Megatron-LM's would not (m = pp): algo.schedule=interleaved_torch"
                          if interleaved else ""))
    notes = row["notes"].lower()
    if "per gpu" in notes and "assumed" in notes:
        d.notes.append("the page's 'tokens/sec' is taken per GPU, as torchtitan logs it (tokens per second per device)")
    if "compile" in notes or "h200" in row["locator"].lower():
        loss_eager = "202412" in row["locator"]  # the page's torchtitan of 2024 kept its loss out of torch.compile
        d.kernels = "compiled_blocks" if loss_eager else "compiled"
        d.notes.append("torch.compile fuses each block's memory-bound kernels" + (" (the page's command: --training.compile)" if
                       "compile" not in notes else "") + "; GQA's repeat_kv copy and the final norm stay eager, and " +
                       ("the FP32 loss too: torchtitan's train.py of 2024 left it out of compile (model.kernels=compiled_blocks)"
                        if loss_eager else "the loss is compiled with the model, as torchtitan's build_cross_entropy_loss of "
                        "2025 does (model.kernels=compiled)"))
    else:
        d.kernels = "eager"
        d.notes.append("no torch.compile: the Llama code as PyTorch eager runs it, FP32 RMSNorm and complex RoPE as separate "
                       "ATen kernels (model.kernels=eager)")
    if "async" in notes:
        d.notes.append("async TP (TP collectives overlapped with the matmuls) is not modelled: simulated as vanilla TP")
    if "float8 all-gather" in row["precision"].lower():
        d.notes.append("FSDP's float8 all-gather of the weights (half the bytes) is not modelled: the weights are gathered in BF16")
    if rc.startswith("default"):
        d.notes.append("activation checkpointing: the llama3_8b train_config's default (selective, per-op), the page does not say")
    return d


def _bloom(row: Mapping[str, str]) -> _Draft:
    precision, _ = precision_of(row["precision"])
    zero = 0 if "stage 0" in row["sharding"].lower() else 1
    d = _Draft(row, "bloom_176b", "jean_zay_a100", [], precision, "full")
    d.tp, d.pp, d.dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    d.micro_batch, d.batch = lead_int(row["micro_batch"]) or 1, lead_int(row["global_batch_seqs"]) or 0
    d.algo = ["algo=megatron", f"algo.zero={zero}", "algo.overlap_grad_reduce=false", "algo.overlap_param_gather=false",
              "algo.blocking_sends=true"]
    if d.pp > 1:
        d.notes.append("DeepSpeed's pipeline engine sends with a blocking dist.send (runtime/pipe/p2p.py; async_op is refused), "
                       "whose NCCL work the compute stream waits on: each send holds its stage until delivered: "
                       "algo.blocking_sends=true")
    layers = lead_int(row["layers"]) or 0
    embedding_slots = row["row_id"] == "BLOOM-PROD" or "type:transformer|embedding" in row["notes"]
    if embedding_slots and (layers + 2) % d.pp == 0:
        d.algo.append(f"algo.stages=[{','.join([str((layers + 2) // d.pp)] * d.pp)}]")
        d.notes.append("--pp-partition-method 'type:transformer|embedding': the embedding and the tied head take a block's slot each")
    d.notes.append("DeepSpeed's pipeline engine reduces the gradients and gathers the ZeRO-1 shards after the backward, not overlapped")
    d.notes.append("CUDA_LAUNCH_BLOCKING=1 (tr11-176B-ml.slurm, against hangs) is simulated as asynchronous launches: BigScience "
                   "measured 6 % from it on 80 GPUs and none on 160 (chronicles-prequel)")
    if precision == "amp_fp16":
        d.algo.append("algo.grad_accumulation=autograd")
        d.notes.append("DeepSpeed's FP16 ZeRO-1 registers no gradient hooks (stage_1_and_2.py: only with partition_gradients or "
                       "overlap_comm, off by default): PyTorch's AccumulateGrad adds the micro-batches after the first into "
                       "param.grad, a pass of their own: algo.grad_accumulation=autograd")
    if precision == "amp_bf16":
        d.algo.append("algo.keep_lp_grads=true")
        d.notes.append("DeepSpeed's BF16_Optimizer keeps the BF16 gradients beside its unsharded FP32 accumulation and adds each "
                       "micro-batch's into it (runtime/bf16_optimizer.py, pipe/engine.py; the chronicle: 'additional memory usage "
                       "is 4bytes x params and it's not sharded'), and all-reduces the FP32 gradients in BF16 before each rank "
                       "steps its shard (pipe/engine.py _bf16_reduce_grads, engine.py allreduce_bucket): algo.keep_lp_grads=true")
    d.notes.append(f"vocabulary: BLOOM's tokenizer, 250,680, padded to a multiple of 128 x TP = {padded_vocab(250680, d.tp)} as "
                   "Megatron-DeepSpeed pads it (the production run: --pad-vocab-size-to 250880)")
    if zero == 0 or row["row_id"].startswith("BLOOM-ZS"):
        d.notes.append("the ZeRO stage 0 / 1 pair ran on two different branches (the author asks for a re-test)")
    return d


def _mosaic(row: Mapping[str, str]) -> _Draft:
    size = row["model"].split()[-1].lower()
    a100 = "A100" in row["gpu"]
    d = _Draft(row, "llm", "superpod_a100" if a100 else "superpod_h100", [], "amp_bf16",
               "full" if row["recompute"].lower().startswith("full") else "none")
    d.dp = int(row["gpu_count"])
    d.micro_batch, d.batch = lead_int(row["micro_batch"]) or 1, lead_int(row["global_batch_seqs"]) or 0
    d.algo = ["algo=fsdp", f"algo.micro_batch={d.micro_batch}"]
    if size not in MPT_SHAPES:
        d.reason = f"no MPT shape known for {row['model']!r}"
        return d
    layers, h, heads = MPT_SHAPES[size]
    d.shape = (f"model.layers={layers}", f"model.hidden={h}", f"model.heads={heads}", f"model.kv_heads={heads}",
               f"model.ffn_hidden={4 * h}", f"model.seq_len={d.seq_len}", f"model.batch_size={d.batch}", *MPT_ARCH,
               f"model.attention={'flash_triton' if a100 else 'flash'}")
    d.notes.append(f"MPT-{size}'s shape from llm-foundry's yamls (the row gives only its name)")
    d.notes.append("cluster: " + ("superpod_a100, whose 8 x 200 Gb/s per node is the row's 1600 Gb/s (RoCE there, InfiniBand here)"
                                  if a100 else "superpod_h100 (8 x 400 Gb/s per node): the H100 fabric is not stated"))
    if "pure" in row["precision"].lower():
        d.notes.append("FSDP's PURE mixed precision (BF16 compute and gradient reduction) simulated as amp_bf16")
    d.notes.append(MPT_ATTENTION[a100])
    return d


#: each group's builder
GROUPS: dict[str, Callable[[Mapping[str, str]], _Draft]] = {
    "megatron_sc21_table1": _megatron_sc21, "korthikanti_mlsys23": _korthikanti, "torchtitan": _torchtitan,
    "bloom_176b": _bloom, "bloom_176b_topology_sweep": _bloom, "bloom_176b_single_node": _bloom, "mosaic_llm_foundry_fsdp": _mosaic,
}


def row_job(row: Mapping[str, str]) -> RowJob:
    """The job of one published row: its overrides, assumptions and published figure, or the reason
    the harness cannot express it (every row gives one or the other)."""
    builder = GROUPS.get(row["group"])
    gpus = lead_int(row["gpu_count"]) or 0
    mem, oom = memory_gib(row["mem_gb"])
    if builder is None:
        return RowJob(row["row_id"], row["group"], row["model"], (), f"no mapping for group {row['group']!r}", (), gpus, 0, 0, "", "",
                      1, 1, 1, 1, "", published_figure(row), mem, oom, row.get("notes", ""))
    d = builder(row)
    if row["group"].startswith("bloom"):
        d.shape = _shape(row, d, vocab=padded_vocab(250680, d.tp))
    elif not d.shape:
        d.shape = _shape(row, d)
    reason = d.reason
    if not reason and gpus % 8:
        reason = f"{gpus} GPUs do not fill 8-GPU nodes"
    if not reason and d.tp * d.pp * d.dp * (lead_int(row.get("cp", "")) or 1) != gpus:
        reason = f"TP x PP x DP x CP = {d.tp} x {d.pp} x {d.dp} x {lead_int(row.get('cp', '')) or 1} is not the {gpus} GPUs"
    if "algo=megatron" in d.algo and not any(a.startswith("algo.tp=") for a in d.algo):  # the degrees as the row gives them
        d.algo += [f"algo.tp={d.tp}", f"algo.pp={d.pp}", f"algo.dp={d.dp}", f"algo.micro_batch={d.micro_batch}", f"algo.vpp={d.vpp}",
                   f"algo.schedule={d.schedule}"]
    d.algo.append(f"algo.recompute={d.recompute}")
    overrides = (f"model={d.base}", *d.shape, f"model.kernels={d.kernels}", f"model.name={re.sub(r'[^a-z0-9]+', '_', row['row_id'].lower())}",
                 f"cluster={d.cluster}", f"cluster.nodes={max(gpus // 8, 1)}", *d.algo, f"precision={d.precision}", *QUIET)
    return RowJob(row["row_id"], row["group"], row["model"], overrides, reason, tuple(d.notes), gpus, d.batch, d.seq_len,
                  d.precision, d.recompute, d.pp, d.vpp, d.micro_batch, d.dp, d.schedule, published_figure(row), mem, oom,
                  row.get("notes", ""), d.kernels, counts_runtime(row["mem_gb"]))


def _pairs(jobs: list[RowJob], first: Callable[[RowJob], bool], second: Callable[[RowJob], bool],
           key: Callable[[RowJob], tuple[object, ...]]) -> list[tuple[RowJob, RowJob]]:
    """Every (a, b) with ``first(a)``, ``second(b)`` and the same ``key``: rows that differ only in what the key leaves out."""
    return [(a, b) for a in jobs if first(a) for b in jobs if second(b) and key(a) == key(b)]


def schedule_pairs(jobs: list[RowJob]) -> list[tuple[RowJob, RowJob]]:
    """Pairs of rows that differ only in their pipeline schedule (1F1B against interleaved 1F1B,
    torchtitan's Table 5): (1F1B row, interleaved row)."""
    return _pairs(jobs, lambda j: j.pp > 1 and j.schedule == "1f1b" and j.group == "torchtitan",
                  lambda j: j.pp > 1 and j.schedule in INTERLEAVED,
                  lambda j: (j.group, j.model, j.gpus, j.batch, j.seq_len, j.precision, j.recompute, j.pp, j.dp))


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value ``overrides`` (``python -m harness`` ``key=value`` words) give ``key``, None where none."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), None)


def algo_value(job: RowJob, key: str) -> str:
    """The value a row's job gives ``algo.<key>`` ("" where it gives none)."""
    return override_value(job.overrides, f"algo.{key}") or ""


def micro_batch_pairs(jobs: list[RowJob]) -> list[tuple[RowJob, RowJob]]:
    """Pairs of BLOOM rows that differ only in their micro-batch (the sweep measured most of its
    topologies at two): (smaller micro-batch row, larger)."""
    def key(j: RowJob) -> tuple[object, ...]:
        return (j.model, j.gpus, j.batch, j.seq_len, j.precision, j.recompute, j.pp, j.dp, j.schedule, algo_value(j, "tp"),
                algo_value(j, "zero"), algo_value(j, "stages"))
    bloom = [j for j in jobs if j.group.startswith("bloom") and j.expressed]
    return [(a, b) for a, b in _pairs(bloom, lambda j: True, lambda j: True, key) if a.micro_batch < b.micro_batch]


def batch_pairs(jobs: list[RowJob]) -> list[tuple[RowJob, RowJob]]:
    """Pairs of BLOOM rows measured the same day (their ``notes``) that differ only in their global
    batch (the sweep measured three plans at 1568 and 2048 sequences): (smaller batch row, larger)."""
    def key(j: RowJob) -> tuple[object, ...]:
        return (j.model, j.gpus, j.seq_len, j.precision, j.recompute, j.pp, j.dp, j.schedule, j.micro_batch,
                algo_value(j, "tp"), algo_value(j, "zero"), algo_value(j, "stages"), j.notes)
    bloom = [j for j in jobs if j.group.startswith("bloom") and j.expressed]
    return [(a, b) for a, b in _pairs(bloom, lambda j: True, lambda j: True, key) if a.batch < b.batch]


def compile_pairs(jobs: list[RowJob]) -> list[tuple[RowJob, RowJob]]:
    """Pairs of rows that differ only in torch.compile (torchtitan's Tables 1 and 3): (eager row, compiled row)."""
    return _pairs(jobs, lambda j: j.kernels == "eager", lambda j: j.kernels.startswith("compiled"),
                  lambda j: (j.group, j.model, j.gpus, j.batch, j.seq_len, j.precision, j.recompute, j.pp, j.dp, j.schedule,
                             j.micro_batch))
