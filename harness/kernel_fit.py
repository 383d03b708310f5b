"""``python -m harness.kernel_fit``: fit the calibrated cost model's kernel efficiencies to DeepBench's GPU measurements. (:mod:`harness.app.kernel_fit`)."""

from harness.app.kernel_fit import main

if __name__ == "__main__":
    raise SystemExit(main())
