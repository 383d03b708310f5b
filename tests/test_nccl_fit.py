"""The NCCL calibration of the fabric (harness/app/nccl_fit.py, nccl_samples.py and the committed
harness/data/nccl_calibration.json): every measured row accounted for, a seeded split, the fit
recovering known factors, the committed table reproducible, and the calibrated fabric within its
held-out error of the measurements it is judged on."""

from __future__ import annotations

import csv
import math

import pytest

from harness.app import nccl_fit
from harness.app.nccl_samples import CLASSES, NCCL_CSV, PLATEAU_BYTES, Left, Sample, load, number
from harness.core.fabric import Group, collective_time, fabric_of
from harness.core.nccl_calibration import OPA_NET, load_table
from tests.helpers import preset_cluster

SAMPLES, LEFT = load()
TABLE = load_table()
CSV_ROWS = list(csv.DictReader(NCCL_CSV.open()))


def busbw(t: float, nbytes: float, p: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (GB/s)."""
    return nbytes / t * 2 * (p - 1) / p / 1e9


def test_every_row_is_a_sample_or_a_reason():
    rows = sorted([s.row for s in SAMPLES] + [x.row for x in LEFT])
    assert rows == list(range(len(CSV_ROWS))) and len(CSV_ROWS) == 270
    assert all(isinstance(x, Left) and len(x.reason) > 10 for x in LEFT)
    for s in SAMPLES:
        assert isinstance(s, Sample) and s.cls in CLASSES and s.use in ("fit", "check")
        assert math.isfinite(s.time_s) and s.time_s > 0 and s.nbytes > 0 and s.ranks >= 2
    assert {s.cls for s in SAMPLES} == set(CLASSES)


def test_rows_become_the_measured_seconds():
    """A timed row keeps its time; a bus-bandwidth row is bytes x 2(n-1)/n / busbw; a plateau is
    taken at PLATEAU_BYTES."""
    by_row = {s.row: s for s in SAMPLES}
    timed = by_row[24]  # OCI A100, 1 GiB, 8166.8 us
    assert timed.time_s == pytest.approx(number(CSV_ROWS[24]["time_us"]) * 1e-6)
    nvls = by_row[103]  # H200 NVLS, 16 GiB, 480 GB/s
    assert busbw(nvls.time_s, nvls.nbytes, 8) == pytest.approx(480.0) and nvls.nvls
    slide = by_row[112]  # NVLink3 (A100), 232 GB/s, no size
    assert slide.nbytes == PLATEAU_BYTES and busbw(slide.time_s, slide.nbytes, 8) == pytest.approx(232.0)
    assert number("~96 (peak), 84.8 (avg)") == 96.0 and math.isnan(number(""))


def test_split_is_seeded_stratified_and_never_trains_on_checks():
    a, b = nccl_fit.split(SAMPLES, 0), nccl_fit.split(SAMPLES, 0)
    assert a == b and a != nccl_fit.split(SAMPLES, 1)
    assert all(SAMPLES[i].use == "fit" for i in a)
    for name in {s.system for s in SAMPLES}:
        idx = [i for i, s in enumerate(SAMPLES) if s.system == name and s.use == "fit"]
        if len(idx) >= 3:
            assert 0 < sum(i in a for i in idx) < len(idx), name  # both parts drawn from every stratum


def test_the_fit_recovers_known_factors():
    """Samples timed by the model itself under known factors: the fit finds factors that give the
    same times on every row, the held-out ones included."""
    truth = {"A100.bus_eff": 0.7, "H100.bus_eff": 0.85, "H100.nvls_eff": 0.55, "lat_scale": 1.8, "p2p_eff": 0.8,
             "net_eff": 0.9, "net_lat_scale": 2.2}
    synthetic = [Sample(s.row, s.cls, s.system, s.use, s.base, s.family, s.net, s.nvls, s.op, s.ranks, s.nbytes,
                        nccl_fit.predict(s, truth)) for s in SAMPLES]
    train = nccl_fit.split(synthetic, 0)
    got = nccl_fit.fit(synthetic, train)
    worst = max(abs(r["rel_error"]) for r in nccl_fit.error_rows(synthetic, got, train))
    assert worst < 0.01
    for k in ("A100.bus_eff", "H100.bus_eff", "H100.nvls_eff", "net_eff"):
        assert got[k] == pytest.approx(truth[k], rel=0.02), k


def test_the_committed_table_reproduces():
    """Refitting with the table's seed gives the same predictions (within 1 %, never its digits),
    and the committed held-out errors are those of its own parameters on its own split."""
    seed = TABLE["seed"]
    train = nccl_fit.split(SAMPLES, seed)
    refit = nccl_fit.fit(SAMPLES, train)
    for s in SAMPLES:
        assert nccl_fit.predict(s, refit) == pytest.approx(nccl_fit.predict(s, TABLE["params"]), rel=0.01), s.row
    classes = nccl_fit.by_class(nccl_fit.error_rows(SAMPLES, TABLE["params"], train))
    assert set(classes) == set(TABLE["classes"]) == set(CLASSES)
    for c, e in classes.items():
        want = TABLE["classes"][c]
        assert e["heldout_rows"] == want["heldout_rows"] > 0 and e["train_rows"] == want["train_rows"]
        assert e["heldout_median_abs_error"] == pytest.approx(want["heldout_median_abs_error"], abs=1e-9)
        fl = TABLE["floor"]["classes"][c]
        assert fl["heldout_median_min"] <= want["heldout_median_abs_error"] <= fl["heldout_median_max"]


def test_the_table_describes_the_systems_it_calibrates():
    systems = TABLE["systems"]
    assert set(systems) == {"A100/nvswitch", "H100/nvswitch", "ib_roce"}
    assert systems["A100/nvswitch"]["nvls_eff"] == 0.0 < systems["H100/nvswitch"]["nvls_eff"]
    for name in ("A100/nvswitch", "H100/nvswitch"):
        e = systems[name]
        assert 0 < e["bus_eff"] <= 1 and e["bus_GBps"] == pytest.approx(e["bus_eff"] * e["datasheet_GBps"])
        assert e["heldout"]["intra all-reduce"]["heldout_rows"] > 0
    assert 0 < systems["ib_roce"]["net_eff"] <= 1 and systems["ib_roce"]["heldout"]["inter-node"]["heldout_rows"] > 0


def test_a100_ring_all_reduce_at_1_gib_within_its_error():
    """DGX A100 (OCI's BM.GPU4.8 is one), 8 GPUs, 1 GiB: nccl-tests measured 230.08 GB/s; the
    calibrated fabric is within the class's held-out 90th-percentile error of it."""
    t = collective_time(fabric_of(preset_cluster("cluster=dgx_a100")), "all_reduce", 2 ** 30, Group(8))
    measured = number(CSV_ROWS[24]["busbw"])
    tol = TABLE["systems"]["A100/nvswitch"]["heldout"]["intra all-reduce"]["heldout_p90_abs_error"]
    assert measured == 230.08 and abs(measured / busbw(t, 2 ** 30, 8) - 1) <= tol
    datasheet = collective_time(fabric_of(preset_cluster("cluster=dgx_a100"), calibrated=False), "all_reduce", 2 ** 30, Group(8))
    assert abs(measured / busbw(datasheet, 2 ** 30, 8) - 1) > tol  # what the calibration fixed: 300 GB/s on the datasheet


def test_h100_all_reduce_with_and_without_nvls_within_its_error():
    """8 GPUs, 16 GiB, NVLink 4 NVSwitch: NVLS 480 GB/s, ring 367 GB/s (nccl-tests on the H200
    node, the H100's NVLink and NVSwitch), within the class's held-out 90th-percentile error."""
    tol = TABLE["classes"]["intra all-reduce"]["heldout_p90_abs_error"]
    for overrides, measured in ((["cluster=dgx_h100"], 480.0), (["cluster=dgx_h100", "cluster.intra.nvls=false"], 367.2)):
        t = collective_time(fabric_of(preset_cluster(*overrides)), "all_reduce", 2 ** 34, Group(8))
        assert abs(measured / busbw(t, 2 ** 34, 8) - 1) <= tol, overrides


def test_the_command_writes_its_report(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    assert nccl_fit.main(["--floor-seeds", "0", "--report", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 270 and sum(r["split"] == "left out" for r in rows) == len(LEFT)
    assert "inter-node" in capsys.readouterr().out


#: a small transformer (two blocks), planned on two nodes so that both hops are used
JOB = ["model=llm", "model.layers=2", "model.hidden=1024", "model.heads=16", "model.kv_heads=16", "model.ffn_hidden=4096", "model.seq_len=1024",
       "model.vocab=32000", "model.batch_size=16", "algo=megatron", "algo.tp=8", "algo.pp=1", "costs=analytical",
       "output.gantt=false", "output.trace=false", "output.worth=false"]


@pytest.mark.parametrize("cluster,intra,inter,nvls", [
    (["cluster=superpod_h100", "cluster.nodes=2"], "H100/nvswitch", "ib_roce", True),
    (["cluster=superpod_a100", "cluster.nodes=2"], "A100/nvswitch", "ib_roce", False),
    (["cluster=jean_zay_a100", "cluster.nodes=2"], "A100/nvswitch", OPA_NET, False),  # Omni-Path: BigScience's, no held-out rows
    (["cluster=jean_zay_a100", "cluster.nodes=2", "cluster/device=h100_sxm5"], "H100/nvswitch", "datasheet", False),
])
def test_a_jobs_result_names_its_fabric_calibration(cluster, intra, inter, nvls):
    from harness.app.compose import compose
    from harness.app.run import run

    rep = run(compose([*JOB, *cluster])).row["fabric_report"]
    assert (rep["intra"]["source"], rep["inter"]["source"], rep["intra"]["nvls_GBps"] is not None) == (intra, inter, nvls)
    assert ("heldout_error" in rep["inter"]) == (inter not in ("datasheet", OPA_NET))
    assert ("measurements" in rep["inter"]) == (inter == OPA_NET)
