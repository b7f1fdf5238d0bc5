"""`landlock-supervisor run` as an MCP client starts it: what its private
supervisor imports, and whose words its stderr carries.

The client side is run as root and as a dedicated uid (the identities of
the catalogue): a project directory or a PYTHONPATH entry with a planted
`yaml.py` and `prctl.py` (whoever can write there is the attacker), and a
server that writes lines like the supervisor's on the stderr it shares
with `run`.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sechelpers import Identity, case
from svhelpers import PYTHON

pytestmark = [pytest.mark.enforcement, pytest.mark.timeout(120)]

CONSOLE_SCRIPT = str(Path(PYTHON).parent / "landlock-supervisor")
_PLANT = "open({marker!r}, 'a').write({name!r} + '\\n')\n"


def _planted(lab: Any, ident: Identity) -> tuple[Path, Path]:
    """A project directory holding yaml.py and prctl.py that leave a mark
    when imported, writable by the identity (its own project)."""
    project = lab.dir / f"project-{ident.name}"
    project.mkdir()
    marker = lab.dir / f"imported-{ident.name}"
    for name in ("yaml", "prctl"):
        (project / f"{name}.py").write_text(_PLANT.format(marker=str(marker), name=name))
    os.chown(project, ident.uid, ident.uid)
    marker.touch()
    os.chown(marker, ident.uid, ident.uid)
    os.chmod(project, 0o755)
    return project, marker


def _echo_manifest(lab: Any, ident: Identity) -> Path:
    """A manifest the identity's private supervisor loads (as root: a
    dedicated user; as a user: its own uid)."""
    directory = lab.dir / f"manifests-{ident.name}"
    fields: dict[str, Any] = {"user": "nobody"} if ident.uid == 0 else {"allow_root": False}
    path = lab.manifest("echo", command="/bin/echo", args=["hello"], directory=directory, **fields)
    os.chmod(directory, 0o755)
    return path


def _run(lab: Any, ident: Identity, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    state = lab.dir / f"state-{ident.name}"
    state.mkdir(exist_ok=True)
    os.chown(state, ident.uid, ident.uid)
    user = {} if ident.uid == 0 else {"user": ident.uid, "group": ident.uid, "extra_groups": []}
    return subprocess.run([*argv, "run", "--manifests", str(_echo_manifest(lab, ident)), "--state-root",
                           str(state), "echo"], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/", **env}, **user)


@case("private-import-path")
def test_the_private_supervisor_imports_nothing_planted(lab: Any, ident: Identity) -> None:
    project, marker = _planted(lab, ident)
    ways = {
        "python -m supervisor, from the project": ([PYTHON, "-m", "supervisor"], project, {}),
        "PYTHONPATH holding the project": ([CONSOLE_SCRIPT], lab.dir, {"PYTHONPATH": str(project)}),
        "the console script, no PYTHONPATH": ([CONSOLE_SCRIPT], project, {}),
    }
    for way, (argv, cwd, env) in ways.items():
        out = _run(lab, ident, argv, cwd, **env)
        assert out.returncode == 0 and out.stdout == "hello\n", (way, out.stderr)
        assert marker.read_text() == "", f"{way}: the private supervisor imported {marker.read_text()!r}"
        warned = [l for l in out.stderr.splitlines() if "imports from the working directory or PYTHONPATH" in l]
        if way.startswith("the console script"):
            assert warned == [], (way, out.stderr)   # clean: nothing to warn about
        else:
            assert len(warned) == 1 and str(project) in warned[0], (way, out.stderr)
    # The premise: the planted modules are what this interpreter imports from there.
    probe = subprocess.run([PYTHON, "-c", "import yaml"], cwd=project, capture_output=True, text=True, timeout=30)
    assert probe.returncode == 0 and marker.read_text() == "yaml\n", probe.stderr
