"""Hand-made scheduling cases shared by the list-scheduler tests: the 10-task example of
Topcuoglu, Hariri and Wu (IEEE TPDS 2002, Fig. 2) on three processors, and a cost model that
reads computation costs from a table."""

from __future__ import annotations

import numpy as np

from harness.core.cluster import Cluster, Device, DeviceSpec, Link
from harness.core.costs import AnalyticalCostModel

# computation cost of task i on processor P1, P2, P3 (Fig. 2b)
W = np.array([
    [14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10],
    [13, 16, 9], [7, 15, 11], [5, 11, 14], [18, 12, 20], [21, 7, 16],
], dtype=float)
# (src, dst, communication cost), tasks numbered from 0
EDGES = [
    (0, 1, 18), (0, 2, 12), (0, 3, 9), (0, 4, 11), (0, 5, 14), (1, 7, 19), (1, 8, 16), (2, 6, 23),
    (3, 7, 27), (3, 8, 23), (4, 8, 13), (5, 7, 15), (6, 9, 17), (7, 9, 11), (8, 9, 13),
]


class TableCosts(AnalyticalCostModel):
    """Computation costs from a table (tasks x devices); transfers: bytes / 1 B/s."""

    def __init__(self, cluster: Cluster, table: np.ndarray) -> None:
        super().__init__(cluster, launch_us=0.0)
        self.table = table

    def node_times(self, graph, device, fraction=1.0):
        return self.table[:, device] * fraction

    def compute_time(self, graph, node, device, fraction=1.0):
        return float(self.table[node, device] * fraction)


def three_processors() -> Cluster:
    """P1, P2, P3: three device kinds, a link per ordered pair at 1 byte/s, no latency."""
    devs = [Device(i, f"P{i + 1}", DeviceSpec(f"P{i + 1}", {"float32": 1e12}, 1e12, 2**40), 0) for i in range(3)]
    links, routes = [], [[() for _ in range(3)] for _ in range(3)]
    for a in range(3):
        for b in range(3):
            if a != b:
                routes[a][b] = (len(links),)
                links.append(Link(len(links), f"P{a + 1}->P{b + 1}", "link", 1.0, 0.0))
    return Cluster("topcuoglu", devs, links, routes)
