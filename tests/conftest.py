"""Shared test plumbing. An enforcement test skipped on a kernel that has
Landlock is a defect: the session fails (CI must never go green that way)."""
from __future__ import annotations

import pytest

from landlock import abi_version

_skipped_enforcement: list[str] = []
_audit_ran: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "enforcement: checks real kernel enforcement; must not skip where Landlock exists")
    config.addinivalue_line("markers", "audit: switches the host's audit on (put back after): runs after every other test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Once audit was on, every task forked afterwards pays for a syscall
    # audit context until reboot: the rest of the suite runs before.
    items.sort(key=lambda item: item.get_closest_marker("audit") is not None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "enforcement" in report.keywords:
        _skipped_enforcement.append(report.nodeid)
    if report.when == "call" and not report.skipped and "audit" in report.keywords:
        _audit_ran.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _audit_ran:
        terminalreporter.write_line(
            f"audit: {len(_audit_ran)} test(s) switched the host's audit on; every setting was put back, but the "
            "kernel keeps audit 'ever enabled' until reboot: every process forked since pays for a system-call "
            "audit context (slower system calls)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_enforcement and abi_version() > 0:
        print(f"\nFAIL: {len(_skipped_enforcement)} enforcement test(s) skipped although the kernel "
              f"has Landlock ABI {abi_version()}:")
        for nodeid in _skipped_enforcement:
            print("  " + nodeid)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
