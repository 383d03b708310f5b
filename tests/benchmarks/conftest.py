"""Benchmarks are opt-in: ``pytest tests/benchmarks -m bench``."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.bench)
