"""The README's options table lists exactly what conf/ registers: a file added to or removed from
``conf/<group>/`` without the table following (or the other way round) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("model", "cluster", "algo", "costs", "sim")


def table_names(group: str) -> set[str]:
    """The option names in the README table's row for ``group``: every bare name inside its
    backticks (keys with ``=`` or ``.`` and paths are examples, not options)."""
    rows = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith(f"| `{group}` |")]
    assert len(rows) == 1, f"README.md has {len(rows)} rows for the {group} group in its options table"
    cell = re.split(r"(?<!\\)\|", rows[0])[2]  # a cell ends at a pipe that is not escaped
    return {tok for code in re.findall(r"`([^`]+)`", cell) for tok in code.split() if re.fullmatch(r"[a-z][a-z0-9_]*", tok)}


@pytest.mark.parametrize("group", GROUPS)
def test_the_options_table_lists_every_config_file(group):
    files = {p.stem for p in (REPO / "conf" / group).glob("*.yaml")}
    listed = table_names(group)
    assert not files - listed, f"conf/{group}/ files missing from README.md's options table: {sorted(files - listed)}"
    assert not listed - files, f"README.md's options table lists {group} options without a conf/{group}/ file: {sorted(listed - files)}"
