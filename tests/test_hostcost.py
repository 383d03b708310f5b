"""What a message costs the CPU ranks' cores (simulators/hostcost.py): the model a cluster
selects, the charges to senders, first readers and transfers, the cold terms, the receive
that preempts a busy receiver, and the same model in both task-graph builders."""

from __future__ import annotations

import numpy as np
import pytest

from harness.app.compose import compose
from harness.core.cluster import ClusterError, build_cluster
from harness.core.costs import AnalyticalCostModel
from harness.core.strategy import ParallelConfig, Strategy
from simulators.hostcost import CpuHostCost, Messages, NoHostCost, cold_recv_s, cold_send_s, first_readers, host_cost
from simulators.layer_taskgraph import build_layer_taskgraph
from simulators.simulate import simulate
from simulators.taskgraph import COMPUTE, TRANSFER
from tests.helpers import DEVICE, make_cluster, make_graph
from tests.layer_cases import build

INTRA = {"topology": "mesh", "cls": "loopback", "bw_GBps": 1.0, "lat_us": 100.0}


def _cpu(lat_us: float = 100.0, **host_comm):
    """Two CPU devices over loopback, with ``host_comm`` where given."""
    meta = {"host_comm": host_comm} if host_comm else {}
    return build_cluster("cpu", DEVICE, gpus=2, intra={**INTRA, "lat_us": lat_us}, **meta)


def _hand_messages(sender: list[int]) -> Messages:
    """Tasks a..e (compute; device 0 runs a 1 ms, b 2 ms, c 3 ms, d 1 ms, device 1 e 0.5 ms)
    and four messages (tasks 5..8) sent by ``sender``."""
    dur = np.array([1e-3, 2e-3, 3e-3, 1e-3, 0.5e-3, 0, 0, 0, 0])
    return Messages(dur=dur, dev=np.array([0, 0, 0, 0, 1, -1, -1, -1, -1]), prio=np.array([0, 1, 2, 3, 0, 0, 0, 0, 0]),
                    compute=np.arange(9) < 5, task=np.arange(5, 9), sender=np.array(sender), nbytes=np.zeros(4, np.int64),
                    read_msg=np.arange(4), read_task=np.array([4, 4, 0, 4]))


def test_a_cluster_selects_its_model_by_host_comm():
    from hydra.utils import instantiate

    assert isinstance(host_cost(make_cluster(4)), NoHostCost)
    cpu2 = instantiate(compose(["cluster=cpu2"]).cluster, _convert_="all")
    model = host_cost(cpu2)
    h = cpu2.meta["host_comm"]
    assert isinstance(model, CpuHostCost) and model.recv_when == "always"
    assert (model.per_message_us, model.copy_GBps, model.send_cold_us, model.recv_cold_us) == (
        h["per_message_us"], h["copy_GBps"], h["send_cold_us"], h["recv_cold_us"])
    # a key no model takes, or another receive model, is refused - from the config, and from with_host_comm
    with pytest.raises(ClusterError, match="cluster.host_comm.send_us is not a key"):
        _cpu(per_message_us=10.0, copy_GBps=1.0, send_us=5.0)
    with pytest.raises(ValueError, match="host_comm.send_us is not a key"):
        host_cost(cpu2.with_host_comm({**h, "send_us": 5.0}))
    with pytest.raises(ValueError, match="recv_when must be 'always' or 'busy'"):
        host_cost(cpu2.with_host_comm({**h, "recv_when": "sometimes"}))


def test_the_null_model_changes_nothing():
    msgs = _hand_messages([3, 1, 4, 3])
    dur, steal = NoHostCost().charge(msgs)
    assert dur is msgs.dur and steal is None
    # and a GPU cluster's task graph has no steal
    g = make_graph(2, [(0, 1)], [1e9, 1e9], [10_000])
    cl = make_cluster(2)
    assert simulate(g, Strategy.placement([0, 1]), cl, AnalyticalCostModel(cl)).taskgraph.steal is None


def test_messages_of_a_task_graph():
    """Messages.of: a message's sender is its compute predecessor (none for a collective's
    result), its readers its compute successors; transfers not selected are no messages."""
    # tasks: 0, 1 compute; 2 a collective; 3 compute; 4 message from 0; 5 message from the
    # collective; 6 a transfer that is no message (a parameter read)
    kind_compute = np.array([True, True, False, True, False, False, False])
    src = np.array([0, 4, 4, 2, 5, 6])
    dst = np.array([4, 1, 3, 5, 3, 1])
    msgs = Messages.of(kind_compute, np.array([0, 1, 0, 1, -1, -1, -1]), np.array([0, 2, 0, 1, 0, 0, 0]), np.zeros(7),
                       np.array([0, 0, 0, 0, 100, 200, 300]), src, dst, np.array([False] * 4 + [True, True, False]))
    assert msgs.task.tolist() == [4, 5] and msgs.sender.tolist() == [0, -1] and msgs.nbytes.tolist() == [100, 200]
    assert sorted(zip(msgs.read_msg.tolist(), msgs.read_task.tolist())) == [(0, 1), (0, 3), (1, 3)]
    assert first_readers(msgs).tolist() == [3, 3]  # message 0: task 3 (prio 1) before task 1 (prio 2)


def test_a_transfer_costs_both_endpoints_compute():
    # the sender's producer and the receiver's first reader (in order) each pay per_message +
    # bytes / copy_bw of compute; the wire keeps the rest of the measured one-way time
    g = make_graph(4, [(0, 1), (0, 2), (1, 3)], [1e9] * 4, [4_000_000, 4_000_000, 1_000])
    strat = Strategy.placement([0, 1, 1, 1], [0, 2, 1, 3])  # node 2 reads the transfer first
    plain, host = _cpu(), _cpu(per_message_us=50.0, copy_GBps=4.0)
    a = simulate(g, strat, plain, AnalyticalCostModel(plain, launch_us=0.0)).taskgraph
    b = simulate(g, strat, host, AnalyticalCostModel(host, launch_us=0.0)).taskgraph
    extra = 50e-6 + 4_000_000 / 4e9
    comp = np.flatnonzero(a.kind == COMPUTE)
    np.testing.assert_allclose(b.dur[comp] - a.dur[comp], [extra if n in (0, 2) else 0.0 for n in a.node[comp]])
    tr = np.flatnonzero(a.kind == TRANSFER)
    np.testing.assert_allclose(b.dur[tr], np.maximum(a.dur[tr] - 2 * extra, 0.0))
    assert a.dur[tr[0]] == pytest.approx(100e-6 + 4_000_000 / 1e9) and b.dur[tr[0]] > 0 and b.steal is None


def test_a_receive_preempts_a_busy_receiver_only():
    """recv_when: busy - a message that arrives while its destination computes lengthens the
    running op by per_message_us + bytes / copy_GBps (gloo's receiving thread shares the core);
    one that arrives at an idle device costs its first reader recv_idle_us (0 by default)
    only, and the wire keeps the link's one-way time less the sender's part and that.
    recv_when: always charges the first reader."""
    host = {"per_message_us": 100.0, "copy_GBps": 4.0}
    nb = 40_000
    msg = 100e-6 + nb / 4e9
    for long_op in (True, False):
        # device 0: a -> (message) -> c on device 1, which first runs b (long or short)
        g = make_graph(3, [(0, 2)], [1e6, 5e9 if long_op else 1e5, 1e6], [nb])
        strat = Strategy.placement([0, 1, 1], [0, 0, 1])
        busy = _cpu(300.0, **host, recv_when="busy")
        res = simulate(g, strat, busy, AnalyticalCostModel(busy, launch_us=0.0))
        tg, tl = res.taskgraph, res.timeline
        a, b, c = (int(np.flatnonzero((tg.kind == COMPUTE) & (tg.node == i))[0]) for i in range(3))
        tr = int(np.flatnonzero(tg.kind == TRANSFER)[0])
        assert tg.dur[tr] == pytest.approx(300e-6 + nb / 1e9 - msg)  # the wire: the one-way time after the send
        arrival = tl.end[a] + tg.dur[tr]
        assert tl.end[tr] == pytest.approx(arrival)
        if long_op:  # b still runs when the message comes: b ends later by the receive's cost, c starts after it
            assert tl.start[b] < arrival < tl.start[b] + tg.dur[b]
            assert tl.end[b] == pytest.approx(tl.start[b] + tg.dur[b] + msg)
            assert res.device_busy_s[1] == pytest.approx(tg.dur[b] + tg.dur[c] + msg)
        else:  # device 1 idles when it comes: c starts at its arrival
            assert tl.end[b] == pytest.approx(tl.start[b] + tg.dur[b]) and tl.end[b] < arrival
            assert res.device_busy_s[1] == pytest.approx(tg.dur[b] + tg.dur[c])
        assert tl.start[c] == pytest.approx(max(arrival, tl.end[b]))
        always = _cpu(300.0, **host)
        tga = simulate(g, strat, always, AnalyticalCostModel(always, launch_us=0.0)).taskgraph
        assert tga.steal is None and tga.dur[c] == pytest.approx(tg.dur[c] + msg)
        assert tga.dur[tr] == pytest.approx(tg.dur[tr] - msg)
        # recv_idle_us: what a waiting receiver pays in its first reader, out of the wire and the steal
        idle = _cpu(300.0, **host, recv_when="busy", recv_idle_us=20.0)
        tgi = simulate(g, strat, idle, AnalyticalCostModel(idle, launch_us=0.0)).taskgraph
        assert tgi.dur[c] == pytest.approx(tg.dur[c] + 20e-6) and tgi.dur[tr] == pytest.approx(tg.dur[tr] - 20e-6)
        assert tgi.steal[tr] == pytest.approx(msg - 20e-6) and tg.steal[tr] == pytest.approx(msg)


def test_cold_sends_cost_the_sender_by_the_compute_since_its_previous_send():
    """send_cold_us / send_tau_us: a producer that sends pays cold (1 - exp(-gap / tau)) more,
    the gap being its device's compute (in schedule order) since the previous producer that
    sent, from the step's start for the first; a producer's second message pays nothing more
    (messages: d -> dev 1, b -> dev 1, e -> dev 0, d -> dev 2)."""
    cold = lambda gap: 200e-6 * (1 - np.exp(-gap / 2e-3))  # noqa: E731
    got = cold_send_s(_hand_messages([3, 1, 4, 3]), 200.0, 2000.0)
    np.testing.assert_allclose(got, [cold(4e-3), cold(3e-3), cold(0.5e-3), 0.0], rtol=1e-12, atol=1e-15)
    # a collective's result is sent by its members' communicators: not charged; no cold part, no charge
    assert cold_send_s(_hand_messages([-1, 1, 4, -1]), 200.0, 2000.0)[[0, 3]].tolist() == [0.0, 0.0]
    assert not cold_send_s(_hand_messages([3, 1, 4, 3]), 0.0, 2000.0).any()


def test_cold_receives_cost_the_reader_by_the_compute_since_the_previous_receive():
    """recv_cold_us / recv_tau_us: the first reader of a message pays cold (1 - exp(-gap /
    tau)) more, the gap being its device's compute (in schedule order) from the end of the
    previous first reader to this reader's start, from the step's start for the first; a
    reader of two messages pays once; through the builder the reader's duration carries it,
    under both receive models, and nothing else changes."""
    cold = lambda gap: 300e-6 * (1 - np.exp(-gap / 4e-3))  # noqa: E731
    readers = np.array([2, 0, 4, 2])  # c reads two messages, a one, e one
    # a: from the step's start to its start, 0; c: from a's end (1 ms) to c's start (3 ms); e: 0
    msgs = _hand_messages([3, 1, 4, 3])
    np.testing.assert_allclose(cold_recv_s(msgs, readers, 300.0, 4000.0), [cold(2e-3), 0.0, 0.0, 0.0], rtol=1e-12, atol=1e-15)
    assert not cold_recv_s(msgs, readers, 0.0, 4000.0).any()

    # a -> (message) -> c on device 1, which first runs b: c's gap is b's time
    g = make_graph(3, [(0, 2)], [1e6, 5e9, 1e6], [40_000])
    strat = Strategy.placement([0, 1, 1], [0, 0, 1])
    base = {"per_message_us": 50.0, "copy_GBps": 4.0, "recv_idle_us": 20.0}
    for when in ("always", "busy"):
        def tg_of(extra):
            c = _cpu(**base, recv_when=when, **extra)
            return simulate(g, strat, c, AnalyticalCostModel(c, launch_us=0.0)).taskgraph
        plain, warm = tg_of({}), tg_of({"recv_cold_us": 300.0, "recv_tau_us": 4000.0})
        b, c = (int(np.flatnonzero((plain.kind == COMPUTE) & (plain.node == i))[0]) for i in (1, 2))
        np.testing.assert_allclose(warm.dur[c] - plain.dur[c], cold(plain.dur[b]), rtol=1e-9)
        others = np.arange(len(plain.dur)) != c
        np.testing.assert_array_equal(warm.dur[others], plain.dur[others])


def test_a_layer_graph_pays_the_same_host_costs():
    """build_layer_taskgraph charges its transfers like build_taskgraph: the conv's forward
    sends its output to the elementwise layer on the other device (sender and first reader pay),
    and the gradient comes back (the elementwise backward sends, the conv backward reads);
    recv_when: busy gives the transfers a steal."""
    g = build(["input", "conv1d", "elementwise"], [(0, 1), (1, 2)], B=16, C=64, L=32)
    strat = Strategy(np.full(3, -1), np.arange(3), np.array([0, 0, 1]),
                     [ParallelConfig.make({}, [0]), ParallelConfig.make({}, [1])])
    plain, host = _cpu(2000.0), _cpu(2000.0, per_message_us=50.0, copy_GBps=4.0)
    a = build_layer_taskgraph(g, strat, plain, AnalyticalCostModel(plain))
    b = build_layer_taskgraph(g, strat, host, AnalyticalCostModel(host))
    tr = np.flatnonzero(a.kind == TRANSFER)
    assert len(tr) == 2 and b.steal is None
    extra = 50e-6 + a.nbytes[tr] / 4e9
    np.testing.assert_allclose(b.dur[tr], a.dur[tr] - 2 * extra)
    want = np.zeros(a.num_tasks)
    for t, x in zip(tr.tolist(), extra.tolist()):
        (sender,) = [s for s in range(a.num_tasks) if t in a.succ_idx[a.succ_ptr[s]:a.succ_ptr[s + 1]]]
        (reader,) = a.succ_idx[a.succ_ptr[t]:a.succ_ptr[t + 1]].tolist()
        assert a.kind[sender] == a.kind[reader] == COMPUTE and a.dev[sender] != a.dev[reader]
        want[sender] += x
        want[reader] += x
    comp = a.kind == COMPUTE
    np.testing.assert_allclose((b.dur - a.dur)[comp], want[comp])
    busy = _cpu(2000.0, per_message_us=50.0, copy_GBps=4.0, recv_when="busy")
    c = build_layer_taskgraph(g, strat, busy, AnalyticalCostModel(busy))
    np.testing.assert_allclose(c.steal[tr], extra)
    assert not np.delete(c.steal, tr).any()
