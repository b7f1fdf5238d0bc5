"""Private mode (a proxy's own fork-server, no socket file) and
`landlock-supervisor run` as a drop-in server command."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import supervisor
from supervisor.daemon import procfs
from supervisor.client import NoSuchManifest, SpawnFailed
from svhelpers import (GRACE, PYTHON, REPO, alive, processes_with_tag, read_line, run, sh, socket_inodes,
                       spawn_bg, state, unix_socket_paths, wait_until)


@contextlib.contextmanager
def _running(runner: list[str], script: str) -> Iterator[subprocess.Popen[bytes]]:
    """`landlock-supervisor run ... sh -- SCRIPT` in the background, its
    stdout and stderr piped; killed and closed at the end, whatever happened."""
    proc = subprocess.Popen([PYTHON, "-m", "supervisor", *runner, "sh", "--", script], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# ---- private mode -----------------------------------------------------------------


@pytest.fixture
def private(lab, monkeypatch):
    lab.stock()
    runtime = lab.dir / "xdg"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("LANDLOCK_SUPERVISOR_SOCKET", raising=False)
    client = supervisor.start(manifests=str(lab.manifest_dir), extra_args=["--grace", "1", "--allow-root-servers"])
    yield client
    if client._control.fileno() >= 0:
        client.close()
    assert wait_until(lambda: not alive(client.server_pid), 5)
    assert not processes_with_tag(lab.tag)


@pytest.mark.timeout(30)
@pytest.mark.enforcement
def test_private_spawn_wait_close(private, lab):
    server = private.server_pid
    assert private.ping()["pid"] == server
    r = sh(private, "echo private; exit 4")
    assert r.code == 4 and r.out == b"private\n"
    assert run(private, "cat", stdin=b"through\n").out == b"through\n"
    with pytest.raises(NoSuchManifest):
        run(private, "nonexistent")
    # No socket file: nothing is bound to a path, nothing in the runtime dir.
    paths = unix_socket_paths(socket_inodes(server))
    assert not [p for p in paths if p.startswith("/") or p.startswith("@")], paths
    assert os.listdir(lab.dir / "xdg") == []
    assert not (lab.dir / "run").exists()
    # Its children are confined all the same.
    r = sh(private, f"cat {lab.dir}/manifests/sh.yaml")
    assert r.code != 0 and b"Permission denied" in r.err
    assert private.close() == 0
    assert not alive(server)


@pytest.mark.timeout(30)
def test_private_server_holds_none_of_the_proxys_fds(lab):
    """An inheritable fd of the proxy (a pipe to some other child of its)
    must not stay open in the private server: its reader would never see EOF."""
    lab.stock()
    r, w = os.pipe()
    os.set_inheritable(w, True)
    os.set_inheritable(r, True)
    try:
        with supervisor.start(manifests=str(lab.manifest_dir), extra_args=["--grace", "1", "--allow-root-servers"]) as client:
            ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (r, w)}
            theirs = set()
            for fd in os.listdir(f"/proc/{client.server_pid}/fd"):
                try:
                    theirs.add(os.readlink(f"/proc/{client.server_pid}/fd/{fd}"))
                except OSError:
                    pass
            assert not ours & theirs, theirs
            os.close(w)
            w = -1
            assert os.read(r, 1) == b""   # EOF: nobody else holds the write end
            assert sh(client, "echo ok").out == b"ok\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.timeout(30)
def test_runs_private_supervisor_holds_none_of_runs_fds(lab):
    """`run --manifests` forks its private supervisor: that keeps only its
    stderr and its control channel, never an fd the MCP client gave `run`
    (its stdin/stdout pipes, an inheritable pipe)."""
    lab.stock()
    r, w = os.pipe()
    proc = subprocess.Popen([PYTHON, "-m", "supervisor", "run", "--allow-root-servers", "--manifests",
                             str(lab.manifest_dir), "sh", "--", "echo up; exec sleep 100"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=[w])
    try:
        assert read_line(proc.stdout.fileno(), 10) == b"up\n"
        [server] = [p for p in procfs.children_of(proc.pid)]
        theirs = {}
        for fd in os.listdir(f"/proc/{server}/fd"):
            with contextlib.suppress(OSError):
                theirs[int(fd)] = os.readlink(f"/proc/{server}/fd/{fd}")
        given = {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (0, 1, w)}
        assert not given & set(theirs.values()), theirs
        assert theirs[0] == theirs[1] == "/dev/null" and theirs[3].startswith("socket:"), theirs
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        os.close(r)
        os.close(w)
    # The private supervisor ends its server once `run` is gone, in its own time.
    assert wait_until(lambda: not processes_with_tag(lab.tag), 10)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["run", "library"])
def test_private_supervisor_imports_nothing_from_the_working_directory(lab, tmp_path, how):
    """A `yaml.py` in the MCP client's project directory is not imported by
    the private supervisor (as root, code run as root): `run` as its console
    script starts it, and a proxy's private.start() from there."""
    lab.stock()
    marker = tmp_path / "imported"
    for name in ("yaml", "prctl", "landlock"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise SystemExit(9)\n")
    if how == "run":
        argv = [str(Path(PYTHON).parent / "landlock-supervisor"), "run", "--allow-root-servers", "--manifests",
                str(lab.manifest_dir), "sh", "--", "echo ok"]
    else:
        code = ("import sys; from supervisor.client import private; c = private.start(sys.argv[1], "
                "extra_args=['--allow-root-servers']); print(c.ping()['event']); c.close()")
        argv = [PYTHON, "-I", "-c", code, str(lab.manifest_dir)]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=20)
    assert not marker.exists(), r
    assert r.returncode == 0 and r.stdout in (b"ok\n", b"pong\n"), r


@pytest.mark.timeout(30)
def test_the_private_supervisors_error_reaches_runs_stderr_a_socket(tmp_path):
    """`run --manifests` with stderr a socket (a node client's) that said a
    line before its fork (a deprecated option's warning): the private
    supervisor's own error still reaches that
    stderr, not the fd number run's writer of it held, which the fork gave
    to its control channel."""
    import socket as sockets
    ours, theirs = sockets.socketpair()
    with ours, theirs:
        r = subprocess.run([str(Path(PYTHON).parent / "landlock-supervisor"), "run", "--env", "HOME", "--manifests",
                            str(tmp_path / "missing.yaml"), "x"], cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=theirs.fileno(),
                           timeout=20)
        theirs.close()
        said = b"".join(iter(lambda: ours.recv(65536), b"")).decode()
    assert r.returncode != 0
    assert "run --env HOME is deprecated" in said, said
    assert "missing.yaml" in said and "Traceback" not in said, said


@pytest.mark.timeout(30)
def test_private_server_ends_with_its_client(private):
    child, pipes = spawn_bg(private, "sh", ["trap '' TERM; echo $$; sleep 100 & echo $!; wait"])
    try:
        pids = [int(pipes.line()), int(pipes.line())]
        assert all(alive(p) for p in pids)
        server = private.server_pid
        private._control.close()   # the proxy's end goes away (as when the proxy dies)
        assert wait_until(lambda: not alive(server), 5), state(server)
        _, status = os.waitpid(server, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not [p for p in pids if alive(p)]
        assert child.wait(5) == -signal.SIGKILL
        assert child.exited["reason"] == "shutdown"
    finally:
        child.close()
        pipes.close()


@pytest.mark.timeout(30)
def test_private_exec_failure_and_many_spawns(lab, monkeypatch):
    program = lab.dir / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    lab.manifest("server", command=str(program))
    lab.stock()
    with supervisor.start(manifests=str(lab.manifest_dir), extra_args=["--grace", "1", "--allow-root-servers"]) as client:
        program.unlink()
        with pytest.raises(SpawnFailed) as e:
            run(client, "server")
        assert e.value.stage == "exec"
        for _ in range(50):
            assert run(client, "true").code == 0
        before = len(os.listdir(f"/proc/{client.server_pid}/fd"))
        stats = client.stats()
        assert stats["spawned"] == 50 and stats["failed"] == 1
        for _ in range(50):
            assert run(client, "true").code == 0
        assert wait_until(lambda: len(os.listdir(f"/proc/{client.server_pid}/fd")) <= before, 5)
        # It stats its paths at each spawn: none of its uid's inotify instances (128, all its programs') taken.
        assert "anon_inode:inotify" not in _fd_targets(client.server_pid)
        server = client.server_pid
    assert not alive(server)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass   # (closed meanwhile)
    return targets


# ---- landlock-supervisor run ---------------------------------------------------------

def _run_cmd(args, *, input=None, env=None, timeout=15):
    return subprocess.run([PYTHON, "-m", "supervisor", *args], cwd=REPO, input=input,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(params=["daemon", "private"])
def runner(request, lab):
    """argv prefix for `run`: through a running supervisor, or private via --manifests."""
    lab.stock()
    if request.param == "daemon":
        svr = lab.start()
        return ["--socket", str(svr.socket_path), "run"]
    return ["run", "--allow-root-servers", "--manifests", str(lab.manifest_dir)]


@pytest.mark.timeout(30)
def test_run_relays_stdio(runner):
    data = b"".join(b"%d\n" % i for i in range(20000))
    r = _run_cmd([*runner, "cat"], input=data)
    assert r.returncode == 0, r.stderr
    assert r.stdout == data


@pytest.mark.timeout(30)
@pytest.mark.parametrize("script,status", [("exit 0", 0), ("exit 5", 5), ("kill -9 $$", 137),
                                           ("kill -15 $$", 143)])
def test_run_exit_status(runner, script, status):
    r = _run_cmd([*runner, "sh", "--", script])
    assert r.returncode == status, r.stderr


@pytest.mark.timeout(30)
def test_run_errors(runner):
    r = _run_cmd([*runner, "nonexistent"])
    assert r.returncode == 2 and b"nonexistent" in r.stderr, r
    r = _run_cmd([*runner, "cat", "--", "/etc/passwd"])
    assert r.returncode != 0 and b"does not let clients add arguments" in r.stderr, r
    assert r.stdout == b""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_forwards_signals(runner, sig, lab):
    script = (f"trap 'echo caught; exit 42' {sig.name[3:]}; echo ready; "
              "sleep 100 & wait")
    with _running(runner, script) as proc:
        assert read_line(proc.stdout.fileno(), 10) == b"ready\n"
        proc.send_signal(sig)
        assert proc.wait(10) == 42, proc.stderr.read()
        assert proc.stdout.read() == b"caught\n"
    assert wait_until(lambda: not processes_with_tag(lab.tag), 3)


@pytest.mark.timeout(30)
def test_run_killed_ends_its_child(runner, lab):
    """SIGKILL to `run` (nothing forwarded): the connection closes and the
    child goes with it."""
    with _running(runner, "echo $$; exec sleep 100") as proc:
        child = int(read_line(proc.stdout.fileno(), 10))
        assert alive(child)
        started = time.monotonic()
        proc.kill()
        proc.wait()
        assert wait_until(lambda: not alive(child), 3), state(child)
        assert time.monotonic() - started < 3


@pytest.mark.timeout(30)
def test_run_term_then_kill_keeps_the_grace_from_the_term(runner, lab):
    """An MCP client TERMs `run` (forwarded), waits, then SIGKILLs it: a
    server ignoring TERM is KILLed at that TERM + the grace, not at the
    connection's close + the grace (1 s for the test daemon, 5 s for a
    private supervisor)."""
    grace = GRACE if "--socket" in runner else 5.0
    with _running(runner, "trap '' TERM; echo $$; exec sleep 100") as proc:
        child = int(read_line(proc.stdout.fileno(), 10))
        assert alive(child)
        termed = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(grace * 0.6)
        assert alive(child)
        proc.kill()
        proc.wait()
        assert wait_until(lambda: not alive(child), grace * 2), state(child)
        took = time.monotonic() - termed
        assert grace * 0.8 <= took < grace + 0.45, f"KILL {took:.2f} s after the TERM, grace {grace}"


@pytest.mark.timeout(30)
def test_run_resolves_relative_args_against_its_cwd(runner, lab):
    """`run NAME -- . ./x ../y` from a project: the server (in its manifest's
    cwd, / here) gets those against the client's cwd, not its own."""
    project = lab.dir / "project"
    project.mkdir()
    r = subprocess.run([PYTHON, "-m", "supervisor", *runner, "sh", "--", 'echo "$@"; pwd', "zero",
                        ".", "./x", "../y", "z", "/abs"], cwd=project, capture_output=True, timeout=20,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [f"{project} {project}/x {lab.dir}/y z /abs", "/"]


@pytest.mark.timeout(30)
def test_run_says_the_supervisor_shut_down(lab):
    """The daemon stops under a running `run`: 143 as before, and one line
    on stderr saying why (a client otherwise sees its server gone mutely)."""
    lab.stock()
    svr = lab.start()
    with _running(["run", "--socket", str(svr.socket_path)], "echo up; exec sleep 100") as proc:
        assert read_line(proc.stdout.fileno(), 10) == b"up\n"
        svr.signal(signal.SIGTERM)
        assert proc.wait(10) == 143
        assert proc.stderr.read().decode().splitlines()[-1] == \
            "landlock-supervisor: sh was stopped: the supervisor is shutting down"
        assert svr.proc.wait(10) == 0
    svr.stop()


@pytest.mark.timeout(30)
def test_run_passes_client_env(lab):
    lab.manifest("env", command="/usr/bin/env", client_env=["TOKEN"])
    svr = lab.start()
    r = _run_cmd(["--socket", str(svr.socket_path), "run", "--pass-env", "TOKEN", "--pass-env", "HOME", "env"],
                 env={"TOKEN": "s3cret"})
    # HOME is in this environment but not in client_env: refused, nothing runs.
    assert r.returncode != 0 and b"HOME" in r.stderr, r
    r = _run_cmd(["--socket", str(svr.socket_path), "run", "--pass-env", "TOKEN", "env"], env={"TOKEN": "s3cret"})
    assert r.returncode == 0, r
    assert b"TOKEN=s3cret\n" in r.stdout
    assert b"deprecated" not in r.stderr


@pytest.mark.timeout(30)
def test_run_env_is_the_old_spelling_of_pass_env(lab):
    """`run --env NAME` works for one release, with one line naming --pass-env."""
    lab.manifest("env", command="/usr/bin/env", client_env=["TOKEN"])
    svr = lab.start()
    r = _run_cmd(["run", "--socket", str(svr.socket_path), "--env", "TOKEN", "--env", "TOKEN", "env"],
                 env={"TOKEN": "s3cret"})
    assert r.returncode == 0, r
    assert b"TOKEN=s3cret\n" in r.stdout
    assert [line for line in r.stderr.decode().splitlines() if "deprecated" in line] == \
        ["landlock-supervisor: warning: run --env TOKEN is deprecated: use run --pass-env TOKEN"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["daemon", "private"])
def test_run_passes_what_the_manifest_takes(lab, mode):
    """An MCP client config's `env` (GITHUB_TOKEN...) reaches the server when
    the manifest lists the name in client_env, with no --env; the client's
    other variables stay in `run`, named on stderr (not the standard ones)."""
    lab.manifest("env", command="/usr/bin/env", client_env=["TOKEN", "ABSENT"])
    client = {"HOME": "/", "LOGNAME": "u", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "TERM": "dumb",
              "USER": "u", "LC_ALL": "C", "TOKEN": "s3cret", "UNRELATED_SECRET": "keep me"}
    if mode == "daemon":
        svr = lab.start()
        argv = ["run", "--socket", str(svr.socket_path), "env"]
    else:
        argv = ["run", "--allow-root-servers", "--manifests", str(lab.manifest_dir), "env"]
    r = subprocess.run([PYTHON, "-m", "supervisor", *argv], cwd=REPO, env=client, capture_output=True,
                       timeout=20)
    assert r.returncode == 0, r
    assert b"TOKEN=s3cret\n" in r.stdout and b"UNRELATED_SECRET" not in r.stdout, r
    note = [line for line in r.stderr.decode().splitlines() if "not passed" in line]
    assert note == ["landlock-supervisor: not passed to env (not in its client_env): UNRELATED_SECRET"], r.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["daemon", "private"])
def test_run_names_only_what_was_dropped_a_few_at_most(lab, mode):
    """The variables the manifest reads itself (its ${VAR}s, inherit_env) are
    not called dropped; of the others three are named, the rest counted;
    --verbose names all."""
    lab.manifest("env", command="/usr/bin/env", args=["LLS_ARG=${LLS_SERVERS}"], inherit_env=["LLS_INHERITED"],
                 client_env=["TOKEN"])
    client = {"HOME": "/", "PATH": "/usr/bin:/bin", "OLDPWD": "/", "LLS_SERVERS": "/srv", "LLS_INHERITED": "x",
              **{f"DROPPED_{i}": "x" for i in range(6)}}
    if mode == "daemon":
        svr = lab.start(env={"LLS_SERVERS": "/srv"})
        argv = ["run", "--socket", str(svr.socket_path)]
    else:
        argv = ["run", "--allow-root-servers", "--manifests", str(lab.manifest_dir)]
    for verbose, named in (([], "DROPPED_0, DROPPED_1, DROPPED_2 and 3 more (run --verbose names them)"),
                           (["--verbose"], ", ".join(f"DROPPED_{i}" for i in range(6)))):
        r = subprocess.run([PYTHON, "-m", "supervisor", *argv, *verbose, "env"], cwd=REPO, env=client,
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 0 and "LLS_ARG=/srv\n" in r.stdout, r
        note = [line for line in r.stderr.splitlines() if "not passed" in line]
        assert note == [f"landlock-supervisor: not passed to env (not in its client_env): {named}"], r.stderr


@pytest.mark.timeout(30)
def test_ping_list_stats_commands(sv):
    import json
    base = ["--socket", str(sv.socket_path)]
    r = _run_cmd([*base, "ping"])
    assert r.returncode == 0 and json.loads(r.stdout)["pid"] == sv.pid
    r = _run_cmd([*base, "list"])
    assert r.returncode == 0 and "sh" in json.loads(r.stdout)["manifests"]
    r = _run_cmd([*base, "stats"])
    assert r.returncode == 0 and json.loads(r.stdout)["fds"] > 0
    r = _run_cmd(["--socket", "/nonexistent/socket", "ping"])
    assert r.returncode == 1 and b"cannot reach the supervisor" in r.stderr


@pytest.mark.timeout(30)
def test_socket_after_a_command_that_talks_to_no_supervisor_is_said_once():
    """`check --socket PATH` was accepted and unused: it still runs, for one
    release, with one line; `--socket PATH check` (before it) stays silent."""
    r = _run_cmd(["check", "--socket", "/nowhere", "--profiles"])
    assert r.returncode == 0 and b"system:" in r.stdout, r
    assert r.stderr.decode().splitlines() == \
        ["landlock-supervisor: warning: check --socket is deprecated: check talks to no supervisor; give no --socket"]
    r = _run_cmd(["--socket", "/nowhere", "check", "--profiles"])
    assert (r.returncode, r.stderr) == (0, b""), r
