"""What a user wrote before supervisor/ became packages (issue 29) still works:
every documented import and command. The old names are written on purpose
(layout-move: keep)."""
from __future__ import annotations

import configparser
import importlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# README.md, docs/protocol.md, examples/ and the tests import these.
CLIENT_NAMES = ("Client", "Child", "SupervisorError", "NoSuchManifest", "SpawnFailed", "RefusedPeer",   # layout-move: keep
                "ConfinementUnavailable", "connect_first", "_run")


def test_the_client_names_import_from_supervisor_client() -> None:
    import supervisor.client   # layout-move: keep
    from supervisor.client import sync
    for name in CLIENT_NAMES:
        assert getattr(supervisor.client, name) is getattr(sync, name), name
    from supervisor.client import Client, SupervisorError, _run   # noqa: F401  layout-move: keep


def test_the_asyncio_client_and_start() -> None:
    import supervisor
    import supervisor.aio   # layout-move: keep
    from supervisor.client import aio
    old = supervisor.aio   # layout-move: keep
    assert old.AsyncClient is aio.AsyncClient and old.AsyncChild is aio.AsyncChild
    assert callable(supervisor.start)


def test_python_dash_m_supervisor() -> None:
    out = subprocess.run([sys.executable, "-m", "supervisor", "--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "run" in out.stdout


def test_the_console_scripts_point_at_modules() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, _, target = (part.strip() for part in line.partition("="))
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_the_go_wrapper_protocol_is_where_it_was() -> None:
    from landlock import gocompat
    assert gocompat.__name__ == "landlock.gocompat"
