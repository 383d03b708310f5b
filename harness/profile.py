"""``python -m harness.profile``: operator profiler: measure every distinct op of a training step on a real device. (:mod:`harness.app.profile`)."""

from harness.app.profile import main

if __name__ == "__main__":
    raise SystemExit(main())
