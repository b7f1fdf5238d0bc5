"""Plumbing for the landlock/ tests: every ABI, who the child runs as, scratch trees.

Every enforcement test goes through the `run_confined` or `confined_errno`
fixture (tests/conftest.py: the e2e tests use them too). The helpers are
fixtures (a conftest is not importable reliably); a test taking an `abi`
argument runs once for every ABI from 1 to the kernel's.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import landlock

KERNEL_ABI = landlock.abi_version()
# Every ABI this kernel can be capped to (Spec.max_abi), for real enforcement.
# Inside the kernel matrix (EXPECT_ABI set) only the kernel's own: the
# capped ones are the host's job, and TCG is slow.
ABIS = [KERNEL_ABI] if "EXPECT_ABI" in os.environ and KERNEL_ABI else list(range(1, KERNEL_ABI + 1))
ROOT = os.geteuid() == 0
UNPRIVILEGED_UID = 65534  # nobody

# Probed once here rather than in every child.
for _abi in (None, *range(KERNEL_ABI + 1)):
    landlock.probe(_abi)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "root_only: needs root (a uid switch, a chown, capabilities)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "abi" in metafunc.fixturenames:
        metafunc.parametrize("abi", ABIS, ids=[f"abi{n}" for n in ABIS])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_landlock = pytest.mark.skip(reason="this kernel has no Landlock")
    not_root = pytest.mark.skip(reason="needs root")
    for item in items:
        if not KERNEL_ABI and "enforcement" in item.keywords:
            item.add_marker(no_landlock)
        if not ROOT and "root_only" in item.keywords:
            item.add_marker(not_root)


# --- who the child runs as ------------------------------------------------

@dataclass(frozen=True)
class Identity:
    name: str
    uid: int                 # the uid the confined child ends up with
    spec: dict[str, Any]     # Spec keyword arguments that make it so


IDENTITIES = (
    Identity("root", 0, {}),  # root with every capability dropped: the default
    Identity("nobody", UNPRIVILEGED_UID, {"user": UNPRIVILEGED_UID}),  # a uid drop
) if ROOT else (
    Identity("self", os.getuid(), {}),  # not root: the core set runs as this user only
)


@pytest.fixture(params=IDENTITIES, ids=[i.name for i in IDENTITIES])
def identity(request: pytest.FixtureRequest) -> Identity:
    """Each identity the core set runs as."""
    return request.param


# --- a scratch tree the child's uid can use -------------------------------

@dataclass
class Layout:
    """root/d: the directory under test (its rule varies); root/out: no rule.

    d holds: file, empty/, a/f and b/ (cross-directory rename and link),
    true (a copy of /bin/true, 0755).
    """
    root: Path

    @property
    def d(self) -> Path:
        return self.root / "d"

    @property
    def out(self) -> Path:
        return self.root / "out"


def _scratch_base() -> str:
    """A tmpfs (fast: a tree per test) that allows exec, else the temp dir."""
    for base in ("/dev/shm", tempfile.gettempdir()):
        try:
            flags = os.statvfs(base).f_flag
        except OSError:
            continue
        if not flags & (os.ST_NOEXEC | os.ST_RDONLY) and os.access(base, os.W_OK | os.X_OK):
            return base
    return tempfile.gettempdir()


SCRATCH = _scratch_base()


def make_layout(owner: int) -> Layout:
    root = Path(tempfile.mkdtemp(prefix="landlock-test-", dir=SCRATCH))
    lay = Layout(root)
    try:
        for sub in ("d", "d/empty", "d/a", "d/b", "out"):
            (root / sub).mkdir()
        (lay.d / "file").write_bytes(b"data")
        (lay.d / "a" / "f").write_bytes(b"f")
        (lay.out / "file").write_bytes(b"secret")
        shutil.copyfile("/bin/true", lay.d / "true")
        os.chmod(lay.d / "true", 0o755)
        # DAC must allow everything the tests try: a denial has to come from Landlock.
        for path in (root, *root.rglob("*")):
            os.lchown(path, owner, owner)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return lay


@pytest.fixture
def layout_for() -> Iterator[Callable[[int], Layout]]:
    made: list[Layout] = []

    def make(owner: int) -> Layout:
        made.append(make_layout(owner))
        return made[-1]
    yield make
    for lay in made:
        shutil.rmtree(lay.root, ignore_errors=True)


@pytest.fixture
def layout(layout_for: Callable[[int], Layout]) -> Layout:
    """A scratch tree for a child running as this process's uid."""
    return layout_for(os.getuid())


@pytest.fixture
def tcp_listener() -> Iterator[int]:
    """A localhost TCP port listening outside the domain."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]
