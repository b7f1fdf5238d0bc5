"""An npx or uvx server whose registry cannot be reached fails within 30 s,
saying so on stderr (docs/manifests.md, Profiles): the npx and uvx profiles
bound npm's and uv's retries and timeouts. Private mode, a fresh state root
(empty caches), a registry on a local port that refuses connections."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.manifests import ids

sys.path.insert(0, os.path.dirname(__file__))
from e2ehelpers import PYTHON, REPO, SERVERS, servers_problem  # noqa: E402

MANIFESTS = {
    "unreachable-npx": """\
command: npx
args: [-y, "@modelcontextprotocol/server-memory@2026.8.31"]
inherit_env: [PATH]
env: {npm_config_registry: "http://127.0.0.1:@PORT@/"}
state_dir: true
user: dynamic
sandbox:
  profiles: [system, npx]
  network: {connect_tcp: [@PORT@]}
""",
    "unreachable-uvx": """\
command: @SERVERS@/venv/bin/uvx
args: [--from, "mcp-server-time==2026.10.19", mcp-server-time]
inherit_env: [PATH]
env: {UV_DEFAULT_INDEX: "http://127.0.0.1:@PORT@/simple", UV_PYTHON: /usr/bin/python3}
state_dir: true
user: dynamic
sandbox:
  profiles: [system, uvx]
  network: {connect_tcp: [@PORT@]}
""",
}


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A port bound (so nobody else takes it) and never listened on: refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def world(closed_port: int) -> Iterator[Path]:
    problem = servers_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="llsv-registry-", dir="/tmp"))
    os.chmod(root, 0o755)   # dynamic uids traverse it under root
    (root / "manifests").mkdir()
    for name, text in MANIFESTS.items():
        (root / "manifests" / f"{name}.yaml").write_text(
            text.replace("@PORT@", str(closed_port)).replace("@SERVERS@", str(SERVERS)))
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, says", [("unreachable-npx", "ECONNREFUSED"),
                                        ("unreachable-uvx", "Connection refused")])
def test_an_unreachable_registry_fails_within_30_s_on_stderr(world: Path, closed_port: int,
                                                              name: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items()   # (the suite's uid table kept: tests/conftest.py)
           if not k.startswith(("npm_config_", "NPM_CONFIG_", "UV_", "LANDLOCK_SUPERVISOR")) or k == ids.TABLE_ENV}
    started = time.monotonic()
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--manifests", str(world / "manifests"),
                        "--state-root", str(world / "state"), name],
                       cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=50)
    took = time.monotonic() - started
    assert r.returncode != 0, r
    assert says in r.stderr and str(closed_port) in r.stderr, r.stderr
    assert took < 30, f"{name} took {took:.1f} s to give up:\n{r.stderr}"
