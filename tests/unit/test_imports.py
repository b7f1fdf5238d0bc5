"""What a proxy pays to talk to a supervisor: the client library loads
nothing of the server, nor PyYAML, python-prctl or ctypes (issue 12)."""
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
