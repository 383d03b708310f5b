"""``python -m harness``: the Hydra shell around :func:`harness.run.run`."""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.run import format_summary, run, write_outputs

log = logging.getLogger("harness")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    outdir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run(cfg, on_plan=lambda plan: plan.strategy.save(outdir / "strategy.json"))
    except Exception as e:
        record = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "overrides": list(HydraConfig.get().overrides.task)}
        (outdir / "error.json").write_text(json.dumps(record, indent=1))
        raise
    write_outputs(result, outdir, cfg)
    if not cfg.output.get("quiet", False):
        print(format_summary(result.row))
        print(f"outputs in {outdir}")
    log.info("step %.6g s, search %.3g s -> %s", result.row["step_time_s"], result.row["search_seconds"], outdir)
    return float(result.row["step_time_s"])


if __name__ == "__main__":
    main()
