"""``python -m harness.calibrate``: calibrate a CPU "device" and the gloo link between two of them on this machine. (:mod:`harness.app.calibrate`)."""

from harness.app.calibrate import main

if __name__ == "__main__":
    raise SystemExit(main())
