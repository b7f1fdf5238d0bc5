"""Fixtures for the adversarial tests: the supervisor tests' `lab` and
`module_lab` (reused, not copied: tests/supervisor/conftest.py is loaded
here under another module name), and the check that the dedicated uids of
sechelpers.py are unused. Helpers live in sechelpers.py (a conftest is not
reliably importable).
"""
from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sechelpers import (DEDICATED_UIDS, IDENTITIES, KERNEL_ABI, ROOT, Identity, make_arena,  # noqa: E402
                        reset_writable, svconf)
from supervisor.daemon import procfs  # noqa: E402

# A session keyring of the test run's own, before any supervisor starts: the
# supervisors (and, without the fix, their children) share it, so a key
# planted in it is one a supervisor's session holds (test_escapes_keyring.py).
if ROOT:
    from landlock import enter
    enter.join_session_keyring()

# The supervisor tests' fixtures, under the same names.
lab = svconf.lab
module_lab = svconf.module_lab


def _uid_unused(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return False
    except KeyError:
        pass
    return not procfs.of_uid(uid)


# A skip here hides a row of docs/security.md that no test checked: on a
# kernel with Landlock only these reasons may skip (the machine has the
# feature switched off, or the run is not root); any other fails the run.
ALLOWED_SKIPS = ("machine setting:", "tests/security needs root")
_hidden_rows: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and KERNEL_ABI:  # (this conftest's hooks see only tests/security)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not reason.removeprefix("Skipped: ").startswith(ALLOWED_SKIPS):
            _hidden_rows.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _hidden_rows:
        print(f"\nFAIL: {len(_hidden_rows)} test(s) of tests/security skipped on a kernel with Landlock "
              "(their rows of docs/security.md went unchecked):")
        for line in _hidden_rows:
            print("  " + line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if str(i.fspath).startswith(str(HERE) + os.sep)]
    if not ROOT:
        skip = pytest.mark.skip(reason="tests/security needs root (uid switches, chown, setuid files)")
        for item in mine:
            item.add_marker(skip)
        return
    if not KERNEL_ABI:
        skip = pytest.mark.skip(reason="this kernel has no Landlock")
        for item in mine:
            if "enforcement" in item.keywords or item.fspath.basename == "test_limits.py":
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def dedicated_uids_unused() -> None:
    """The premise of the resource bombs: nobody else uses these uids."""
    if ROOT:
        busy = [u for u in DEDICATED_UIDS if not _uid_unused(u)]
        if busy:
            pytest.exit(f"uids {busy} are in use on this machine: tests/security needs them dedicated", 2)


# The attack arena, shared by the escape catalogue and the limits.
@pytest.fixture(scope="module")
def arena(module_lab):
    yield from make_arena(module_lab)


@pytest.fixture(params=IDENTITIES, ids=[i.name for i in IDENTITIES])
def ident(request) -> Identity:
    return request.param


@pytest.fixture
def fresh(arena, ident):
    reset_writable(arena, ident)
    yield arena
    reset_writable(arena, ident)
