"""What a proxy pays to talk to a supervisor: the client library loads only
the client side docs/design.md names, and of the rest only the standard
library without ctypes (no PyYAML, no python-prctl: issue 12); so does
`landlock-supervisor run` in daemon mode, with its own modules; and `run
--manifests` spawns its private supervisor before it loads its client (issue 14)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DESIGN = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
_WHO = DESIGN[DESIGN.index("Who imports whom"):]


def _named(before: str) -> list[str]:
    """The modules design.md lists in the parentheses after `before`."""
    group = re.search(re.escape(before) + r"\s+\(([^)]*)\)", _WHO, re.S)
    assert group, before
    return re.findall(r"`([a-z_.]+)`", group.group(1))


CLIENT_SIDE = _named("the client side")
RUN_OWN = _named("adds only its own")
_OURS = ("supervisor", "landlock")

_PROBE = """
import json, sys
import supervisor.client, supervisor.aio   # layout-move: keep (the names a proxy imports)
supervisor.client.Client("/x")
supervisor.aio.AsyncClient("/x")   # layout-move: keep
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# What the interpreter's site set-up loads before any code of ours (a venv's).
_SITE = {"__main__", "_distutils_hack", "sitecustomize", "usercustomize"}


def _outside(modules: list[str], allowed: list[str]) -> list[str]:
    """Loaded modules beyond the allowed ones of ours and the standard library (ctypes not)."""
    ours = {"supervisor"} | {m if m.startswith("landlock.") else f"supervisor.{m}" for m in allowed}
    ours |= {m.split(".")[0] for m in ours}   # their packages
    stdlib = sys.stdlib_module_names - {"ctypes"}
    return [m for m in modules if m not in ours | _SITE
            and (m.split(".")[0] in _OURS or m.split(".")[0] not in stdlib)]


def test_design_names_the_client_side() -> None:
    assert {"client", "client.sync", "aio", "client.aio", "client.exchange", "protocol", "errors"} <= set(CLIENT_SIDE)
    assert RUN_OWN and "cli" in RUN_OWN


def test_client_loads_only_the_client_side() -> None:
    assert _outside(_loaded(_PROBE), CLIENT_SIDE) == []


def test_the_probe_would_see_them() -> None:
    """The same probe after importing the server, PyYAML or ctypes finds them: the test can fail."""
    for server_side in ("supervisor.daemon.server", "supervisor.daemon.connections", "yaml", "ctypes", "landlock"):
        assert server_side in _outside(_loaded(f"import {server_side}\n" + _PROBE), CLIENT_SIDE)


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
from supervisor import cli; from supervisor.client import private_boot
print("[" + ", ".join('"%s"' % m for m in sorted(sys.modules)) + "]")   # (json is one of those looked for)
"""
CLIENT_LIBRARY = ("supervisor.client.sync", "supervisor.client.exchange", "supervisor.protocol", "supervisor.client.private",
                  "json", "typing")


def test_run_in_daemon_mode_loads_only_the_client_side_and_its_own() -> None:
    assert _outside(_loaded(_RUN), CLIENT_SIDE + RUN_OWN) == []


def test_run_in_daemon_mode_loads_no_socket_module_nor_private_mode() -> None:
    """The wire and the relay need only the C socket type: socket.py (its
    enums, selectors) is ~4 ms of every start, and private mode's modules
    bring it."""
    loaded = _loaded(_RUN)
    assert [m for m in ("socket", "selectors", "supervisor.client.private", "supervisor.client.private_boot")
            if m in loaded] == []


# A private supervisor's own start (`run --manifests`, a proxy's private mode):
# its command line and the host's dynamic-uid table.
_PRIVATE_START = """
import json, sys
from supervisor import serve
serve.parse(["serve", "--manifests", "/nonexistent", "--control-fd", "3"])
import supervisor.manifests.ids
print(json.dumps(sorted(sys.modules)))
"""


def test_a_private_supervisors_start_loads_no_shutil_nor_secrets() -> None:
    """argparse's own help formatter imports shutil (with bz2 and lzma),
    secrets imports hashlib (OpenSSL): ~13 ms of every private start here,
    for a terminal's width and a temporary file's name."""
    loaded = _loaded(_PRIVATE_START)
    assert [m for m in ("shutil", "secrets", "hashlib", "bz2", "lzma") if m in loaded] == []


def test_run_spawns_a_private_supervisor_before_loading_its_client() -> None:
    loaded = _loaded(_BEFORE_PRIVATE)
    assert [m for m in CLIENT_LIBRARY if m in loaded] == []
