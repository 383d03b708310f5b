"""Benchmarks are opt-in: ``pytest tests/benchmarks -m bench``."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # this hook sees every collected item of the session: mark only the ones in this folder
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.bench)
