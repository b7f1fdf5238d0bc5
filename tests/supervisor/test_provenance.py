"""A root supervisor warns, in one line at start, when a non-root uid could
rewrite the code it runs: an editable install imports its checkout, often a
user's own (docs/security.md, "Trusted")."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from types import SimpleNamespace

import pytest

from supervisor.daemon import provenance
from svhelpers import PYTHON, REPO

OWNER_UID = 64053   # a uid nothing else uses (64000-64999 are the tests')
DIR, FILE = stat.S_IFDIR, stat.S_IFREG


@pytest.mark.parametrize("uid, gid, mode, writable", [
    (0, 0, DIR | 0o755, False),
    (0, 0, FILE | 0o644, False),
    (0, 0, DIR | 0o775, False),          # root's group: root's own
    (0, 100, DIR | 0o775, True),         # another group may write
    (0, 100, DIR | 0o755, False),
    (0, 0, DIR | 0o757, True),           # anyone may write
    (1000, 1000, DIR | 0o755, True),     # its owner may, and may chmod it
    (1000, 0, FILE | 0o444, True),
])
def test_writable_by_others(uid, gid, mode, writable):
    st = SimpleNamespace(st_uid=uid, st_gid=gid, st_mode=mode)
    assert provenance.writable_by_others(st) is writable   # type: ignore[arg-type]


def test_code_paths_are_the_interpreter_and_the_import_directories():
    paths = provenance.code_paths()
    assert paths[0] == os.path.realpath(PYTHON)
    assert str(REPO / "supervisor") in paths and str(REPO / "landlock") in paths


@pytest.mark.timeout(40)
@pytest.mark.skipif(os.geteuid() != 0, reason="a root supervisor's warning")
def test_a_root_supervisor_on_a_users_checkout_warns_once(lab):
    lab.stock()
    checkout = lab.dir / "checkout"
    for package in ("supervisor", "landlock"):
        shutil.copytree(REPO / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [checkout, *checkout.rglob("*")]:
        os.lchown(path, OWNER_UID, OWNER_UID)
    boot = f"import sys; sys.path.insert(0, {str(checkout)!r}); from supervisor.cli import main; sys.exit(main())"
    proc = subprocess.Popen([PYTHON, "-I", "-c", boot, "--socket", str(lab.dir / "run" / "socket"), "serve",
                             "--manifests", str(lab.manifest_dir), "--state-root", str(lab.state_root)],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "serving" in line:
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    warnings = [line for line in lines if "non-root uid can write" in line]
    assert len(warnings) == 1 and f"{checkout} (uid {OWNER_UID}" in warnings[0], lines
    assert lab.start().log().count("non-root uid can write") == 0   # the project's own checkout: root's
