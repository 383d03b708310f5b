"""``python -m harness.nccl_fit``: fit the fabric's NCCL calibration to nccl-tests measurements of A100 and H100 systems (:mod:`harness.app.nccl_fit`)."""

from harness.app.nccl_fit import main

if __name__ == "__main__":
    raise SystemExit(main())
