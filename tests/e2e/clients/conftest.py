"""Fixtures of the client tests: one Identity (clienthelpers.py) for root and
one for a plain uid, each with its world and its daemon, made when a test
first needs it and kept for the session."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from clienthelpers import Identity, clients_problem, free_uid  # noqa: E402
from e2ehelpers import Listener, servers_problem  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a client test of several seconds (deselect with -m 'not slow')")


def _identity(kind: str, uid: int, allow_uid: int | None = None, runtime: bool = True,
              warm: bool = False) -> Iterator[Identity]:
    if os.geteuid() != 0:
        pytest.skip("the client tests switch uids: run them as root (scripts/test does)")
    problem = servers_problem() or clients_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    # Under /dev/shm when it allows exec (the seeded caches are ~30,000 files), else /tmp.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) and not os.statvfs("/dev/shm").f_flag & os.ST_NOEXEC else "/tmp"
    root = Path(tempfile.mkdtemp(prefix=f"llsv-clients-{kind}-", dir=base))
    root.chmod(0o755)
    ident = Identity(kind, root, uid, runtime, warm)
    try:
        ident.build()
        ident.start_daemon(allow_uid)
        yield ident
        status = ident.stop()
        assert status == 0, f"{kind}'s supervisor exited {status}:\n{ident.log_text()}"
    finally:
        ident.stop()
        if ident.uid:
            # Nothing of the uid may stay behind (a server the tests missed).
            for pid in [e.name for e in Path("/proc").iterdir() if e.name.isdigit()]:
                try:
                    if int((Path("/proc") / pid / "status").read_text().split("Uid:")[1].split()[0]) == uid:
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, IndexError, ValueError):
                    pass
        ident.remove()


@pytest.fixture(scope="session")
def plain_uid() -> int:
    """The plain user's uid (free_uid), chosen once: root's daemon lets it in."""
    return free_uid()


@pytest.fixture(scope="session")
def root_identity(plain_uid: int) -> Iterator[Identity]:
    """Root's world; its daemon also serves the plain user (--allow-uid), as
    a system-wide supervisor serves its users."""
    yield from _identity("root", 0, allow_uid=plain_uid)


@pytest.fixture(scope="session")
def warm_identity(plain_uid: int) -> Iterator[Identity]:
    """Root's world again, its daemon keeping a warm server of every example
    (and serving the plain user too)."""
    yield from _identity("root-warm", 0, allow_uid=plain_uid, warm=True)


@pytest.fixture(scope="session")
def user_identity(plain_uid: int) -> Iterator[Identity]:
    yield from _identity("user", plain_uid)


@pytest.fixture(scope="session")
def noruntime_identity(plain_uid: int) -> Iterator[Identity]:
    uid = free_uid()
    while uid == plain_uid:
        uid = free_uid()
    yield from _identity("user-noruntime", uid, runtime=False)


@pytest.fixture(scope="session")
def identities(request: pytest.FixtureRequest) -> Mapping[str, Any]:
    return {"root": lambda: request.getfixturevalue("root_identity"),
            "root-warm": lambda: request.getfixturevalue("warm_identity"),
            "user": lambda: request.getfixturevalue("user_identity"),
            "user-noruntime": lambda: request.getfixturevalue("noruntime_identity")}


@pytest.fixture(scope="session")
def unlisted() -> Iterator[Listener]:
    """A local listener no manifest grants: the everything servers try to fetch from it."""
    listener = Listener()
    yield listener
    listener.close()


