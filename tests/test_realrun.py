"""sim=realrun on the CPU (2 gloo ranks): parallelizing never changes the maths.

For every algorithm of conf/algo whose plan the real-run backend executes (an operator
placement or data parallelism on the captured graph, or a layer-graph strategy of data
parallelism with channel-parallel linear and elementwise layers - OptCNN and PaSE choose pure
data parallelism for the tiny ResNet, OWT channel-parallel classifiers), on small models, the
loss, every gradient and every updated parameter of the first distributed step equal the
single-process run of the same fx graph from the same initial state.  Plans that are only
simulated (rewritten graphs, channel-parallel convolutions...) are skipped with the refusal
message.  Channel-parallel layers get their own cases (``CHANNEL``): they must run.

Tolerance: ``|got - ref| <= RTOL * |ref| + ATOL * max|ref|`` element-wise, RTOL = 1e-4,
ATOL = 1e-5.  Both runs execute the same aten kernels on the same fp32 values; what may
differ is the order of floating-point additions: a received tensor is contiguous where the
sender's was a strided view (another kernel path), and data parallelism sums a gradient as
two half-batch partial sums averaged by the all-reduce.  A reordered fp32 sum of n terms
differs by about sqrt(n) * 2^-24 of the magnitude of its terms (n <= 1e4 here: ~1e-5), hence
an absolute term relative to the tensor's scale (entries that cancel to ~0 carry the error
of their terms) and a relative term two decades above fp32's epsilon.  Observed differences
are 0 to 3e-6 relative.

All cases of a module share one launch of the two ranks (``launch_many``): starting the
processes costs more than running the steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from experiments.common import needs_input
from harness.app.compose import compose
from harness.core.graph import OpGraph
from harness.app.run import build
from harness.core.strategy import ParallelConfig, Strategy
from simulators.realrun import RealRun, RealRunError, launch_many, reference_outputs

REPO = Path(__file__).resolve().parents[1]
ALGOS = sorted(p.stem for p in (REPO / "conf" / "algo").glob("*.yaml") if not needs_input(p.stem))  # but those replaying a file
RTOL, ATOL = 1e-4, 1e-5

#: small models: (overrides, has batch statistics (BatchNorm))
MODELS: dict[str, tuple[list[str], bool]] = {
    "lenet5": (["model=lenet5", "model.batch_size=8"], False),
    "resnet_tiny": (["model=resnet50", "model.batch_size=4", "model.image_size=32", "+model.module.layers=[1,1,1,1]",
                     "+model.module.width=8", "model.module.num_classes=10", "model.target.high=10"], True),
    "transformer_tiny": (["model=transformer", "model.batch_size=4", "model.src_len=8", "model.tgt_len=8", "model.vocab=50",
                          "model.module.d_model=32", "model.module.num_heads=2", "model.module.d_ff=64",
                          "model.module.num_encoder_layers=1", "model.module.num_decoder_layers=1"], False),
}
FAST = ["lenet5", "resnet_tiny"]
SLOW = ["transformer_tiny"]
#: an AlexNet small enough for the CPU (fully-connected layers 16 -> 64 -> 64 -> 10); only in CHANNEL
MODELS["alexnet_tiny"] = (["model=alexnet", "model.batch_size=4", "model.image_size=67", "+model.module.widths=[8,16,16,16,16]",
                           "+model.module.fc_width=64", "model.module.num_classes=10", "model.target.high=10"], False)
#: layer-graph strategies with channel-parallel layers, run with the FAST cases: the OWT plan (linear
#: layers and the activations after them channel-parallel, the rest data-parallel) and
#: ``fc_channel`` (only the linear layers channel-parallel: their outputs are re-split by sample)
CHANNEL = [("lenet5", "owt"), ("lenet5", "fc_channel@layergraph"), ("resnet_tiny", "owt"), ("alexnet_tiny", "owt")]


def close(got: Any, ref: Any, what: str) -> None:
    if ref is None:
        assert got is None, f"{what}: expected None"
        return
    assert got is not None, f"{what}: missing from the distributed run"
    got, ref = got.detach().float(), ref.detach().float()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = (got - ref).abs()
    bound = RTOL * ref.abs() + ATOL * scale
    bad = err > bound
    assert not bool(bad.any()), f"{what}: max |diff| {float(err.max()):.3g} (scale {scale:.3g}) beyond rtol {RTOL}, atol {ATOL} x scale"


def _setup(model: str, algo: str, extra: list[str] | None = None) -> tuple[Any, Any, Any, Any, Any, Any]:
    ov, _ = MODELS[model]
    cfg = compose([*ov, f"algo={algo}", "cluster=cpu2", "sim=realrun", *(extra or [])])
    return (*build(cfg), cfg)


def _algorithm(name: str, base: Any) -> Any:
    """An algorithm from its conf/algo file without composing the whole config again
    (composition costs a second per call); files with a defaults list are composed."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.load(REPO / "conf" / "algo" / f"{name}.yaml")
    if "defaults" in node:
        return instantiate(compose([f"algo={name}"]).algo, seed=0, _convert_="all")
    return instantiate(node, seed=0, _convert_="all")


def _run_cases(models: list[str]) -> dict[tuple[str, str], Any]:
    """Plan every (model, algo), launch all executable cases together, return outcomes or skip reasons."""
    torch.set_num_threads(1)
    cases: dict[tuple[str, str], Any] = {}
    jobs, keys = [], []
    for m in models:
        for gran in ("aten", "layer"):
            src, cluster, costs, _, sim, cfg = _setup(m, "single_device", [f"graph.granularity={gran}", "sim.warmup=1", "sim.steps=1"])
            gcfg = {"granularity": gran, "optimizer": "sgd", "batch_probe": True}
            g = src.op_graph(**gcfg, keep_fx=True)
            sim.bind(src, 0, gcfg)
            sim.interleave_profile = gran == "layer"  # round_robin@layer also profiles between its steps: the maths must not change
            for algo_name in (ALGOS if gran == "aten" else ["round_robin"]):
                a = algo_name if gran == "aten" else f"{algo_name}@layer"
                algo = _algorithm(algo_name, cfg)
                if getattr(algo, "graph_kind", "op") == "stack":
                    cases[(m, a)] = f"{algo_name}: a parallel plan of a stack graph, which sim=realrun does not execute (simulated only)"
                    continue
                layer_kind = getattr(algo, "graph_kind", "op") != "op"
                if layer_kind and gran != "aten":
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plan = algo.plan(src.layer_graph() if layer_kind else g, cluster, costs)
                try:
                    job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices, collect=True)
                except RealRunError as e:  # a rewritten graph (FD-DPS splits), channel-parallel layers: only simulated
                    cases[(m, a)] = f"{algo_name}: refused by sim=realrun: {e}"
                    continue
                job.trace = a in ("data_parallel", "round_robin")  # their every op, send and wait recorded: the maths must not change
                dp = job.mode in ("data_parallel", "channel_parallel")
                cases[(m, a)] = {"src": src, "mode": job.mode, "k": len(job.dp_devices) if dp else 1, "gran": gran,
                                 "sends": sum(p.sends for p in job.programs), **_channel_info(job, plan.graph, plan.strategy)}
                if job.mode == "placement":
                    cases[(m, a)]["code"] = [p.code for p in job.programs]
                if job.interleave_profile:
                    cases[(m, a)].update(plan=plan, cluster=cluster, costs=costs, job=job)
                jobs.append(job)
                keys.append((m, a))
        # receives posted at the producer's position of the walk instead of before the step
        src, cluster, costs, algo, sim, cfg = _setup(m, "round_robin", ["sim.early_recv=false", "sim.warmup=1", "sim.steps=1"])
        g = src.op_graph(granularity="aten", optimizer="sgd", batch_probe=True, keep_fx=True)
        sim.bind(src, 0, {"granularity": "aten", "optimizer": "sgd", "batch_probe": True})
        plan = algo.plan(g, cluster, costs)
        job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices, collect=True)
        cases[(m, "round_robin@late_recv")] = {"src": src, "mode": job.mode, "k": 1, "gran": "aten", "sends": sum(p.sends for p in job.programs),
                                               "code": [p.code for p in job.programs]}
        jobs.append(job)
        keys.append((m, "round_robin@late_recv"))
        # a layer-graph (OptCNN-space) strategy: data parallelism on every layer
        src, cluster, costs, _, sim, cfg = _setup(m, "data_parallel", ["algo.graph=layer", "sim.warmup=1", "sim.steps=1"])
        lg = src.layer_graph()
        plan = _algorithm("data_parallel", cfg).__class__(graph="layer").plan(lg, cluster, costs)
        sim.bind(src, 0, {"granularity": "aten", "optimizer": "sgd", "batch_probe": True})
        job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices, collect=True)
        cases[(m, "data_parallel@layergraph")] = {"src": src, "mode": job.mode, "k": len(job.dp_devices), "gran": "layer graph", "sends": 0}
        jobs.append(job)
        keys.append((m, "data_parallel@layergraph"))
    for m, a in CHANNEL if models == FAST else []:
        if (m, a) in keys:  # planned above (owt is in ALGOS)
            continue
        cases[(m, a)] = _channel_case(m, a)
        jobs.append(cases[(m, a)].pop("job"))
        keys.append((m, a))
    for key, measured in zip(keys, launch_many(jobs)):
        cases[key]["measured"] = measured
    refs: dict[tuple[str, int], Any] = {}
    for key in keys:
        c = cases[key]
        rk = (key[0], c["k"])
        if rk not in refs:
            refs[rk] = reference_outputs(c["src"], seed=0, shards=c["k"])
        c["ref"] = refs[rk]
        if c["k"] > 1 and not MODELS[key[0]][1]:
            full = (key[0], 1)
            if full not in refs:
                refs[full] = reference_outputs(c["src"], seed=0, shards=1)
            c["full"] = refs[full]
    return cases


def _channel_case(model: str, algo: str) -> dict[str, Any]:
    """A layer-graph strategy with channel-parallel layers, prepared (the job under ``"job"``)."""
    from algorithms.layer_fixed import OWT, layer_strategy

    src, cluster, costs, _, sim, cfg = _setup(model, "single_device", ["sim.warmup=1", "sim.steps=1"])
    lg = src.layer_graph()
    if algo == "owt":
        strategy = OWT().plan(lg, cluster, costs).strategy
    else:
        dims = [{} if kd == "input" else {"channel": 2} if kd == "linear" else {"sample": 2} for kd in lg.kinds]
        strategy = layer_strategy(lg, dims, cluster.num_devices)
    sim.bind(src, 0, {"granularity": "aten", "optimizer": "sgd", "batch_probe": True})
    job = sim.prepare(lg, strategy, cluster.num_devices, collect=True)
    return {"src": src, "mode": job.mode, "k": len(job.dp_devices), "gran": "layer graph", "sends": 0, "job": job,
            **_channel_info(job, lg, strategy)}


def _channel_info(job: Any, graph: Any, strategy: Strategy) -> dict[str, Any]:
    """What the channel-parallel test checks of a prepared job (nothing for other jobs)."""
    if job.mode != "channel_parallel":
        return {}
    channel = [graph.names[v] for v in range(graph.num_nodes) if (c := strategy.config_of(v)) is not None and c.degree_of("channel") > 1]
    return {"channel_layers": channel, "code": job.programs[0].code, "param_rows": dict(job.param_rows), "eg": job.eg}


@pytest.fixture(scope="module")
def fast_cases() -> dict[tuple[str, str], Any]:
    return _run_cases(FAST)


@pytest.fixture(scope="module")
def slow_cases() -> dict[tuple[str, str], Any]:
    return _run_cases(SLOW)


def _check(case: Any, model: str, algo: str) -> None:
    if isinstance(case, str):
        pytest.skip(case)
    out = case["measured"].outputs()
    for ref_key in ("ref", "full"):
        ref = case.get(ref_key)
        if ref is None:
            continue
        tag = f"{model}/{algo} vs {'the data-parallel shards' if ref_key == 'ref' and case['k'] > 1 else 'the single-process run'}"
        close(out.get("loss"), ref["loss"], f"{tag}: loss")
        for j, g in enumerate(ref["grads"]):
            close(out.get(f"grad{j}"), g, f"{tag}: gradient {j}")
        for j, p in enumerate(ref["new_params"]):
            close(out.get(f"new{j}"), p, f"{tag}: updated parameter {j}")
    assert case["measured"].step_time_s > 0


@pytest.mark.parametrize("algo", ALGOS + ["round_robin@layer", "data_parallel@layergraph", "round_robin@late_recv"])
@pytest.mark.parametrize("model", FAST)
def test_distributed_step_equals_single_process(fast_cases, model, algo):
    _check(fast_cases[(model, algo)], model, algo)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS + ["round_robin@layer", "data_parallel@layergraph", "round_robin@late_recv"])
@pytest.mark.parametrize("model", SLOW)
def test_distributed_step_equals_single_process_slow(slow_cases, model, algo):
    _check(slow_cases[(model, algo)], model, algo)


@pytest.mark.parametrize("model,algo", CHANNEL)
def test_channel_parallel_step_equals_single_process(fast_cases, model, algo):
    """Channel-parallel linear (and elementwise) layers run for real (never skipped) and give the
    data-parallel shards' loss, gradients and updated parameters (and, without BatchNorm, the
    single-process run's); each rank holds only its rows of those layers' parameters."""
    case = fast_cases[(model, algo)]
    assert case["mode"] == "channel_parallel" and case["k"] == 2
    linear = [n for n in case["channel_layers"] if any(p.name.startswith(n + ".") for p in case["eg"].placeholders)]
    assert linear, "the strategy has no channel-parallel linear layer"
    for name in linear:  # weight and bias of every channel-parallel linear layer are split in halves
        js = [j for j, p in enumerate(case["eg"].placeholders) if p.name in (f"{name}.weight", f"{name}.bias")]
        assert js and all(case["param_rows"][j] * 2 == case["eg"].placeholders[j].meta.shape[0] for j in js), name
    code = case["code"]
    assert "_ag_rows(" in code and ("_a2a_cl(" in code or "_ag_cols(" in code)  # the full batch in, features out
    elementwise = [n for n in case["channel_layers"] if n not in linear]
    if algo == "owt" and model != "resnet_tiny":  # the activations between fc layers stay feature-sliced (the
        assert elementwise and "_ag_cols(" in code  # tiny ResNet has one fc layer, read by the loss)
    if not elementwise:  # outputs re-split by sample for the data-parallel layers, input gradients summed over the ranks
        assert "_a2a_cl(" in code and "_a2a_lc(" in code
    if algo != "owt":
        assert "_ar(" in code
    _check(case, model, algo)


def test_placements_really_exchange_tensors(fast_cases):
    c = fast_cases[("lenet5", "round_robin")]
    assert c["mode"] == "placement" and c["sends"] > 10
    m = c["measured"]
    assert m.world == 2 and m.cores == [[0], [1]] or m.oversubscribed
    assert len(m.step_s) == 1 and all(b > 0 for b in m.rank_busy_s)
    # each rank sends, and waits for what it receives; busy, send and wait time fit in the step
    assert all(s > 0 for s in m.rank_send_s) and all(w >= 0 for w in m.rank_wait_s)
    assert all(b + s + w <= t * 1.001 for b, s, w, t in zip(m.rank_busy_s, m.rank_send_s, m.rank_wait_s, m.rank_step_s))
    assert len(m.rank_faults) == 2 and all(f >= 0 for f in m.rank_faults)
    # every receive is posted before the step's barrier (post), none inside the step ...
    for code in c["code"]:
        post, step = code.split("def step(")
        assert post.startswith("def post(PH, RB):") and "_irecv(" in post and "_irecv(" not in step
    # ... unless sim.early_recv=false: then at the producer's position of the walk
    late = fast_cases[("lenet5", "round_robin@late_recv")]
    assert late["sends"] == c["sends"] and all("def post(" not in code and "_irecv(" in code for code in late["code"])
    dp = fast_cases[("lenet5", "data_parallel")]
    assert dp["mode"] == "data_parallel" and dp["k"] == 2


@pytest.mark.parametrize("model", FAST)
def test_interleaved_profile_is_taken_between_the_measured_steps(fast_cases, model):
    """sim.interleave_profile: after each step one rank in turn runs the whole graph alone and
    times every op (warm-up steps dropped), without changing the distributed step's maths
    (round_robin@layer passes the equality test above with it on); the layer-granularity plan
    is simulated with those times summed per coarse node."""
    from simulators.realrun import interleaved_step_time

    c = fast_cases[(model, "round_robin@layer")]
    m, job, plan = c["measured"], c["job"], c["plan"]
    assert job.interleave_profile and m.reference_s.shape == (m.steps, job.eg.num_nodes)
    # the ranks take turns (step s: rank s mod 2; warm-up steps dropped), each on its own cores
    assert m.reference_rank.tolist() == [s % 2 for s in range(m.warmup, m.warmup + m.steps)]
    assert (m.reference_s >= 0).all() and m.reference_s.sum() > 0
    assert plan.graph.num_nodes < job.eg.num_nodes  # coarse nodes of aten runs
    t = interleaved_step_time(plan.graph, plan.strategy, c["cluster"], c["costs"], job, m.reference_s)
    assert t is not None and t > 0
    assert m.summary()["measured_reference_steps"] == m.steps
    assert m.summary()["measured_reference_step_s"] == pytest.approx(float(m.reference_s.sum()) / m.steps)
    assert len(m.summary()["measured_reference_rank_step_s"]) == 2


def test_interleaved_step_time_uses_the_reference_times_of_the_plan_nodes():
    """With reference times equal to the plan's own cost model's, the interleaved simulation is
    the plain one - for a placement, for data parallelism (the reference ran the B/k graph; its
    weight updates are asked for at fraction 1) and for a layer-granularity plan (aten times
    summed per coarse node); scaled times give a different step."""
    from simulators.realrun import interleaved_costs, interleaved_step_time
    from simulators.simulate import simulate

    for algo_name, gran in (("round_robin", "aten"), ("data_parallel", "aten"), ("round_robin", "layer")):
        src, cluster, costs, algo, sim, cfg = _setup("lenet5", algo_name, [f"graph.granularity={gran}"])
        gcfg = {"granularity": gran, "optimizer": "sgd", "batch_probe": True}
        sim.bind(src, 0, gcfg)
        sim.interleave_profile = True
        g = src.op_graph(**gcfg, keep_fx=True)
        plan = algo.plan(g, cluster, costs)
        job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices)
        assert job.interleave_profile
        f = job.ref_fraction
        base = costs.node_times(plan.graph, 0, f)
        if f != 1.0:
            from harness.core.graph import REPLICATED

            assert job.mode == "data_parallel" and f == 0.5
            base = np.where(plan.graph.batch_role == REPLICATED, costs.node_times(plan.graph, 0, 1.0), base)
        if job.eg.num_nodes == plan.graph.num_nodes:
            ref = base[None, :]
        else:  # each coarse node's time on the first aten node of its run
            grp = np.asarray(job.ref_group)
            first = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
            ref = np.zeros((1, job.eg.num_nodes))
            ref[0, first] = base[grp[first]]
        want = simulate(plan.graph, plan.strategy, cluster, costs).step_time_s
        assert interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, ref) == pytest.approx(want, rel=1e-12), (algo_name, gran)
        slower = interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, 2 * ref)
        assert slower > want, (algo_name, gran)
    # a layer-graph plan has no per-op times to take: no interleaved figure
    assert interleaved_step_time(src.layer_graph(), plan.strategy, cluster, costs, job, ref) is None
    # each device takes its own rank's reference steps: a plan on device 0 sees rank 0's times
    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "single_device")
    sim.bind(src, 0, {"granularity": "aten", "optimizer": "sgd", "batch_probe": True})
    sim.interleave_profile = True
    g = src.op_graph(keep_fx=True)
    plan = algo.plan(g, cluster, costs)
    job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices)
    base = costs.node_times(plan.graph, 0)
    want = simulate(plan.graph, plan.strategy, cluster, costs).step_time_s
    two = np.vstack([base, 3 * base])
    assert interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, two, reference_rank=np.array([0, 1])) == pytest.approx(want)
    assert interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, two, reference_rank=np.array([1, 0])) == pytest.approx(3 * want)
    # without ranks (or for a rank that ran none) the mean over all reference steps
    assert interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, two) == pytest.approx(2 * want)
    # means, not medians: one slow step in three counts, as it does in the measured mean step
    three = np.vstack([base, base, 4 * base])
    assert interleaved_step_time(plan.graph, plan.strategy, cluster, costs, job, three, reference_rank=np.zeros(3, dtype=int)) == pytest.approx(2 * want)
    # interleaved_costs is the cost model behind it, to simulate the plan on another cluster description
    run_costs = interleaved_costs(plan.graph, cluster, costs, job, three, np.zeros(3, dtype=int))
    assert np.allclose(run_costs.node_times(plan.graph, 0), 2 * base) and simulate(plan.graph, plan.strategy, cluster, run_costs).step_time_s == pytest.approx(2 * want)
    assert interleaved_costs(plan.graph, cluster, costs, job, np.zeros((0, job.eg.num_nodes))) is None


# ---------------------------------------------------------------------------- refusals (no processes)
def _lenet() -> tuple[Any, Any, OpGraph, RealRun]:
    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "single_device")
    g = src.op_graph(keep_fx=True)
    sim.bind(src, 0, {"granularity": "aten"})
    return src, cluster, g, sim


def test_refuses_mixed_and_non_sample_configs():
    src, cluster, g, sim = _lenet()
    n = g.num_nodes
    mixed = Strategy(np.zeros(n), np.arange(n), np.r_[np.zeros(n - 1), -1], [ParallelConfig.make({"sample": 2}, [0, 1])])
    with pytest.raises(RealRunError, match="mix of placement and configs"):
        sim.prepare(g, mixed, 2)
    chan = Strategy.uniform_config(n, ParallelConfig.make({"sample": 1, "channel": 2}, [0, 1]))
    with pytest.raises(RealRunError, match=r"split along \['channel'\].*only simulated"):
        sim.prepare(g, chan, 2)


def test_refuses_channel_parallel_layer_strategies():
    """Channel-parallel linear and elementwise layers run; every other config of a layer-graph
    strategy is simulated only, and the message names the layer."""
    from algorithms.layer_fixed import layer_strategy

    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "single_device")
    lg = src.layer_graph()
    sim.bind(src, 0, {"granularity": "aten"})
    # (hand-built strategies: what OptCNN picks on cpu2 depends on this machine's calibration)

    def dims(n: int = 2, **over: dict[str, int]) -> list[dict[str, int]]:
        """Linear layers {channel: n}, the others {sample: n}; ``over``: layer name (dots as _) -> dims."""
        out = []
        for v, kd in enumerate(lg.kinds):
            d = {} if kd == "input" else {"channel": n} if kd == "linear" else {"sample": n}
            out.append(over.get(lg.names[v].replace(".", "_"), d))
        return out

    cases = [
        (dims(features_3={"channel": 2}), 2, r"layer 'features.3' \(conv2d\).*channel=2 split.*simulated only"),
        (dims(features_3={"height": 2}), 2, r"layer 'features.3' \(conv2d\).*height=2 split.*simulated only"),
        (dims(classifier_0={"channel": 2}), 2, r"layer 'classifier.0' \(view\).*channel=2 split.*simulated only"),
        (dims(4, classifier_3={"sample": 2, "channel": 2}), 4, r"layer 'classifier.3' \(linear\).*sample=2 x channel=2.*simulated only"),
        (dims(classifier_3={}), 2, r"layer 'classifier.3'.*different device sets are simulated only"),
    ]
    for d, n, msg in cases:
        with pytest.raises(RealRunError, match=msg):
            sim.prepare(lg, layer_strategy(lg, d, n), n)
    # an elementwise layer may be channel-parallel only on (batch, features) activations, not after a convolution
    with pytest.raises(RealRunError, match=r"channel-parallel layer 'features.1'.*2-D \(batch, features\).*simulated only"):
        sim.prepare(lg, layer_strategy(lg, dims(features_1={"channel": 2}), 2), 2)
    # a strategy that runs, for contrast: the fully-connected layers channel-parallel
    job = sim.prepare(lg, layer_strategy(lg, dims(), 2), 2)
    assert job.mode == "channel_parallel" and len(job.param_rows) == 6


def test_refuses_rewritten_graphs_and_sources_without_a_module(tmp_path):
    from harness.core.graph_rewrites import coarsen_runs

    src, cluster, g, sim = _lenet()
    # a copy of the captured graph without its fx module (saved and loaded) is the same graph: it runs
    g.save(tmp_path / "g.json")
    loaded = OpGraph.load(tmp_path / "g.json")
    assert sim.prepare(loaded, Strategy.placement(np.arange(loaded.num_nodes) % 2), 2).mode == "placement"
    # a rewritten graph (here contracted, as Celeritas does) is not
    coarse = coarsen_runs(g)
    coarse.meta["granularity"] = "aten"
    with pytest.raises(RealRunError, match="rewritten by the algorithm"):
        sim.prepare(coarse, Strategy.placement(np.zeros(coarse.num_nodes)), 2)
    bare = RealRun()
    with pytest.raises(RealRunError, match="needs a PyTorch model source"):
        bare.prepare(g, Strategy.placement(np.zeros(g.num_nodes)), 2)
    from harness.core.models import SyntheticGraph

    bare.bind(SyntheticGraph(nodes=10))
    with pytest.raises(RealRunError, match="SyntheticGraph"):
        bare.prepare(g, Strategy.placement(np.zeros(g.num_nodes)), 2)


def test_refuses_data_parallel_on_an_indivisible_batch():
    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "data_parallel", ["model.batch_size=7"])
    g = src.op_graph(keep_fx=True)
    sim.bind(src, 0, {"granularity": "aten"})
    with pytest.raises(RealRunError, match="divisible by 2"):
        sim.prepare(g, algo.plan(g, cluster, costs).strategy, 2)


# ---------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("model", FAST)
def test_trace_records_every_op_send_and_wait(fast_cases, model):
    """sim.trace: each rank's op calls, sends and waits of every measured step, in program
    order, on one clock from the step's start; their op time is the rank's busy time."""
    from simulators.realrun import TRACE_ALLREDUCE, TRACE_DRAIN, TRACE_OP, TRACE_RECV, TRACE_SEND

    rr, dp = fast_cases[(model, "round_robin")], fast_cases[(model, "data_parallel")]
    for c in (rr, dp):
        m = c["measured"]
        tl = m.timeline()
        assert len(m.trace) == 2 and all(ev.shape[0] == m.steps and ev.shape[2] == 4 for ev in m.trace)
        for r, ev in enumerate(m.trace):
            kind = ev[0, :, 0]
            assert (ev[:, :, 0] == kind).all()  # the same program every step
            assert (ev[:, :, 3] >= ev[:, :, 2]).all() and (np.diff(ev[:, :, 2], axis=1) >= 0).all()  # in order, one after the other
            assert (ev[:, :, 2] >= 0).all()  # after the first rank left the barrier
            assert (ev[0, -1, 0] == TRACE_DRAIN) == (c is rr)  # a placement's rank waits for its sends last
            assert int((kind == TRACE_OP).sum()) == m.records[r]["nodes"]
            assert int((kind == TRACE_SEND).sum()) == m.records[r]["sends"]
            assert int((kind == TRACE_RECV).sum()) == m.records[r]["recvs"]
            ops = ev[:, :, 0] == TRACE_OP
            busy = np.where(ops, ev[:, :, 3] - ev[:, :, 2], 0.0).sum(axis=1)
            assert busy.mean() == pytest.approx(m.rank_busy_s[r], rel=1e-9)
            sel = tl["rank"] == r
            assert np.allclose(tl["duration_s"][sel], (ev[:, :, 3] - ev[:, :, 2]).mean(axis=0))
    assert rr["sends"] > 0 and not (dp["measured"].trace[0][0, :, 0] == TRACE_SEND).any()
    ar = dp["measured"].trace[0][0]
    assert (ar[:, 0] == TRACE_ALLREDUCE).sum() > 0  # the gradients' all-reduces, waited for by node
    assert set(ar[ar[:, 0] == TRACE_ALLREDUCE, 1].astype(int)) <= set(ar[ar[:, 0] == TRACE_OP, 1].astype(int))


def test_run_adds_the_measured_step_time(tmp_path):
    """harness.app.run with sim=realrun: the event simulator's step_time_s and the measured one."""
    from harness.app.run import run, write_outputs
    from harness.app.summary import format_summary

    (tmp_path / "none").mkdir()  # a profile directory without profiles: every op falls back
    from harness.core.machine import cpu_kind_override

    cfg = compose([*MODELS["lenet5"][0], "algo=m_topo", "cluster=cpu2", cpu_kind_override(), "sim=realrun", "sim.warmup=1", "sim.steps=3",
                   "costs=profiled", f"costs.profile_dir={tmp_path / 'none'}", "output.gantt=false", "sim.interleave_profile=true",
                   "sim.trace=true"])
    res = run(cfg)
    row = res.row
    assert row["step_time_s"] > 0 and row["measured_step_time_s"] > 0 and row["measured_steps"] == 3
    # the plan simulated again with the ops' times profiled between the measured steps
    assert row["measured_reference_steps"] == 3 and row["measured_reference_step_s"] > 0
    assert row["step_time_interleaved_s"] > 0
    assert row["sim_relative_error_interleaved"] == pytest.approx(row["step_time_interleaved_s"] / row["measured_step_time_s"] - 1)
    assert len(row["measured_rank_step_s"]) == 2 and row["realrun"]["backend"] == "gloo" and row["realrun"]["mode"] == "placement"
    # no profile in that directory: every kernel fell back to the analytical model, and the row says so
    assert row["costs_report"]["fallback_nodes"] == int((~res.plan.graph.free).sum()) > 0
    assert len(row["measured_step_times_s"]) == 3 and np.mean(row["measured_step_times_s"]) == pytest.approx(row["measured_step_time_s"])
    write_outputs(res, tmp_path, cfg)
    assert json.loads((tmp_path / "result.json").read_text())["measured_step_time_s"] == row["measured_step_time_s"]
    assert "measured step" in format_summary(row)
    # sim.trace: every event of the run in measured_trace.csv, and the two steps drawn one above the other
    import csv

    rows = list(csv.DictReader(open(tmp_path / "measured_trace.csv")))
    ops = [r for r in rows if r["kind"] == "op"]
    assert len(ops) == sum(row["realrun"]["ops_per_rank"]) and all(r["node"] in res.plan.graph.names for r in ops)
    assert {r["phase"] for r in ops} == {"forward", "backward", "update"}
    assert sum(r["kind"] == "send" for r in rows) == sum(row["realrun"]["sends_per_rank"]) > 0
    assert not (tmp_path / "gantt_measured.png").exists()  # output.gantt=false
    from simulators.gantt import plot_measured_gantt

    plot_measured_gantt(res.sim, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 1000


@pytest.mark.slow
def test_cli_adds_the_measured_step_time(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "harness", "model=lenet5", "model.batch_size=8", "algo=round_robin", "cluster=cpu2",
                        "sim=realrun", "sim.warmup=1", "sim.steps=3", "output.gantt=false", f"hydra.run.dir={tmp_path}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads((tmp_path / "result.json").read_text())
    assert row["step_time_s"] > 0 and row["measured_step_time_s"] > 0 and row["measured_steps"] == 3
    assert len(row["measured_rank_step_s"]) == 2 and row["realrun"]["backend"] == "gloo"
    assert "measured step" in r.stdout


def test_receives_are_posted_early_on_gloo_only():
    """On NCCL a receive posted up front would hold its peer stream (and the sends queued behind
    it): there every receive stays at the producer's position of the walk."""
    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "round_robin")
    g = src.op_graph(keep_fx=True)
    sim.bind(src, 0, {"granularity": "aten"})
    plan = algo.plan(g, cluster, costs)
    for backend, early in (("gloo", True), ("nccl", False)):
        sim.backend = backend
        job = sim.prepare(plan.graph, plan.strategy, cluster.num_devices)
        assert job.backend == backend and all(("def post(" in p.code) == early and "_irecv(" in p.code for p in job.programs)
    # CPU ranks keep the memory they free (simulators.realrun.timing.steady_malloc), unless told not to
    assert job.device == "cpu" and job.steady_malloc
    sim.steady_malloc = False
    assert not sim.prepare(plan.graph, plan.strategy, cluster.num_devices).steady_malloc


def test_a_script_without_a_main_guard_is_told_why_its_ranks_died(tmp_path):
    """spawn runs the caller's script again in every rank: one without a main guard makes each
    rank start ranks of its own, which fails; the error says so instead of only an exit code."""
    script = tmp_path / "noguard.py"
    script.write_text(
        "from harness.app.compose import compose\n"
        "from harness.app.run import run\n"
        f"run(compose({[*MODELS['lenet5'][0], 'algo=single_device', 'cluster=cpu2', 'sim=realrun', 'sim.warmup=0', 'sim.steps=1', 'output.gantt=false']!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert f"runs the script {script} again in every rank" in r.stderr and 'if __name__ == "__main__":' in r.stderr


@pytest.mark.slow
def test_torchrun_launcher(tmp_path):
    src, cluster, costs, algo, sim, cfg = _setup("lenet5", "round_robin", ["sim.launcher=torchrun", "sim.warmup=1", "sim.steps=2"])
    g = src.op_graph(keep_fx=True)
    sim.bind(src, 0, {"granularity": "aten"})
    plan = algo.plan(g, cluster, costs)
    m = sim.execute(plan.graph, plan.strategy, 2, collect=True)
    assert m.launcher == "torchrun" and m.step_time_s > 0
    ref = reference_outputs(src)
    close(m.outputs()["loss"], ref["loss"], "loss")
