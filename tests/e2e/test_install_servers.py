"""scripts/install-servers shows its installers' errors and bounds their
time: a registry that refuses is npm's own error and a line naming the step;
one that never answers ends after INSTALL_TIMEOUT with a line saying what
to check (it once looked like a hang of 4.5 minutes)."""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2ehelpers import REPO


@pytest.fixture
def registry() -> Iterator[socket.socket]:
    """A TCP port on loopback that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s
    finally:
        s.close()


# A host's proxy would take npm's request elsewhere than the local port.
_WITHOUT_PROXY = {k: v for k, v in os.environ.items()
                  if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "npm_config_proxy",
                                       "npm_config_https_proxy")}


def _install(tmp_path: Path, port: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "scripts" / "install-servers"), str(tmp_path / "servers")], cwd=REPO,
                          env={**_WITHOUT_PROXY, "npm_config_registry": f"http://127.0.0.1:{port}/", **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_a_refusing_registry_is_npms_error_and_the_step(tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()   # nobody listens: refused
    # npm's pause before its one retry shortened (10 s, then more per package, by default): the error's shape is the same.
    r = _install(tmp_path, port, npm_config_fetch_retry_mintimeout="100", npm_config_fetch_retry_maxtimeout="200")
    assert r.returncode == 1, r
    assert "ECONNREFUSED" in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("install-servers: npm install failed (exit 1): its error is above"), r.stderr


@pytest.mark.timeout(150)
def test_a_silent_registry_ends_within_the_bound(tmp_path: Path, registry: socket.socket) -> None:
    r = _install(tmp_path, registry.getsockname()[1], INSTALL_TIMEOUT="5")   # (the test's timeout bounds the rest)
    assert r.returncode == 1, r
    assert "install-servers: npm install did not finish within 5s (INSTALL_TIMEOUT): can this user reach the " \
           "registry" in r.stderr, r.stderr
