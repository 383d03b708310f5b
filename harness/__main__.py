"""``python -m harness``: the Hydra shell around :func:`harness.run.run`.

In a sweep (``-m``), a job whose config hash already has a ``result.json`` anywhere under
the sweep dir is skipped (re-run a sweep with the same ``hydra.sweep.dir`` to resume it;
``resume=false`` forces every job), and a job that fails writes ``error.json`` with its
traceback and lets the other jobs run.  A single run that fails exits non-zero.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.run import config_hash, format_summary, run, write_outputs

log = logging.getLogger("harness")


def finished_job(sweep_dir: Path, digest: str) -> Path | None:
    """A result.json under ``sweep_dir`` written by a job with this config hash."""
    for f in sorted(sweep_dir.glob("**/result.json")):
        try:
            if json.loads(f.read_text()).get("config_hash") == digest:
                return f
        except (OSError, json.JSONDecodeError):
            continue
    return None


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    outdir = Path(hc.runtime.output_dir)
    sweeping = hc.mode == RunMode.MULTIRUN
    digest = config_hash(cfg)
    if sweeping and cfg.get("resume", True):
        done = finished_job(Path(hc.sweep.dir), digest)
        if done is not None:
            log.info("skipping: this config (hash %s) already has %s", digest, done)
            return float(json.loads(done.read_text())["step_time_s"])
    try:
        result = run(cfg, on_plan=lambda plan: plan.strategy.save(outdir / "strategy.json"))
    except Exception as e:
        record = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                  "overrides": list(hc.overrides.task), "config_hash": digest}
        (outdir / "error.json").write_text(json.dumps(record, indent=1))
        if not sweeping:
            raise
        log.error("job failed (%s); error.json in %s; the sweep goes on", record["error"], outdir)
        return None
    write_outputs(result, outdir, cfg)
    stale = outdir / "error.json"
    if stale.exists():  # an earlier attempt of this job failed; this one did not
        stale.unlink()
    if not cfg.output.get("quiet", False):
        print(format_summary(result.row))
        print(f"outputs in {outdir}")
    log.info("step %.6g s, search %.3g s -> %s", result.row["step_time_s"], result.row["search_seconds"], outdir)
    return float(result.row["step_time_s"])


if __name__ == "__main__":
    main()
