"""End-to-end fixtures: one world and one real supervisor for the session.

`world` is a started e2ehelpers.World: the example manifests (and those of
tests/e2e/manifests) served from a temporary socket, npm and uv caches seeded
so that the npx and uvx launches run offline. Servers it hands out with
world.server(NAME) are shared by every test of the session (a node server
starts in ~0.3 s, npx/uvx in ~1 s: one start each is what keeps this suite
short). Without the installed servers (.servers, see scripts/install-servers)
every test here fails, saying so: it never skips.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from collections.abc import Iterator

import pytest

import landlock

sys.path.insert(0, os.path.dirname(__file__))  # for e2ehelpers, any import mode
from e2ehelpers import Listener, World, servers_problem  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "network: fetches from the npm or PyPI registry (deselect with -m 'not network')")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if landlock.abi_version():
        return
    skip = pytest.mark.skip(reason="this kernel has no Landlock: the example manifests refuse to run unconfined")
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def installed() -> None:
    problem = servers_problem()
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def listeners() -> Iterator[tuple[Listener, Listener]]:
    """(granted, unlisted): two local listeners; only the first port is in a manifest."""
    granted, unlisted = Listener(), Listener()
    yield granted, unlisted
    granted.close()
    unlisted.close()


@pytest.fixture(scope="session")
def world(installed: None, tmp_path_factory: pytest.TempPathFactory,
          listeners: tuple[Listener, Listener]) -> Iterator[World]:
    # Under root the servers run as dynamic uids: they must traverse the
    # world's directory, and pytest keeps its own base directory 0700.
    if os.geteuid() == 0:
        root = Path(tempfile.mkdtemp(prefix="llsv-e2e-", dir="/tmp"))
        os.chmod(root, 0o755)
    else:
        root = tmp_path_factory.mktemp("e2e")
    w = World(root)
    try:
        w.build()
        w.start(probe_port=listeners[0].port)
        yield w
        status = w.stop()
        assert status == 0, f"the supervisor exited {status}:\n{w.log_text()}"
        if os.geteuid() == 0:
            if not os.environ.get("LLSV_KEEP_E2E"):
                shutil.rmtree(root, ignore_errors=True)
    finally:
        w.stop()
        shutil.rmtree(w.state, ignore_errors=True)   # ~300 MB of cache copies; the logs stay
