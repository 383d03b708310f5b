"""``python -m harness.collect``: one table from a sweep (or any tree of job dirs). (:mod:`harness.app.collect`)."""

from harness.app.collect import main

if __name__ == "__main__":
    raise SystemExit(main())
