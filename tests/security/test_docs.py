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


def _rows_match_tests(section: str, pattern: str) -> dict[str, tuple[str, str]]:
    """The section's rows, after checking they name exactly the ids the tests use."""
    tested = _ids(pattern)
    rows = doc_table(section)
    assert tested, f"no test matches {pattern!r}"
    assert tested - set(rows) == set(), f"tested but without a row in {DOC} ({section}): {sorted(tested - set(rows))}"
    assert set(rows) - tested == set(), f"rows of {section} without a test: {sorted(set(rows) - tested)}"
    return rows


@pytest.mark.timeout(10)
def test_every_case_is_documented():
    rows = _rows_match_tests("Escape catalogue", r'@case\("([a-z0-9-]+)"\)')
    assert all(outcome == "denied" for outcome, _ in rows.values()), rows


@pytest.mark.timeout(10)
def test_every_limit_is_documented():
    _rows_match_tests("Limits", r'check_limit\("([a-z0-9-]+)"')
