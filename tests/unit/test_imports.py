"""What a proxy pays to talk to a supervisor: the client library loads
nothing of the server, nor PyYAML, python-prctl or ctypes (issue 12); nor
does `landlock-supervisor run` in daemon mode, and `run --manifests` spawns
its private supervisor before it loads its client (issue 14)."""
from __future__ import annotations

import json
import subprocess
import sys

# Modules (and packages, with everything under them) a client must not load.
SERVER_SIDE = ("yaml", "prctl", "_prctl", "ctypes", "landlock.syscalls", "supervisor.server",
               "supervisor.zygote", "supervisor.spawn", "supervisor.manifest")

_PROBE = """
import json, sys
import supervisor.client, supervisor.aio
supervisor.client.Client("/x")
supervisor.aio.AsyncClient("/x")
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _server_side(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVER_SIDE)]


def test_client_imports_nothing_of_the_server() -> None:
    assert _server_side(_loaded(_PROBE)) == []


def test_the_probe_would_see_them() -> None:
    """The same probe after importing the server finds them: the test can fail."""
    assert "supervisor.server" in _server_side(_loaded("import supervisor.server\n" + _PROBE))


# `run NAME` against a socket where nothing listens: the whole daemon-mode
# path up to the connection (which fails: exit 1).
_RUN = """
import json, sys
from supervisor import cli
status = cli.main(["--socket", "/nonexistent/socket", "run", "x", "--", "."])
print(json.dumps(sorted(sys.modules)))
sys.exit(0 if status == 1 else 3)
"""

# What `run --manifests` has loaded when it spawns the private supervisor:
# nothing it could import beside the supervisor's start-up instead.
_BEFORE_PRIVATE = """
import sys
from supervisor import cli, private_boot
print("[" + ", ".join('"%s"' % m for m in sorted(sys.modules)) + "]")   # (json is one of those looked for)
"""
CLIENT_SIDE = ("supervisor.client", "supervisor._client_core", "supervisor.protocol", "supervisor.private", "json",
               "typing")


def test_run_in_daemon_mode_imports_nothing_of_the_server() -> None:
    assert _server_side(_loaded(_RUN)) == []


def test_run_spawns_a_private_supervisor_before_loading_its_client() -> None:
    loaded = _loaded(_BEFORE_PRIVATE)
    assert [m for m in CLIENT_SIDE if m in loaded] == []
