"""The app ring: the job runner behind ``python -m harness`` (``run``, ``jobs``, ``compose``,
``worth``), the tools that read its outputs (``collect``, ``compare``) and the measurement
tools that write what the core reads (``profile``, ``calibrate`` + ``link_probes``,
``kernel_fit``).  It may import the core, ``algorithms`` and ``simulators``; nothing below it
imports it (tests/test_layering.py)."""
