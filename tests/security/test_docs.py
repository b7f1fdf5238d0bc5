"""docs/security.md and the tests agree: every catalogue case and every
limit the tests record has its row, and every row has its test."""
from __future__ import annotations

import re

import pytest

from sechelpers import DOC, HERE, doc_table


def _ids(pattern: str) -> set[str]:
    out: set[str] = set()
    for path in HERE.glob("test_*.py"):
        out |= set(re.findall(pattern, path.read_text()))
    return out


@pytest.mark.timeout(10)
def test_every_case_is_documented():
    tested = _ids(r'@case\("([a-z0-9-]+)"\)')
    rows = doc_table("Escape catalogue")
    assert tested, "no @case found"
    assert tested - set(rows) == set(), f"cases without a row in {DOC}: {sorted(tested - set(rows))}"
    assert set(rows) - tested == set(), f"rows without a test: {sorted(set(rows) - tested)}"
    assert all(outcome == "denied" for outcome, _ in rows.values()), rows


@pytest.mark.timeout(10)
def test_every_limit_is_documented():
    tested = _ids(r'check_limit\("([a-z0-9-]+)"')
    rows = doc_table("Limits")
    assert tested, "no check_limit found"
    assert tested - set(rows) == set(), f"limits without a row in {DOC}: {sorted(tested - set(rows))}"
    assert set(rows) - tested == set(), f"rows without a test: {sorted(set(rows) - tested)}"
