"""Where serve and run look for the socket, and how `run` picks its
supervisor: what MCP clients hit first (they start servers with only HOME,
LOGNAME, PATH, SHELL, TERM, USER in the environment)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from svhelpers import PYTHON, REPO, wait_until

USER_UID = 64050   # a uid nothing else uses (64000-64999 are the tests')
CLIENT_ENV = {"HOME": "/", "LOGNAME": "someone", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh",
              "TERM": "dumb", "USER": "someone"}


def _as_user(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", code], cwd=REPO, env=env, user=USER_UID, group=USER_UID,
                          extra_groups=[], capture_output=True, text=True, timeout=20)


_PRINT_PATHS = "from supervisor.client.paths import default_socket_paths as d; print(' '.join(d()))"
FALLBACK = f"/tmp/landlock-supervisor-{USER_UID}"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switches to another uid")


@pytest.fixture
def places(lab):
    """This uid's runtime directory as XDG_RUNTIME_DIR names it, and
    /run/user/UID made on demand; neither, nor the fallback, left behind."""
    runtime = lab.dir / "xdg"    # (lab.dir is world-traversable)
    runtime.mkdir(mode=0o700)
    os.chown(runtime, USER_UID, USER_UID)
    run_user = f"/run/user/{USER_UID}"
    _remove_fallback()
    state = lab.dir / "user-state"
    state.mkdir()
    os.chown(state, USER_UID, USER_UID)
    lab.manifest("echo", command="/bin/echo", args=["confined"], env={"PATH": "/usr/bin:/bin"})

    def make_run_user() -> str:
        os.makedirs("/run/user", exist_ok=True)
        os.mkdir(run_user, 0o700)
        os.chown(run_user, USER_UID, USER_UID)
        return run_user
    yield runtime, make_run_user, state
    shutil.rmtree(run_user, ignore_errors=True)
    _remove_fallback()


def _remove_fallback() -> None:
    if os.path.islink(FALLBACK):
        os.unlink(FALLBACK)
    shutil.rmtree(FALLBACK, ignore_errors=True)


@pytest.mark.timeout(30)
@needs_root
def test_default_socket_paths_for_a_user(lab, places):
    """$XDG_RUNTIME_DIR when it is the user's own 0700 directory, else
    /run/user/UID when it exists; then, or else, the fallback in /tmp."""
    runtime, make_run_user, _ = places
    fallback = f"{FALLBACK}/socket"
    r = _as_user(_PRINT_PATHS, {**CLIENT_ENV, "XDG_RUNTIME_DIR": str(runtime)})
    assert r.stdout.split() == [f"{runtime}/landlock-supervisor/socket", fallback], r
    # No supervisor at either: one line naming both.
    r = _run_as_user({**CLIENT_ENV, "XDG_RUNTIME_DIR": str(runtime)}, "echo")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and fallback in r.stderr, r
    assert f"{runtime}/landlock-supervisor/socket" in r.stderr, r
    r = _as_user(_PRINT_PATHS, CLIENT_ENV)
    assert r.stdout.split() == [fallback], r
    run_user = make_run_user()
    r = _as_user(_PRINT_PATHS, CLIENT_ENV)   # no XDG_RUNTIME_DIR, as the SDK clients start servers
    assert r.stdout.split() == [f"{run_user}/landlock-supervisor/socket", fallback], r
    # Someone else's directory named by XDG_RUNTIME_DIR is not used.
    os.chown(runtime, 0, 0)
    r = _as_user(_PRINT_PATHS, {**CLIENT_ENV, "XDG_RUNTIME_DIR": str(runtime)})
    assert r.stdout.split() == [f"{run_user}/landlock-supervisor/socket", fallback], r


def _serve_as_user(lab, state, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-m", "supervisor", "serve", "--manifests", str(lab.manifest_dir),
                             "--state-root", str(state)], cwd=REPO, env=env, user=USER_UID, group=USER_UID,
                            extra_groups=[], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _run_as_user(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # The console script, as a client config names it (`python -m` from / would
    # import from / and say so: issue 20's warning).
    return subprocess.run([os.path.join(os.path.dirname(PYTHON), "landlock-supervisor"), "run", *args], cwd="/",
                          env=env, user=USER_UID, group=USER_UID, extra_groups=[],
                          capture_output=True, text=True, timeout=20)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=15)
    return err


@pytest.mark.timeout(60)
@needs_root
@pytest.mark.parametrize("case", ["runtime directory", "/run/user/UID only", "neither"])
def test_serve_and_run_meet_as_a_plain_user(lab, places, case):
    """serve and run with no --socket, from an MCP client's environment, in
    each of the three places a user may have; without a runtime directory
    they meet in the fallback, 0700, which a client in a desktop session
    (XDG_RUNTIME_DIR set) finds too."""
    runtime, make_run_user, state = places
    env = dict(CLIENT_ENV)
    if case == "runtime directory":
        env["XDG_RUNTIME_DIR"] = str(runtime)
        where = f"{runtime}/landlock-supervisor/socket"
    elif case == "/run/user/UID only":
        where = f"{make_run_user()}/landlock-supervisor/socket"
    else:
        where = f"{FALLBACK}/socket"
    proc = _serve_as_user(lab, state, env)
    try:
        assert wait_until(lambda: os.path.exists(where), 15), _stop(proc)
        r = _run_as_user(env, "echo")
        assert (r.returncode, r.stdout) == (0, "confined\n"), r
        if case == "neither":
            st = os.lstat(FALLBACK)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (USER_UID, 0o700)
            r = _run_as_user({**env, "XDG_RUNTIME_DIR": str(runtime)}, "echo")
            assert (r.returncode, r.stdout) == (0, "confined\n"), r
    finally:
        err = _stop(proc)
    assert "Traceback" not in err, err
    assert not os.path.exists(where)


@pytest.mark.parametrize("read_write, read_write_noexec, warned", [
    ((), ("/tmp",), True),
    (("/tmp/landlock-supervisor-1000",), (), True),
    ((), ("/tmp/landlock-supervisor-1000/",), True),
    ((), ("/tmp/landlock-supervisor-10",), False),    # a sibling whose name is a prefix
    ((), ("/tmp/landlock-supervisor-1000/socket-not",), False),   # inside, not holding it
    ((), (), False),
])
def test_socket_writers(read_write, read_write_noexec, warned):
    from types import SimpleNamespace

    from supervisor.daemon.server import socket_writers
    loaded = {"m": SimpleNamespace(spec=SimpleNamespace(read_write=read_write, read_write_noexec=read_write_noexec))}
    assert bool(socket_writers("/tmp/landlock-supervisor-1000", loaded)) is warned   # type: ignore[arg-type]


@pytest.mark.timeout(60)
@needs_root
def test_a_grant_holding_the_socket_directory_is_warned(lab, places):
    """A write grant holding the fallback (a learned manifest's /tmp, say;
    here the fallback itself, as /tmp would hold this lab's manifests, which
    serve refuses): under a user's supervisor its server, the same uid,
    could put its own socket there."""
    _, _, state = places
    lab.manifest("scratch", command="/bin/true", sandbox={"profiles": ["system"], "read_write_noexec": [FALLBACK]})
    proc = _serve_as_user(lab, state, CLIENT_ENV)
    try:
        assert wait_until(lambda: os.path.exists(f"{FALLBACK}/socket"), 15), _stop(proc)
    finally:
        err = _stop(proc)
    warned = [line for line in err.splitlines() if "holds the socket's directory" in line]
    assert len(warned) == 1 and f"scratch: its grant of {FALLBACK}" in warned[0], err


@pytest.mark.timeout(60)
@needs_root
@pytest.mark.parametrize("kind", ["root's", "another uid's", "mode 0755", "symlink"])
def test_a_fallback_someone_else_made_is_refused(lab, places, kind):
    """The fallback lies in /tmp: one made by anyone else, or open to
    others, or a link, is neither served on nor connected to: one line."""
    _, _, state = places
    if kind == "symlink":
        target = lab.dir / "target"
        target.mkdir(mode=0o700)
        os.chown(target, USER_UID, USER_UID)
        os.symlink(target, FALLBACK)
    else:
        os.mkdir(FALLBACK, 0o700)
        owner = {"root's": 0, "another uid's": USER_UID + 1}.get(kind, USER_UID)
        os.chown(FALLBACK, owner, owner)
        os.chmod(FALLBACK, 0o755 if kind == "mode 0755" else 0o700)
    proc = _serve_as_user(lab, state, CLIENT_ENV)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and err.count("\n") == 1 and FALLBACK in err and "--socket" in err, err
    r = _run_as_user(CLIENT_ENV, "echo")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and FALLBACK in r.stderr, r
    assert not os.path.exists(f"{FALLBACK}/socket")


@pytest.mark.timeout(30)
def test_a_socket_path_too_long_is_one_line(lab):
    lab.stock()
    long_dir = lab.dir / ("d" * 100)
    for argv in (["serve", "--manifests", str(lab.manifest_dir), "--state-root", str(lab.state_root)],
                 ["run", "true"], ["ping"]):
        r = subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(long_dir / "socket"), *argv], cwd=REPO,
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and "bytes, over the 107" in r.stderr, r
    assert not long_dir.exists()


@pytest.mark.timeout(40)
def test_serve_replaces_a_socket_only_when_its_lock_is_free(lab):
    """A socket nobody answers on, whose lock file another process holds
    (a supervisor on another host sharing the directory), is kept; once
    the lock is free, it is replaced."""
    lab.stock()
    path = lab.dir / "shared" / "socket"
    path.parent.mkdir(mode=0o700)
    import socket as sockets
    s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    s.bind(str(path))
    s.close()   # a socket file nobody listens on here
    hold = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([PYTHON, "-c", hold, str(path) + ".lock"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        sv = lab.supervisor(socket_path=path)
        with pytest.raises(AssertionError) as e:
            sv.start(timeout=10)
        sv.stopped = True   # it never ran
        assert f"holds {path}.lock" in str(e.value), e.value
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        holder.communicate(timeout=10)   # (its stdin closed: it exits, the lock free)
    sv = lab.start(socket_path=path)
    assert sv.client.ping()["pid"] == sv.pid


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


@pytest.mark.timeout(30)
@needs_root
@pytest.mark.parametrize("kind", ["fifo", "another uid's"])
def test_a_lock_file_someone_else_made_is_one_line(lab, kind):
    """A FIFO planted as the lock file hung serve for ever (its open
    blocked); one of another uid, held locked by it, would keep serve off
    that socket for good: each is refused at once, in one line."""
    lab.stock()
    path = lab.dir / "shared" / "socket"
    path.parent.mkdir(mode=0o755)
    lock = str(path) + ".lock"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        with open(lock, "w"):
            pass
        os.chown(lock, USER_UID, USER_UID)
    sv = lab.supervisor(socket_path=path)
    with pytest.raises(AssertionError) as e:
        sv.start(timeout=10)
    sv.stopped = True   # it never ran
    assert ("is not a regular file" if kind == "fifo" else f"belongs to uid {USER_UID}") in str(e.value), e.value
