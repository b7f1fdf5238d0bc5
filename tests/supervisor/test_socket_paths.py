"""Where serve and run look for the socket, and how `run` picks its
supervisor: what MCP clients hit first (they start servers with only HOME,
LOGNAME, PATH, SHELL, TERM, USER in the environment)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from svhelpers import PYTHON, REPO

USER_UID = 64050   # a uid nothing else uses (64000-64999 are the tests')
CLIENT_ENV = {"HOME": "/", "LOGNAME": "someone", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh",
              "TERM": "dumb", "USER": "someone"}


def _as_user(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", code], cwd=REPO, env=env, user=USER_UID, group=USER_UID,
                          extra_groups=[], capture_output=True, text=True, timeout=20)


_PRINT_PATH = "from supervisor.paths import default_socket_path as d; print(d())"


@pytest.mark.timeout(30)
@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another uid")
def test_default_socket_path_for_a_user(lab):
    """$XDG_RUNTIME_DIR when it is the user's own 0700 directory, else
    /run/user/UID when it exists, else one line naming --socket."""
    runtime = lab.dir / "xdg"    # (lab.dir is world-traversable)
    runtime.mkdir(mode=0o700)
    os.chown(runtime, USER_UID, USER_UID)
    r = _as_user(_PRINT_PATH, {**CLIENT_ENV, "XDG_RUNTIME_DIR": str(runtime)})
    assert r.stdout.strip() == f"{runtime}/landlock-supervisor/socket", r

    run_user = f"/run/user/{USER_UID}"
    os.makedirs("/run/user", exist_ok=True)
    os.mkdir(run_user, 0o700)
    try:
        os.chown(run_user, USER_UID, USER_UID)
        r = _as_user(_PRINT_PATH, CLIENT_ENV)   # no XDG_RUNTIME_DIR, as the SDK clients start servers
        assert r.stdout.strip() == f"{run_user}/landlock-supervisor/socket", r
        # Someone else's directory named by XDG_RUNTIME_DIR is not used.
        os.chown(runtime, 0, 0)
        r = _as_user(_PRINT_PATH, {**CLIENT_ENV, "XDG_RUNTIME_DIR": str(runtime)})
        assert r.stdout.strip() == f"{run_user}/landlock-supervisor/socket", r
    finally:
        shutil.rmtree(run_user)
    r = subprocess.run([PYTHON, "-m", "supervisor", "ping"], cwd=REPO, env=CLIENT_ENV, user=USER_UID,
                       group=USER_UID, extra_groups=[], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and "--socket" in r.stderr and "Traceback" not in r.stderr, r


@pytest.mark.timeout(30)
def test_socket_option_in_either_place(sv):
    for argv in (["--socket", str(sv.socket_path), "ping"], ["ping", "--socket", str(sv.socket_path)]):
        r = subprocess.run([PYTHON, "-m", "supervisor", *argv], cwd=REPO, capture_output=True, timeout=20)
        assert r.returncode == 0, r
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "true"],
                       cwd=REPO, capture_output=True, timeout=20)
    assert r.returncode == 0, r


@pytest.mark.timeout(40)
def test_run_with_manifests_runs_exactly_those(lab):
    """`run --manifests` never falls through to a running daemon's manifest of
    the same name, and a stale socket left by a killed supervisor does not
    block it."""
    daemon_dir = lab.dir / "daemon-manifests"
    lab.manifest("greet", command="/bin/echo", args=["from the daemon"], directory=daemon_dir)
    lab.manifest("greet", command="/bin/echo", args=["from the private one"])
    svr = lab.start(manifests=[daemon_dir])
    env = {**os.environ, "LANDLOCK_SUPERVISOR_SOCKET": str(svr.socket_path)}
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--allow-root-servers", "--manifests", str(lab.manifest_dir), "greet"],
                       cwd=REPO, capture_output=True, text=True, timeout=20, env=env)
    assert (r.returncode, r.stdout) == (0, "from the private one\n"), r
    svr.stop()
    stale = lab.dir / "stale" / "socket"
    stale.parent.mkdir()
    import socket as sockets
    s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    s.bind(str(stale))
    s.close()   # a socket file nobody listens on
    env["LANDLOCK_SUPERVISOR_SOCKET"] = str(stale)
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--allow-root-servers", "--manifests", str(lab.manifest_dir), "greet"],
                       cwd=REPO, capture_output=True, text=True, timeout=20, env=env)
    assert (r.returncode, r.stdout) == (0, "from the private one\n"), r
    r = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(stale), "--allow-root-servers", "--manifests",
                        str(lab.manifest_dir), "greet"], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "--socket" in r.stderr and "Traceback" not in r.stderr, r


@pytest.mark.timeout(40)
def test_private_mode_loads_what_it_runs(lab):
    """run --manifests DIR NAME from an MCP client's stripped environment: an
    unrelated manifest with an unset ${VAR} is never expanded, one that is
    no YAML is a warning; NAME's own error is one line and exit 2."""
    lab.manifest("greet", command="/bin/echo", args=["hello"])
    lab.manifest("other", command="${NOT_SET_ANYWHERE}/bin/server")
    lab.manifest("broken", command="x", raw="name: [unclosed\n")
    argv = [PYTHON, "-m", "supervisor", "run", "--allow-root-servers", "--manifests", str(lab.manifest_dir)]
    r = subprocess.run([*argv, "greet"], cwd=REPO, capture_output=True, text=True, timeout=20, env=CLIENT_ENV)
    assert (r.returncode, r.stdout) == (0, "hello\n"), r
    assert "broken.yaml" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([*argv, "other"], cwd=REPO, capture_output=True, text=True, timeout=20, env=CLIENT_ENV)
    assert r.returncode == 2, r
    lines = [line for line in r.stderr.splitlines() if "broken.yaml" not in line]
    assert len(lines) == 1 and "NOT_SET_ANYWHERE" in lines[0] and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([*argv, "missing"], cwd=REPO, capture_output=True, text=True, timeout=20, env=CLIENT_ENV)
    assert r.returncode == 2 and "no manifest named 'missing'" in r.stderr and "Traceback" not in r.stderr, r
