"""The FD-DPS experiments run end to end in --quick mode and write CSV, PNG and the README."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import fddps_fig4, fddps_fig5, fddps_table3, fddps_table5, fddps_table7

EXPERIMENTS = [("table3", fddps_table3), ("table5", fddps_table5), ("table7", fddps_table7), ("fig4", fddps_fig4), ("fig5", fddps_fig5)]


def test_quick_runs_write_their_artefacts(tmp_path):
    for name, mod in EXPERIMENTS:
        assert mod.main(["--quick", "--out", str(tmp_path)]) == 0, name
        assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.png").exists(), name
        assert (tmp_path / f"{name}.md").read_text().count(f"python -m experiments fddps_{name} --quick") == 1
    readme = (tmp_path / "README.md").read_text()
    for title in ("Table 3", "Table 5", "Table 7", "Figure 4", "Figure 5"):
        assert title in readme
    t5 = pd.read_csv(tmp_path / "table5.csv")
    assert set(t5["algo"]) == {"single_device", "data_parallel", "fastt", "mp_dps", "fddps"}
    assert (t5["step_time_s"] > 0).all() and set(t5["devices"]) == {1, 2, 4}
    # quick runs use other batch sizes than the paper: its numbers are not printed beside them
    assert "1.051" not in (tmp_path / "table5.md").read_text()


def test_models_option_and_paper_columns(tmp_path):
    assert fddps_table7.main(["--models", "vgg16:64", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "table7.md").read_text()
    assert "1.812" in text and "Conv2D, Conv2Dbp" in text  # the paper's FD-DPS time and split ops for VGG-16 (64)


@pytest.mark.parametrize("mod", [m for _, m in EXPERIMENTS])
def test_help(mod, capsys):
    with pytest.raises(SystemExit):
        mod.main(["--help"])
    assert "--quick" in capsys.readouterr().out
