"""HRL: the hierarchical device placer of Mirhoseini et al. (ICLR 2018, "A Hierarchical
Model for Device Placement"), as Celeritas compares it (Table 3).

A *Grouper* assigns every operator to one of G groups and a *Placer* assigns every group
to a device; both are stochastic policies trained jointly with REINFORCE on the measured
step time of the placements they sample.  Following the paper and TensorFlow's
``hierarchical_controller`` (grappler):

* G = min(256, 20 x devices) unless ``num_groups`` is set.
* Grouper: a feed-forward network over per-op features (op class, phase, output size,
  FLOPs, compute time, degree, topological position), softmax over the G groups.
* Placer: an autoregressive recurrent decoder over the non-empty groups (in group-id
  order) whose input is the group's embedding (mean member features, size, share of
  compute and memory) and the previous group's device; softmax over devices.  The paper's
  placer is a bi-LSTM encoder with an attentional LSTM decoder; ours keeps the
  autoregressive sequence model but uses a single tanh-RNN layer with hand-written
  gradients (numpy only).
* Cost (the negative reward) is sqrt(step time); a placement that runs out of memory
  costs sqrt(``failing_signal``) (100 s, TF's ``failing_signal``): a large penalty and
  no gradient towards a fix, which is why Celeritas (Sec. 3, Fig. 1) sees HRL stuck in
  OOM on models larger than one device.
* Baseline: exponential moving average of the cost (decay ``baseline_decay`` = 0.9,
  starting at the failing signal as TF does); loss = (cost - baseline) x (log p_group +
  log p_place); Adam, gradients clipped to norm ``grad_bound``.
* The answer is the best placement sampled (TF keeps ``best_reward``).

The environment.  HRL trains against *measured* runtimes: ``environment(graph, strategy,
cluster, costs)`` returns a result with ``step_time_s`` and ``oom`` for each sampled
placement.  The registration (``conf/algo/hrl.yaml``) wires in the harness's discrete-event
simulator on the same cluster and cost model (``simulators.simulate.simulate``); the
algorithm itself never imports a simulator - its paper trains on runs of the placements it
proposes, and any measurement with that signature will do.  The sample budget (``samples``) and an
optional wall-clock budget come from the config; Plan.info reports the samples used, the
budget and the wall time (the paper trains for hours; Celeritas quotes 5 h).

Co-location groups follow their first member (applied to each sampled placement before
it is measured); the schedule order is node order.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Protocol

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.constraints import follow_colocation
from algorithms.sched.levels import static_costs
from harness.core.checks import boolean, non_negative_number, number_in, optional, positive_int, positive_number
from harness.core.cluster import Cluster
from harness.core.costs import CostModel, op_classes
from harness.core.graph import OpGraph
from harness.core.errors import UserError
from harness.core.strategy import Plan, Strategy


class Measurement(Protocol):
    """What HRL reads of a measured placement."""

    step_time_s: float
    oom: bool


#: HRL's environment: (graph, strategy, cluster, costs) -> a measurement of the strategy's step
Environment = Callable[[OpGraph, Strategy, Cluster, CostModel], Measurement]


class HRLError(UserError, ValueError):
    """HRL cannot train: no environment to measure its placements in."""


def op_features(graph: OpGraph, w: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Per-op inputs of the Grouper, standardised column by column."""
    n = graph.num_nodes
    cls = np.array(op_classes(graph.targets))
    cols = [
        (cls == "conv").astype(float), (cls == "gemm").astype(float), (cls == "other").astype(float),
        graph.free.astype(float),
        (graph.phase == 0).astype(float), (graph.phase == 1).astype(float), (graph.phase == 2).astype(float),
        np.log1p(graph.out_bytes.astype(float)), np.log1p(graph.flops), np.log1p(w * 1e6), np.log1p(mem),
        np.log1p(np.bincount(graph.dst, minlength=n).astype(float)), np.log1p(np.bincount(graph.src, minlength=n).astype(float)),
        np.arange(n) / max(n - 1, 1), graph.layer / max(int(graph.layer.max(initial=0)), 1),
    ]
    X = np.stack(cols, axis=1)
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


class Adam:
    """Adam on a dict of numpy parameters."""

    def __init__(self, params: dict[str, np.ndarray], lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            mh = self.m[k] / (1 - self.b1 ** self.t)
            vh = self.v[k] / (1 - self.b2 ** self.t)
            params[k] -= self.lr * mh / (np.sqrt(vh) + self.eps)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class HierarchicalPolicy:
    """Grouper (MLP -> groups) and Placer (tanh-RNN decoder -> devices) with REINFORCE gradients."""

    def __init__(self, n_feat: int, n_groups: int, n_dev: int, hidden: int, rng: np.random.Generator) -> None:
        self.G, self.D, self.H = n_groups, n_dev, hidden
        self.E = n_feat + 3

        def glorot(a: int, b: int) -> np.ndarray:
            lim = math.sqrt(6.0 / (a + b))
            return rng.uniform(-lim, lim, size=(a, b))

        self.p = {
            "g_w1": glorot(n_feat, hidden), "g_b1": np.zeros(hidden),
            "g_w2": glorot(hidden, n_groups), "g_b2": np.zeros(n_groups),
            "p_wx": glorot(self.E, hidden), "p_wh": glorot(hidden, hidden), "p_wd": glorot(n_dev + 1, hidden), "p_b": np.zeros(hidden),
            "p_wo": glorot(hidden, n_dev), "p_bo": np.zeros(n_dev),
        }

    # -- grouper
    def group(self, X: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        p = self.p
        h = np.tanh(X @ p["g_w1"] + p["g_b1"])
        prob = _softmax(h @ p["g_w2"] + p["g_b2"])
        u = rng.random(len(X))[:, None]
        g = (prob.cumsum(axis=1) < u).sum(axis=1)
        g = np.minimum(g, self.G - 1)
        return g, {"h": h, "prob": prob, "g": g}

    def group_grad(self, X: np.ndarray, cache: dict[str, Any], scale: float, grads: dict[str, np.ndarray]) -> None:
        """Accumulate ``scale`` x the gradient of log p(the sampled groups)."""
        p = self.p
        dz = -cache["prob"]
        dz[np.arange(len(X)), cache["g"]] += 1.0  # d log p / d logits
        dz *= scale
        grads["g_w2"] += cache["h"].T @ dz
        grads["g_b2"] += dz.sum(axis=0)
        dh = (dz @ p["g_w2"].T) * (1 - cache["h"] ** 2)
        grads["g_w1"] += X.T @ dh
        grads["g_b1"] += dh.sum(axis=0)

    # -- placer
    def place(self, emb: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        p = self.p
        T = len(emb)
        hs = np.zeros((T + 1, self.H))
        probs = np.zeros((T, self.D))
        acts = np.zeros(T, dtype=np.int64)
        prev = self.D  # "go" symbol
        pre_x = emb @ p["p_wx"] + p["p_b"]
        for t in range(T):
            hs[t + 1] = np.tanh(pre_x[t] + hs[t] @ p["p_wh"] + p["p_wd"][prev])
            pr = _softmax(hs[t + 1] @ p["p_wo"] + p["p_bo"])
            a = int(min((pr.cumsum() < rng.random()).sum(), self.D - 1))
            probs[t], acts[t], prev = pr, a, a
        return acts, {"hs": hs, "probs": probs, "acts": acts, "emb": emb}

    def place_grad(self, cache: dict[str, Any], scale: float, grads: dict[str, np.ndarray]) -> None:
        p = self.p
        hs, probs, acts, emb = cache["hs"], cache["probs"], cache["acts"], cache["emb"]
        T = len(acts)
        dlog = -probs.copy()
        dlog[np.arange(T), acts] += 1.0
        dlog *= scale
        grads["p_wo"] += hs[1:].T @ dlog
        grads["p_bo"] += dlog.sum(axis=0)
        dh_next = np.zeros(self.H)
        prevs = np.concatenate([[self.D], acts[:-1]]) if T else np.zeros(0, np.int64)
        for t in range(T - 1, -1, -1):
            dh = dlog[t] @ p["p_wo"].T + dh_next
            dpre = dh * (1 - hs[t + 1] ** 2)
            grads["p_wx"] += np.outer(emb[t], dpre)
            grads["p_b"] += dpre
            grads["p_wh"] += np.outer(hs[t], dpre)
            grads["p_wd"][prevs[t]] += dpre
            dh_next = dpre @ p["p_wh"].T


class HRL(Algorithm):
    """Hierarchical RL placer (grouper + placer, REINFORCE against the simulator).

    ``progress`` shows a bar over the samples; it is not a parameter of the result (not in
    :meth:`describe`).
    """

    graph_kind = "op"

    def __init__(
        self,
        name: str = "hrl",
        seed: int = 0,
        samples: int = 64,
        samples_per_step: int = 4,
        time_budget_s: float | None = None,
        num_groups: int | None = None,
        hidden: int = 32,
        lr: float = 0.05,
        baseline_decay: float = 0.9,
        failing_signal: float = 100.0,
        grad_bound: float = 1.0,
        progress: bool = False,
        environment: Environment | None = None,
    ) -> None:
        super().__init__(name, seed)
        self.samples = positive_int(samples, "algo.samples")
        self.k = positive_int(samples_per_step, "algo.samples_per_step")
        self.time_budget_s = optional(positive_number, time_budget_s, "algo.time_budget_s")
        self.num_groups = optional(positive_int, num_groups, "algo.num_groups")
        self.hidden = positive_int(hidden, "algo.hidden")
        self.lr = positive_number(lr, "algo.lr")
        self.bl_dec = number_in(baseline_decay, "algo.baseline_decay", 0.0, 1.0)
        self.failing_signal = non_negative_number(failing_signal, "algo.failing_signal")
        self.grad_bound = positive_number(grad_bound, "algo.grad_bound")
        self.progress = boolean(progress, "algo.progress")
        self.environment = environment

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "samples": self.samples, "samples_per_step": self.k, "time_budget_s": self.time_budget_s,
                "num_groups": self.num_groups, "hidden": self.hidden, "lr": self.lr, "baseline_decay": self.bl_dec,
                "failing_signal": self.failing_signal, "grad_bound": self.grad_bound}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        if self.environment is None:
            raise HRLError(f"{self.name} trains on measured step times and has no environment to measure them: set "
                           "algo.environment (conf/algo/hrl.yaml wires in the simulator) or pass environment=simulate")
        simulate = self.environment
        t_start = time.perf_counter()
        rng = np.random.default_rng(self.seed)
        n, D = graph.num_nodes, cluster.num_devices
        G = int(self.num_groups) if self.num_groups else min(256, 20 * D)
        w, _ = static_costs(graph, cluster, costs)
        mem = np.asarray(costs.memory(graph), dtype=np.float64)
        X = op_features(graph, w, mem)
        pol = HierarchicalPolicy(X.shape[1], G, D, self.hidden, rng)
        opt = Adam(pol.p, self.lr)
        order = np.arange(n)
        fail_cost = math.sqrt(self.failing_signal)
        baseline = fail_cost
        w_tot, m_tot = max(w.sum(), 1e-30), max(mem.sum(), 1.0)
        best: tuple[float, np.ndarray, bool, float] | None = None  # (cost, device, oom, step time)
        history: list[tuple[float, bool]] = []
        used = 0
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.samples, desc=f"hrl {graph.meta.get('model', '')}", unit="sample", leave=False)
        while used < self.samples:
            if self.time_budget_s is not None and time.perf_counter() - t_start > self.time_budget_s:
                break
            batch = []
            for _ in range(min(self.k, self.samples - used)):
                groups, gcache = pol.group(X, rng)
                present = np.unique(groups)
                cnt = np.bincount(groups, minlength=G)[present]
                feat = np.zeros((len(present), X.shape[1]))
                idx = np.searchsorted(present, groups)
                np.add.at(feat, idx, X)
                feat /= cnt[:, None]
                extra = np.stack([
                    np.log1p(cnt) / math.log1p(n),
                    np.bincount(idx, weights=w, minlength=len(present)) / w_tot,
                    np.bincount(idx, weights=mem, minlength=len(present)) / m_tot,
                ], axis=1)
                emb = np.concatenate([feat, extra], axis=1)
                acts, pcache = pol.place(emb, rng)
                device = follow_colocation(graph, acts[idx])
                res = simulate(graph, Strategy.placement(device, order), cluster, costs)
                cost = fail_cost if res.oom else math.sqrt(res.step_time_s)
                history.append((res.step_time_s, bool(res.oom)))
                key = (bool(res.oom), res.step_time_s)
                if best is None or key < (best[2], best[3]):
                    best = (cost, device, bool(res.oom), res.step_time_s)
                batch.append((cost, gcache, pcache))
                used += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(best=f"{best[3]:.4g}s", oom=best[2])
            # REINFORCE: minimise E[(cost - baseline) * log p]
            grads = {k: np.zeros_like(v) for k, v in pol.p.items()}
            for cost, gcache, pcache in batch:
                scale = -(cost - baseline) / len(batch)  # ascent on -cost: gradient of -(c-b) log p
                pol.group_grad(X, gcache, scale, grads)
                pol.place_grad(pcache, scale, grads)
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            if norm > self.grad_bound:
                for g in grads.values():
                    g *= self.grad_bound / norm
            for g in grads.values():  # Adam minimises: hand it the negated ascent direction
                np.negative(g, out=g)
            opt.step(pol.p, grads)
            mean_cost = float(np.mean([b[0] for b in batch]))
            baseline = self.bl_dec * baseline + (1 - self.bl_dec) * mean_cost
        if bar is not None:
            bar.close()
        if best is None:  # the time budget ran out before the first sample: everything on device 0
            device = follow_colocation(graph, np.zeros(n, dtype=np.int64))
            best = (fail_cost, device, True, float("nan"))
        wall = time.perf_counter() - t_start
        steps = np.array([h[0] for h in history]) if history else np.zeros(0)
        ooms = np.array([h[1] for h in history], dtype=bool) if history else np.zeros(0, bool)
        info = {
            "samples": used,
            "sample_budget": self.samples,
            "search_budget_s": self.time_budget_s,
            "search_complete": used >= self.samples,
            "wall_time_s": wall,
            "num_groups": G,
            "best_step_time_s": best[3],
            "best_oom": best[2],
            "oom_samples": int(ooms.sum()),
            "first_step_time_s": float(steps[0]) if len(steps) else None,
            "objective_s": best[3],
        }
        return Plan(graph, Strategy.placement(best[1], order), info=info)
