"""Shared test plumbing. An enforcement test skipped on a kernel that has
Landlock is a defect: the session fails (CI must never go green that way).

`run_confined` and `confined_errno` confine a forked child and run one
operation in it: fork; in the child optionally run `before` (still
unconfined), landlock.apply(spec), then the operation; the outcome (value
or exception, and the Report) is pickled back through a pipe and the child
leaves with os._exit. The test process itself is never confined.
"""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import landlock
from landlock import abi_version
from supervisor.manifests import ids

CHILD_ALARM = 20  # seconds: no confined child outlives a hung test

# The suite's own table of dynamic uids (supervisor/manifests/ids.py), never the
# host's: every supervisor, learn and check the tests start inherits it.
_IDS_DIR = tempfile.mkdtemp(prefix="llsv-ids-")
os.environ[ids.TABLE_ENV] = os.path.join(_IDS_DIR, "dynamic-uids")

_skipped_enforcement: list[str] = []
_audit_ran: list[str] = []


@pytest.fixture(scope="module")
def host_audit() -> Iterator[Any]:
    """Audit as the `audit` tests need it (landlock.audit.Status before),
    everything put back afterwards."""
    from landlock import audit
    if "logging" not in landlock.support.probe().features:
        pytest.skip("machine setting: Landlock cannot log denials on this kernel (before 6.15)")
    # What `serve --audit` needs of the host (a container's network or PID
    # namespace, a bounding set without CAP_AUDIT_*): not the code's to fix.
    from supervisor.daemon import audit as supervisor_audit
    try:
        before = audit.status()
        audit.open_reader().close()
    except (OSError, audit.Unavailable) as e:
        pytest.skip(f"machine setting: audit records cannot be read here: {e}")
    if supervisor_audit.in_other_netns():
        pytest.skip("machine setting: not in the initial network namespace (audit records are not sent here)")
    # The suite relies on audit as supervisors do: a holder in their shared
    # record, so none of them puts it back under a test, nor the suite
    # under one of them; the last holder puts back what was changed.
    from supervisor.daemon import audit_settings
    audit_settings.hold({})
    try:
        yield before
    finally:
        audit_settings.release()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "enforcement: checks real kernel enforcement; must not skip where Landlock exists")
    config.addinivalue_line("markers", "audit: switches the host's audit on (put back after): runs after every other test")
    config.addinivalue_line("markers", "background(work): waits for work started in the background (tests/conftest.py): "
                            "runs after every other test but the audit ones")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Once audit was on, every task forked afterwards pays for a syscall
    # audit context until reboot: the rest of the suite runs before. Just
    # before them, the tests of what ran in the background (`background`):
    # none of it runs under audit (it would change every supervisor's default).
    items.sort(key=lambda item: (item.get_closest_marker("audit") is not None,
                                 item.get_closest_marker("background") is not None))


# Background work (a `background` marker's object: start(), which never raises and starts
# it once, and stop()), started once the suite is past its busy part: tests/e2e's client
# sessions run two at a time and tests/install as root and a plain uid at once (0-50% of
# the 2 cores idle), the rest waits on children and timers (60-90% idle; vmstat over a
# whole run). Stopped at the session's end.
_BUSY = ("tests/e2e/", "tests/install/")
_background: list[Any] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    _background.extend(dict.fromkeys(m.args[0] for item in session.items for m in item.iter_markers("background")))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not item.nodeid.startswith(_BUSY):
        for work in _background:
            work.start()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "enforcement" in report.keywords:
        _skipped_enforcement.append(report.nodeid)
    if report.when == "call" and not report.skipped and "audit" in report.keywords:
        _audit_ran.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _audit_ran:
        terminalreporter.write_line(
            f"audit: {len(_audit_ran)} test(s) switched the host's audit on; the last holder of the shared record "
            "(supervisor/daemon/audit_settings.py) puts every setting back, but the "
            "kernel keeps audit 'ever enabled' until reboot: every process forked since pays for a system-call "
            "audit context (slower system calls)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for work in _background:   # (before the uid table goes: its supervisors use it)
        work.stop()
    shutil.rmtree(_IDS_DIR, ignore_errors=True)
    if _skipped_enforcement and abi_version() > 0:
        print(f"\nFAIL: {len(_skipped_enforcement)} enforcement test(s) skipped although the kernel "
              f"has Landlock ABI {abi_version()}:")
        for nodeid in _skipped_enforcement:
            print("  " + nodeid)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- a confined child, one operation ----------------------------------

@dataclass
class Result:
    """What happened in a confined child."""
    value: Any = None                  # what the operation returned
    error: BaseException | None = None  # what apply() or the operation raised
    report: landlock.Report | None = None
    status: int = 0                    # the child's wait status

    @property
    def errno(self) -> int:
        """0 when the operation succeeded, the OSError's errno when it failed."""
        if self.error is None:
            return 0
        if isinstance(self.error, OSError) and self.error.errno:
            return self.error.errno
        raise self.error

    @property
    def signal(self) -> int:
        return os.WTERMSIG(self.status) if os.WIFSIGNALED(self.status) else 0

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _run_confined(spec: landlock.Spec | None, fn: Callable[[], Any] | None = None, *,
                  before: Callable[[], Any] | None = None) -> Result:
    """Fork; in the child: before(), landlock.apply(spec) (skipped when spec is
    None), fn(). Returns the Result; a child killed by a signal (rlimits) has
    no value, only its status."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler
            signal.alarm(CHILD_ALARM)
            out: dict[str, Any] = {}
            try:
                if before is not None:
                    before()
                if spec is not None:
                    out["report"] = landlock.apply(spec)
                if fn is not None:
                    out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
                out["error"] = e
            try:
                data = pickle.dumps(out)
            except Exception as e:  # noqa: BLE001
                data = pickle.dumps({"error": RuntimeError(f"unpicklable result: {e!r}: {out!r}")})
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    out = pickle.loads(data) if data else {}
    return Result(out.get("value"), out.get("error"), out.get("report"), status)


def _confined_errno(spec: landlock.Spec, op: Callable[[], Any], **kw: Any) -> int:
    """0 if op succeeded in a child confined by spec, else the errno it failed with."""
    return _run_confined(spec, op, **kw).errno


@pytest.fixture(name="run_confined", scope="session")
def run_confined_fixture() -> Callable[..., Result]:
    return _run_confined


@pytest.fixture(name="confined_errno", scope="session")
def confined_errno_fixture() -> Callable[..., int]:
    return _confined_errno
