"""``python -m harness.block_probe --out DIR``: a decoder's step and kernels timed on a real GPU (:mod:`harness.app.block_probe`)."""

from harness.app.block_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
