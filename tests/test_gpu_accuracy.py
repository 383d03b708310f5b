"""``python -m experiments gpu_accuracy``: published GPU throughputs beside simulated ones."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from experiments import gpu_accuracy
from experiments._gpu_fit_spread import band_reading, readme_lines, seed_frames, spread_table


def test_quick_run_writes_its_tables_and_figure(tmp_path):
    assert gpu_accuracy.main(["--quick", "--out", str(tmp_path)]) == 0
    for name in ("throughput.csv", "scaling.csv", "kernel_fit.csv", "predicted_vs_published.png", "README.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    tp = pd.read_csv(tmp_path / "throughput.csv")
    assert sorted(tp["id"]) == sorted(gpu_accuracy.QUICK_ROWS)
    for costs in gpu_accuracy.COSTS:
        assert (tp[f"{costs}_status"] == "ok").all()
        r = tp[f"{costs}_ratio"].to_numpy()
        assert np.isfinite(r).all() and (r > 0).all()
    # the published column is the CSV's figure, untouched; the simulated ones differ per model
    pub = pd.read_csv(gpu_accuracy.PUBLISHED).set_index("id")
    assert (tp.set_index("id")["published"] == pub.loc[tp["id"], "published"]).all()
    assert not np.allclose(tp["calibrated_sim"], tp["analytical_sim"])
    sc = pd.read_csv(tmp_path / "scaling.csv")
    row = sc.set_index("id").loc["p100x4_resnet50_b64"]
    assert row["single_id"] == "p100_resnet50_b64"
    assert 0 < row["calibrated_eff"] <= 1 + 1e-9  # data parallelism never beats k single GPUs
    kf = pd.read_csv(tmp_path / "kernel_fit.csv")
    assert set(kf["class"]) >= {"gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "rnn"}


def test_scaling_matches_the_single_gpu_row_of_the_same_per_gpu_batch():
    tp = pd.DataFrame([
        {"id": "p100_resnet50_b64", "device": "P100-SXM2", "gpus": 1, "batch_per_gpu": 64, "precision": "FP32", "published": 200.0,
         "calibrated_sim": 210.0, "analytical_sim": 180.0},
        {"id": "p100_resnet50_b32", "device": "P100-SXM2", "gpus": 1, "batch_per_gpu": 32, "precision": "FP32", "published": 150.0,
         "calibrated_sim": 160.0, "analytical_sim": 140.0},
        {"id": "p100x4_resnet50_b64", "device": "P100-SXM2", "gpus": 4, "batch_per_gpu": 256, "precision": "FP32", "published": 720.0,
         "calibrated_sim": 840.0, "analytical_sim": 700.0},
    ])
    sc = gpu_accuracy.scaling_table(tp).set_index("id")
    row = sc.loc["p100x4_resnet50_b64"]
    assert row["single_id"] == "p100_resnet50_b64"
    assert row["published_eff"] == pytest.approx(0.9)
    assert row["calibrated_eff"] == pytest.approx(1.0)
    assert row["calibrated_points"] == pytest.approx(10.0)


def test_batch_table_splits_fixed_from_per_sample_time():
    """Rows built from known fixed and per-sample times give them back; a workload at one batch
    size, a multi-GPU row and a tokens/s row are left out."""
    def row(i, batch, gpus=1, unit="img/s", pub=(0.020, 0.004), cal=(0.005, 0.004), ana=(0.001, 0.006)):
        tput = {k: batch / (f + s * batch) for k, (f, s) in (("published", pub), ("calibrated_sim", cal), ("analytical_sim", ana))}
        return {"id": i, "device": "P100-SXM2", "gpus": gpus, "batch_per_gpu": batch, "precision": "FP32", "unit": unit,
                "calibrated_status": "ok", **tput}
    tp = pd.DataFrame([row("p100_resnet50_b64", 64), row("p100_resnet50_b32", 32), row("p100_resnet50_b16", 16),
                       row("p100_vgg16_b64", 64), row("p100x4_resnet50_b64", 256, gpus=4),
                       row("v100_tbig_b80", 80, unit="tok/s"), row("v100_tbig_b40", 40, unit="tok/s")])
    bt = gpu_accuracy.batch_table(tp).set_index("workload")
    assert list(bt.index) == ["resnet50"] and bt.loc["resnet50", "batches"] == "16/32/64"
    assert bt.loc["resnet50", "published_fixed_ms"] == pytest.approx(20.0)
    assert bt.loc["resnet50", "published_per_sample_ms"] == pytest.approx(4.0)
    assert bt.loc["resnet50", "calibrated_fixed_ms"] == pytest.approx(5.0)
    assert bt.loc["resnet50", "analytical_per_sample_ms"] == pytest.approx(6.0)
    assert "15-15 ms more fixed time" in "\n".join(gpu_accuracy._batch_lines(bt.reset_index()))


def test_unknown_row_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as e:
        gpu_accuracy.main(["--rows", "no_such_row"])
    assert e.value.code == 2
    assert "unknown published row 'no_such_row'" in capsys.readouterr().err


def test_a_negative_fit_seed_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_accuracy.main(["--quick", "--fit-seeds", "2", "-1", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--fit-seeds takes seeds >= 0" in err and "got -1" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _tp(ratios: dict[str, float]) -> pd.DataFrame:
    """A throughput table with the given calibrated ratios (published 100 each, one GPU)."""
    return pd.DataFrame([{"id": i, "device": "P100-SXM2", "gpus": 1, "batch_per_gpu": 64, "precision": "FP32", "unit": "img/s",
                          "published": 100.0, "calibrated_sim": 100.0 * r, "calibrated_ratio": r, "calibrated_status": "ok",
                          "analytical_sim": 100.0, "analytical_ratio": 1.0, "analytical_status": "ok"} for i, r in ratios.items()])


def test_fit_spread_puts_each_seed_beside_the_committed_table():
    """Per seed the verdict's figures come from that seed's simulations; each row's range spans
    its ratios under every table; a row that failed under a seed is not counted as a ratio."""
    tp = _tp({"p100_a_b64": 1.05, "p100_b_b64": 1.30, "p100_c_b64": 0.95})
    runs = pd.DataFrame([
        {"id": "p100_a_b64", "seed": 1, "throughput": 90.0, "status": "ok"},
        {"id": "p100_b_b64", "seed": 1, "throughput": 120.0, "status": "ok"},
        {"id": "p100_c_b64", "seed": 1, "throughput": float("nan"), "status": "not matched"},
        {"id": "p100_a_b64", "seed": 2, "throughput": 100.0, "status": "ok"},
        {"id": "p100_b_b64", "seed": 2, "throughput": 140.0, "status": "ok"},
        {"id": "p100_c_b64", "seed": 2, "throughput": 80.0, "status": "ok"},
    ])
    frames = seed_frames(tp, runs)
    assert sorted(frames) == [0, 1, 2] and frames[0] is tp
    per_seed = gpu_accuracy.per_seed_summary(frames).set_index("seed")
    assert per_seed.loc[0, "median_abs_error"] == pytest.approx(0.05)
    assert per_seed.loc[1, "rows"] == 2 and per_seed.loc[1, "within_25"] == 2
    assert per_seed.loc[2, "median_abs_error"] == pytest.approx(0.20) and per_seed.loc[2, "within_25"] == 2
    rng = spread_table(frames).set_index("id")
    assert rng.loc["p100_b_b64", "ratio_min"] == pytest.approx(1.2) and rng.loc["p100_b_b64", "ratio_max"] == pytest.approx(1.4)
    assert rng.loc["p100_c_b64", "ratio_min"] == pytest.approx(0.8)  # seed 1 failed there: not a ratio
    assert rng.loc["p100_b_b64", "seeds_within_25"] == 1
    text = "\n".join(readme_lines(per_seed.reset_index(), rng.reset_index()))
    assert "| 0 (committed) | 5.0 % |" in text and "from 5.0 % to 20.0 %" in text
    assert "10 % lies inside that band" in text and "(at most 10 % under 1 of them), and every row is within 25 % under 1" in text
    assert text.index("p100_c_b64 0.80-0.95x") < text.index("p100_a_b64 0.90-1.05x")  # the widest range (max / min) first


def test_band_reading_says_where_the_goal_lies():
    reading = band_reading
    assert "at or below 10 % under every split" in reading(6.0, 9.5)
    assert "exceeds 10 % under every split" in reading(10.5, 14.0)
    assert "inside that band" in reading(9.0, 11.0)


def test_serial_efficiency_runs_every_all_reduce_after_the_one_gpu_step():
    """With the steps and all-reduce times at hand, the scaling table adds the efficiency with no
    overlap, T1 / (T1 + all-reduces); the reading places each published efficiency against it."""
    tp = pd.DataFrame([
        {"id": "p100_vgg16_b64", "device": "P100-SXM2", "gpus": 1, "batch_per_gpu": 64, "precision": "FP32", "published": 100.0,
         "calibrated_sim": 100.0, "analytical_sim": 100.0, "calibrated_step_s": 0.64, "calibrated_allreduce_s": 0.0,
         "analytical_step_s": 0.64, "analytical_allreduce_s": 0.0},
        {"id": "p100x8nvl_vgg16_b64", "device": "P100-SXM2", "gpus": 8, "batch_per_gpu": 512, "precision": "FP32", "published": 600.0,
         "calibrated_sim": 800.0, "analytical_sim": 800.0, "calibrated_step_s": 0.64, "calibrated_allreduce_s": 0.16,
         "analytical_step_s": 0.64, "analytical_allreduce_s": 0.16},
    ])
    sc = gpu_accuracy.scaling_table(tp)
    row = sc.set_index("id").loc["p100x8nvl_vgg16_b64"]
    assert row["calibrated_eff"] == pytest.approx(1.0) and row["calibrated_eff_serial"] == pytest.approx(0.8)
    text = "\n".join(gpu_accuracy._overlap_lines(sc))
    assert "between the serial and the overlapped simulation on 0 of 1 rows, and below even the serial one on 1" in text
    assert "p100x8nvl_vgg16_b64 0.750 < 0.800" in text
    assert gpu_accuracy._overlap_lines(sc.drop(columns=["calibrated_eff_serial"])) == []


def test_written_figures_keep_the_precision_the_computation_supports(tmp_path):
    """A computed figure to 4 significant digits, an error fraction to 3 decimals, the published
    figure as published; two runs whose figures differ in their last bits (another CPU's exp and
    log, another BLAS's refit) write the same bytes."""
    df = pd.DataFrame({"id": ["a", "b"], "gpus": [1, 8], "published": [12345.678, 0.1],
                       "calibrated_sim": [1234.5678, float("nan")], "calibrated_ratio": [0.123456, 98765.4],
                       "median_abs_error": [0.0782646, 0.0483340], "worst": [0.31234, 1.5]})
    r = gpu_accuracy.rounded(df)
    assert r["published"].tolist() == [12345.678, 0.1] and r["gpus"].tolist() == [1, 8] and r["id"].tolist() == ["a", "b"]
    assert r["calibrated_sim"].iloc[0] == 1235.0 and np.isnan(r["calibrated_sim"].iloc[1])
    assert r["calibrated_ratio"].tolist() == [0.1235, 98770.0]
    assert r["median_abs_error"].tolist() == [0.078, 0.048] and r["worst"].tolist() == [0.312, 1.5]
    noisy = df.assign(calibrated_sim=df["calibrated_sim"] * (1 + 3e-12), median_abs_error=df["median_abs_error"] + 1e-5)
    gpu_accuracy.write_csv(df, tmp_path / "a.csv")
    gpu_accuracy.write_csv(noisy, tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()


def test_each_amp_row_runs_its_trainers_recipe():
    from experiments._gpu_precision import AMP_RECIPES, amp_recipe, row_precision

    src = "NVIDIA/DeepLearningExamples: PyTorch/{}/README.md"
    assert row_precision({"precision": "FP32", "source": src.format("Translation/GNMT")}) == "fp32"
    assert row_precision({"precision": "AMP", "source": src.format("Translation/GNMT")}) == "fp16_master"
    assert row_precision({"precision": "AMP", "source": src.format("Translation/Transformer")}) == "fp16_master"
    assert row_precision({"precision": "AMP/FP16", "source": src.format("Classification/ConvNets/resnet50v1.5")}) == "amp_fp16"
    assert row_precision({"precision": "AMP", "source": "another trainer"}) == "amp_fp16"  # autocast by default
    # every mixed-precision row of the committed data names a trainer whose recipe is known
    pub = pd.read_csv(gpu_accuracy.PUBLISHED)
    amp = pub[pub["precision"].str.contains("AMP|FP16")]
    assert len(amp) >= 3
    for source in amp["source"]:
        assert any(re.search(p, source) for p, _, _ in AMP_RECIPES), source
        assert amp_recipe(source)[1]


def test_changes_say_which_verdicts_moved_and_why():
    from experiments._gpu_changes import band, changes_lines, changes_table

    assert [band(r) for r in (1.05, 0.8, 1.3, 0.74)] == ["within 10 %", "within 25 %", "beyond 25 %", "beyond 25 %"]
    before = pd.DataFrame({"id": ["a", "b", "c", "d"], "calibrated_ratio": [1.02, 0.47, 0.77, 1.0]})
    after = pd.DataFrame({"id": ["a", "b", "c", "d"], "calibrated_ratio": [1.16, 0.50, 0.771, float("nan")],
                          "simulated_precision": ["fp16_master", "fp16_master", "amp_fp16", "fp32"]})
    ch = changes_table(before, after)
    assert list(ch["id"]) == ["a", "b"]  # c moved by less than 0.5 %, d has no figure
    assert list(ch["band_after"]) == ["within 25 %", "beyond 25 %"]
    assert ch["why"].str.contains("simulated as fp16_master, was amp_fp16").all()
    text = "\n".join(changes_lines(before, after))
    assert "a (within 10 % -> within 25 %)" in text and "b (" not in text.split("Verdicts that moved:")[1]
    assert "No earlier" in "\n".join(changes_lines(None, after))
    # the same precision: an all-reduce time that moved is the reason, else the kernel costs
    before = pd.DataFrame({"id": ["a", "b"], "calibrated_ratio": [1.0, 1.0], "simulated_precision": ["fp32", "fp32"],
                           "calibrated_allreduce_s": [0.010, 0.0]})
    after = pd.DataFrame({"id": ["a", "b"], "calibrated_ratio": [1.2, 1.2], "simulated_precision": ["fp32", "fp32"],
                          "calibrated_allreduce_s": [0.004, 0.0]})
    assert changes_table(before, after)["why"].str.startswith(("all-reduce costs", "kernel costs")).tolist() == [True, True]
    assert changes_table(before, after)["why"].tolist()[1] == "kernel costs (calibration)"
    assert changes_table(before, after)["why"].tolist()[0].startswith("all-reduce costs (10 -> 4 ms")
