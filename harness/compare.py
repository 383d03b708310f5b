"""``python -m harness.compare A B``: what differs between two runs or two sweeps (:mod:`harness.app.compare`)."""

from harness.app.compare import main

if __name__ == "__main__":
    raise SystemExit(main())
