"""PaSE parity: on PaSE's own four graphs (harness/core/zoo/pase_graphs.py, the fixtures), our
vertex elimination under costs=pase returns the optimum of PaSE's public code, as recorded in
results/pase_parity/pase_public_code.csv by ``python -m experiments pase_parity --pase-src``.
Where PaSE's scheduler does not finish (the Transformer at p = 32 and 64 runs out of memory on a
24 GiB machine), the reference is the optimum of PaSE's own cost tables, built by its code and
solved by our exact vertex elimination."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from algorithms.layer_tables import build_tables
from algorithms.pase import vertex_elimination
from harness.core.pase_costs import PaseCostModel
from harness.core.zoo import pase_graphs
from tests.helpers import REPO, make_cluster

REFERENCE = REPO / "results" / "pase_parity" / "pase_public_code.csv"
#: PaSE's graphs have no input vertices; ours add one per model input (they cost nothing)
PASE_NODES = {"alexnet": 14, "inception3": 219, "rnnlm": 4, "transformer": 204}
INPUTS = {"alexnet": 1, "inception3": 1, "rnnlm": 1, "transformer": 3}


def reference() -> dict[tuple[str, int], float]:
    """PaSE's optimum (FLOPs) per (graph, p): its scheduler's where its run finished, else that of
    its own cost tables solved exactly (``tables_optimum``), where recorded."""
    df = pd.read_csv(REFERENCE)
    out = {}
    for r in df.itertuples():
        tables = float(getattr(r, "tables_optimum", math.nan))
        value = float(r.total_cost) if r.status == "ok" else tables
        if not math.isnan(value):
            out[(r.graph, int(r.p))] = value
    return out


def test_pases_scheduler_and_its_tables_solved_by_our_dp_agree_where_both_exist():
    df = pd.read_csv(REFERENCE)
    if "tables_optimum" not in df:
        pytest.skip("the reference records no tables_optimum")
    both = df[(df.status == "ok") & df.tables_optimum.notna()]
    assert len(both) and ((both.total_cost / both.tables_optimum - 1).abs() <= 1e-9).all()


def points() -> list:
    return [pytest.param(g, p, id=f"{g}-p{p}") for (g, p) in sorted(reference())]


def test_the_reference_covers_every_graph_at_p_4_and_8():
    ref = reference()
    assert all((g, p) in ref for g in pase_graphs.GRAPHS for p in (4, 8))


@pytest.mark.parametrize("graph", sorted(pase_graphs.GRAPHS))
def test_the_fixture_graphs_have_pases_vertices_plus_their_inputs(graph):
    lg = pase_graphs.GRAPHS[graph](128)
    assert lg.num_nodes == PASE_NODES[graph] + INPUTS[graph]
    assert sum(k == "input" for k in lg.kinds) == INPUTS[graph]


@pytest.mark.parametrize("graph, p", points())
def test_our_optimum_is_pases(graph, p):
    lg = pase_graphs.GRAPHS[graph](128)
    cl = make_cluster(p)
    costs = PaseCostModel(cl)
    _, value, _ = vertex_elimination(build_tables(lg, cl, costs))
    assert value * costs.peak_flops == pytest.approx(reference()[(graph, p)], rel=1e-9)


def test_the_runner_reads_pases_output_and_names_why_a_run_failed(tmp_path):
    from experiments.pase_parity import failure, run_pase

    src = tmp_path / "pase"
    src.mkdir()
    (src / "scheduler.py").write_text(
        "import sys\n"
        "g = sys.argv[sys.argv.index('-g') + 1]\n"
        "if g == 'alexnet':\n"
        "    print('Processing time:  0:01:02.500000')\n"
        "    print('Total cost: 97098296512.00')\n"
        "else:\n"
        "    raise MemoryError('Unable to allocate 3.89 GiB')\n")
    import sys

    ok = run_pase(src, sys.executable, "alexnet", 8, 60, tmp_path / "logs")
    assert (ok["status"], ok["total_cost"], ok["processing_s"]) == ("ok", 97098296512.0, 62.5)
    bad = run_pase(src, sys.executable, "transformer", 64, 60, tmp_path / "logs")
    assert bad["status"] == "failed (exit 1): MemoryError: Unable to allocate 3.89 GiB" and math.isnan(bad["total_cost"])
    assert (tmp_path / "logs" / "transformer_p64.log").read_text().count("MemoryError") >= 1
    assert failure(-9, "") == "killed by signal 9 (the kernel's out-of-memory killer)"


def test_pases_own_cost_tables_are_read_and_solved_exactly(tmp_path):
    import sys

    from experiments.pase_parity import solve_pase_tables

    src = tmp_path / "pase"
    src.mkdir()
    (src / "graph.py").write_text(
        "import networkx as nx, pandas as pd\n"
        "def CreateGraph(name, b, m, p, flops, bw):\n"
        "    G = nx.DiGraph()\n"
        "    G.add_node(0, costs=pd.Series([1.0, 5.0]))\n"
        "    G.add_node(1, costs=pd.Series([4.0, 2.0]))\n"
        "    idx = pd.MultiIndex.from_product([[0, 1], [0, 1]])\n"
        "    G.add_edge(0, 1, costs=pd.Series([0.0, 10.0, 10.0, 0.0], index=idx))\n"
        "    return G\n")
    assert solve_pase_tables(src, sys.executable, "toy", 4) == 5.0  # (0, 0): 1 + 4 + 0
