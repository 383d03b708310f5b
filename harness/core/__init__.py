"""The core ring: graph IR, capture and zoo, clusters, costs, strategy; it imports nothing of the
app ring (harness.*), algorithms, simulators or experiments (tests/test_layering.py)."""
