"""Lifecycles: client disconnects, grandchildren, shutdown, reload, crash
recovery, and manifests the supervisor refuses to start with."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from supervisor.manifests import manifest as manifests
from supervisor.client import NoSuchManifest
from supervisor.manifests.manifest import ManifestError
from svhelpers import (GRACE, PYTHON, REPO, alive, processes_with_tag, run, sh, spawn_bg, state,
                       wait_until, zombies_of)


def _family(script_pipes):
    """The child's pid and its grandchild's, which the script echoes first."""
    return int(script_pipes.line())


# ---- client disconnect ----------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("stubborn", [False, True], ids=["obeys_term", "ignores_term"])
def test_disconnect_kills_the_process_group(sv, stubborn):
    trap = "trap '' TERM; " if stubborn else ""
    child, pipes = spawn_bg(sv.client, "sh", [f"{trap}sleep 100 & echo $!; wait"])
    try:
        grandchild = _family(pipes)
        assert alive(child.pid) and alive(grandchild)
        assert int(open(f"/proc/{grandchild}/stat").read().split(") ")[1].split()[2]) == child.pid
        started = time.monotonic()
        child.close()   # the client goes away
        assert wait_until(lambda: not alive(child.pid) and not alive(grandchild), GRACE + 1), \
            (state(child.pid), state(grandchild))
        elapsed = time.monotonic() - started
        if stubborn:
            assert elapsed >= GRACE * 0.8, "KILL came before the grace period"
        # Reaped, not left as zombies.
        assert wait_until(lambda: not zombies_of(sv.pid), 2), zombies_of(sv.pid)
        assert wait_until(lambda: sv.client.stats()["children"] == 0, 2)
    finally:
        pipes.close()


@pytest.mark.timeout(20)
def test_on_disconnect_keep(lab):
    lab.manifest("keeper", command="/bin/sh", args=["-c", "sleep 100 & echo $!; wait"],
                 on_disconnect="keep", sandbox={"profiles": ["system"], "read_only": ["/usr/bin"]})
    svr = lab.start()
    child, pipes = spawn_bg(svr.client, "keeper")
    try:
        grandchild = _family(pipes)
        child.close()
        time.sleep(GRACE + 0.5)
        assert alive(child.pid) and alive(grandchild)
        listed = svr.client.list()["children"]
        assert [(c["pid"], c["running"], c["peer_pid"]) for c in listed] == [(child.pid, True, None)]
    finally:
        pipes.close()
    # Teardown's SIGTERM must still end it (and its grandchild).


# ---- grandchildren -------------------------------------------------------------------

@pytest.mark.timeout(20)
def test_double_forked_grandchild_is_reaped(sv):
    """The child exits at once; its grandchild (TERM ignored, so the group's
    TERM does not end it) outlives it, is reparented to the supervisor, a
    subreaper, exits by itself and is reaped: no zombie stays."""
    before = sv.client.stats()["reaped_orphans"]
    r = sh(sv.client, "(trap '' TERM; exec sleep 0.4) >/dev/null 2>&1 & echo $!; exit 0")
    assert r.code == 0
    grandchild = int(r.text)
    assert wait_until(lambda: state(grandchild) is None or int(
        open(f"/proc/{grandchild}/stat").read().split(") ")[1].split()[1]) == sv.pid, 2)
    assert wait_until(lambda: state(grandchild) is None, 3), state(grandchild)
    assert not zombies_of(sv.pid)
    assert sv.client.stats()["reaped_orphans"] == before + 1


@pytest.mark.timeout(30)
def test_many_short_grandchildren_leave_no_zombie(sv):
    script = "for i in 1 2 3 4 5; do (setsid sleep 0.05 &) ; done; exit 0"
    for _ in range(10):
        assert sh(sv.client, script).code == 0
    assert wait_until(lambda: not zombies_of(sv.pid) and sv.client.stats()["reaped_orphans"] >= 50, 5), \
        (zombies_of(sv.pid), sv.client.stats())


@pytest.mark.timeout(30)
def test_reused_pid_is_not_killed_by_an_old_timer(sv):
    """After a child exits, what is left of its process group gets TERM, and
    KILL after the grace period. If its pid is taken by the next child (pids
    wrap), that KILL must not land on the new child's process group."""
    client = sv.client
    for attempt in range(20):
        first = sh(client, "exit 0")
        pid = first.child.pid
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:   # the next fork gets pid
                f.write(str(pid - 1))
        except PermissionError:
            pytest.skip("needs root to set ns_last_pid")
        child, pipes = spawn_bg(client, "sh", ["echo up; exec sleep 100"])
        if child.pid == pid:
            break
        child.close()
        pipes.close()
    else:
        pytest.skip("could not get a pid reused (a busy machine)")
    try:
        assert pipes.line() == "up"
        time.sleep(GRACE + 0.5)
        assert alive(child.pid), "the first child's KILL timer killed the second"
        assert child.status()["running"]
    finally:
        child.close()
        pipes.close()


# ---- shutdown ----------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_sigterm_shutdown(sv, lab):
    scripts = ["exec sleep 100",
               "trap '' TERM; sleep 100 & echo $!; wait",    # both ignore TERM: KILL after grace
               "sleep 100 & echo $!; wait"]
    running = []
    for script in scripts:
        child, pipes = spawn_bg(sv.client, "sh", [f"echo $$; {script}"])
        pids = [int(pipes.line())]
        if "echo $!" in script:
            pids.append(int(pipes.line()))
        running.append((child, pipes, pids))
    every = [p for _, _, pids in running for p in pids]
    assert all(alive(p) for p in every)
    records = os.listdir(lab.state_root / "sessions")
    assert len(records) == 3
    sv.signal(signal.SIGTERM)
    try:
        for child, _, _ in running:
            assert child.wait(GRACE + 5) is not None
            assert child.exited["reason"] == "shutdown", child.exited
        assert sv.proc.wait(GRACE + 5) == 0, sv.log()
        assert not sv.socket_path.exists()
        assert not [p for p in every if alive(p)]
        assert not processes_with_tag(lab.tag)
        assert os.listdir(lab.state_root / "sessions") == []
        assert [c.exited["signal"] for c, _, _ in running] == [15, 9, 15]
    finally:
        for child, pipes, _ in running:
            child.close()
            pipes.close()
    sv.stop()  # the checks of teardown, on an exited supervisor


@pytest.mark.timeout(20)
def test_sigint_shutdown_and_refusal_while_stopping(sv):
    child, pipes = spawn_bg(sv.client, "sh", ["trap '' TERM; echo up; exec sleep 100"])
    try:
        assert pipes.line() == "up"
        sv.signal(signal.SIGINT)
        # Stopped accepting: the socket is gone at once, not after the grace.
        assert wait_until(lambda: not sv.socket_path.exists(), 1)
        assert sv.proc.poll() is None  # still waiting for its child
        assert child.wait(GRACE + 5) == -signal.SIGKILL
        assert child.exited["reason"] == "shutdown"
        assert sv.proc.wait(5) == 0
    finally:
        child.close()
        pipes.close()


# ---- reload ----------------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_sighup_reload(sv, lab):
    child, pipes = spawn_bg(sv.client, "sh", ["echo up; exec sleep 100"])
    try:
        assert pipes.line() == "up"
        lab.manifest("newcomer", command="echo", args=["new"], env={"PATH": "/usr/bin"})
        (lab.manifest_dir / "cat.yaml").unlink()
        sv.signal(signal.SIGHUP)
        assert wait_until(lambda: "newcomer" in sv.client.list()["manifests"], 5), sv.log()
        assert "cat" not in sv.client.list()["manifests"]
        assert child.status()["running"]
        r = _run(sv, "newcomer")
        assert r.out == b"new\n"
        # A manifest broken at reload (a typo while editing it) is withdrawn, never
        # kept in its old version; the others stay; its running session goes on.
        sh_yaml = lab.manifest_dir / "sh.yaml"
        sh_yaml.write_text(sh_yaml.read_text() + "surprise: 1\n")
        sv.signal(signal.SIGHUP)
        assert wait_until(lambda: "sh" not in sv.client.list()["manifests"], 5), sv.log()
        assert f"{sh_yaml}: surprise: unknown key" in sv.log() and ": withdrawn" in sv.log(), sv.log()
        assert sorted(sv.client.list()["manifests"]) == ["false", "newcomer", "sleep", "true"]
        with pytest.raises(NoSuchManifest, match=re.escape(f"manifest 'sh' is not served: {sh_yaml}: surprise: ")):
            _run(sv, "sh")
        assert _run(sv, "newcomer").out == b"new\n"
        assert child.status()["running"] and alive(child.pid)
        # The child of a manifest that went away runs on, and is signalled as before.
        sh_yaml.unlink()
        sv.signal(signal.SIGHUP)
        assert wait_until(lambda: "reloaded 4 manifest(s)\n" in sv.log(), 5), sv.log()
        with pytest.raises(NoSuchManifest, match="no manifest named 'sh'; there are: false, newcomer, sleep, true"):
            _run(sv, "sh")
        assert child.status()["running"]
        child.terminate()
        assert child.wait(5) == -signal.SIGTERM
    finally:
        child.close()
        pipes.close()


def _run(sv, name):
    return run(sv.client, name)


@pytest.mark.timeout(20)
def test_reload_rebuilds_rulesets_for_changed_paths(lab):
    """A granted directory replaced by another (new inode) at the same path."""
    data = lab.dir / "data"
    data.mkdir()
    (data / "f").write_text("one\n")
    lab.manifest("sh", command="/bin/sh", args=["-c"], client_args=True,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"],
                          "read_only_noexec": [str(data)]})
    svr = lab.start()
    assert sh(svr.client, f"cat {data}/f").text == "one\n"
    os.rename(data, lab.dir / "old")
    data.mkdir()
    (data / "f").write_text("two\n")
    r = sh(svr.client, f"cat {data}/f")
    assert r.text == "two\n", r


# ---- crash recovery -------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_crash_recovery(lab):
    lab.stock()
    svr = lab.start()
    child, pipes = spawn_bg(svr.client, "sh", ["sleep 100 & echo $!; wait"])
    grandchild = int(pipes.line())
    pipes.close()
    assert len(os.listdir(lab.state_root / "sessions")) == 1
    svr.proc.kill()
    svr.proc.wait()
    svr.stopped = True
    child.close()
    # PDEATHSIG ends the direct child; the grandchild survives (reparented).
    assert wait_until(lambda: not alive(child.pid), 3), state(child.pid)
    time.sleep(0.2)
    assert alive(grandchild), "the premise: PDEATHSIG does not reach grandchildren"
    # The next supervisor on the same state root ends it before it serves.
    assert svr.socket_path.exists()  # stale: a crashed supervisor cannot remove it
    again = lab.start()
    assert wait_until(lambda: not alive(grandchild), 2), state(grandchild)
    assert re.search(r"ended [12] process\(es\) left from session %d" % child.pid, again.log()), again.log()
    assert os.listdir(lab.state_root / "sessions") == []
    assert again.client.ping()["pid"] == again.pid
    assert sh(again.client, "echo fine").text == "fine\n"


@pytest.mark.timeout(20)
def test_stale_record_of_a_reused_pid_is_not_killed(lab):
    """A session record whose pid now belongs to another process (another
    start time) must not kill that process."""
    lab.stock()
    bystander = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        sessions = lab.state_root / "sessions"
        sessions.mkdir(parents=True)
        (sessions / f"{bystander.pid}.1").touch()   # start time 1: not this process
        svr = lab.start()
        assert svr.client.ping()
        assert bystander.poll() is None
        assert os.listdir(sessions) == []
    finally:
        bystander.kill()
        bystander.wait()


# ---- manifests the supervisor refuses ----------------------------------------------------------

def _serve(lab, timeout=10, extra=("--allow-root-servers",)):
    return subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(lab.dir / "run" / "socket"), "serve",
                           "--manifests", str(lab.manifest_dir), "--state-root", str(lab.state_root), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(20)
def test_root_supervisor_requires_user_or_allow_root(lab):
    assert os.geteuid() == 0, "these tests run as root"
    path = lab.manifest("anyone", command="true", raw="command: /bin/true\n")   # alone: nothing to serve
    r = _serve(lab)
    assert r.returncode == 2, r
    assert str(path) in r.stderr and "user" in r.stderr and "allow_root" in r.stderr, r.stderr
    assert not (lab.dir / "run" / "socket").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text,key", [
    ("command: /bin/true\nallow_root: true\ncolour: red\n", "colour"),
    ("command: /bin/true\nallow_root: true\nclient_args: 'yes'\n", "client_args"),
    ("command: /bin/true\nallow_root: true\nargs: -v\n", "args"),
    ("command: /bin/true\nallow_root: true\nenv: {A: [1]}\n", "env.A"),
    ("command: /bin/true\nallow_root: true\nsandbox: {read_onyl: [/usr]}\n", "sandbox.read_onyl"),
    ("command: /bin/true\nallow_root: true\nsandbox: {read_only: /usr}\n", "sandbox.read_only"),
    ("command: /bin/true\nallow_root: true\nsandbox: {read_only: [usr]}\n", "sandbox.read_only"),
    ("command: /bin/true\nallow_root: true\nsandbox: {network: {connect_tcp: [https]}}\n",
     "sandbox.network.connect_tcp[0]"),
    ("command: /bin/true\nallow_root: true\nsandbox: {rlimits: {NOFILE: lots}}\n", "sandbox.rlimits.NOFILE"),
    ("command: /bin/true\nallow_root: true\nsandbox: {profiles: [nosuch]}\n", "sandbox.profiles"),
    ("command: /bin/true\nallow_root: true\non_disconnect: linger\n", "on_disconnect"),
    ("command: /nonexistent/server\nallow_root: true\n", "command"),
    ("allow_root: true\n", "command"),
    ("command: /bin/true\nallow_root: 1\n", "allow_root"),
    ("- command: true\n", "expected a mapping"),
    ("command: [true\n", "not valid YAML"),
])
def test_broken_manifest_is_refused_naming_file_and_key(lab, text, key):
    """In-process (the loader serve uses); serve itself is run for a few below."""
    lab.stock()
    path = lab.manifest("broken", command="true", raw=text)
    with pytest.raises(ManifestError) as e:
        manifests.load_all([lab.manifest_dir], state_root=str(lab.state_root))
    assert str(e.value).startswith(f"{path}: "), e.value
    assert key in str(e.value), e.value


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text,key", [
    ("command: /bin/true\nallow_root: true\ncolour: red\n", "colour: unknown key"),
    ("command: /bin/true\nallow_root: true\nclient_args: 'yes'\n", "client_args: expected a boolean"),
    ("command: /bin/true\nallow_root: true\nsandbox: {read_only: /usr}\n",
     "sandbox.read_only: expected a list"),
])
def test_broken_manifest_alone_stops_serve(lab, text, key):
    """Nothing served: not starting, its one line (with others, tests/e2e/test_e2e_manifest_errors.py)."""
    path = lab.manifest("broken", command="true", raw=text)
    r = _serve(lab)
    assert r.returncode == 2, r
    assert f"{path}: {key}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (lab.dir / "run" / "socket").exists()


@pytest.mark.timeout(20)
def test_duplicate_name_is_refused(lab):
    """Two files of one name: neither is served (which policy was meant?), the others are."""
    lab.stock()
    other = lab.manifest("other", command="true", raw="name: cat\ncommand: /bin/true\nallow_root: true\n")
    loaded, broken = manifests.load_each([lab.manifest_dir], state_root=str(lab.state_root))
    assert sorted(loaded) == ["false", "sh", "sleep", "true"]
    cat = lab.manifest_dir / "cat.yaml"
    assert sorted(b.error for b in broken) == [f"{cat}: name: 'cat' is also the name of {other}: neither is served",
                                               f"{other}: name: 'cat' is also the name of {cat}: neither is served"]
    r = _serve(lab, extra=())   # every stock manifest runs as root: refused alone, and so nothing is served
    assert r.returncode == 2 and "none of the 5 manifests is served" in r.stderr, r.stderr
    assert "cat.yaml: name: 'cat' is also the name of" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.timeout(20)
def test_second_supervisor_on_the_same_socket_refused(sv, lab):
    r = _serve(lab)
    assert r.returncode != 0
    assert "another supervisor is listening" in r.stderr, r.stderr
    assert sv.client.ping()["pid"] == sv.pid


@pytest.mark.timeout(20)
def test_socket_activation(lab):
    """A listening socket passed as fd 3 (LISTEN_FDS, LISTEN_PID): used,
    made close-on-exec, and left in place at exit (its owner's to remove)."""
    import socket

    from supervisor.client import Client
    lab.stock()
    path = lab.dir / "activation.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(8)
    script = ('exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"')
    proc = subprocess.Popen(["sh", "-c", script, "sh", PYTHON, "-m", "supervisor", "serve",
                             "--manifests", str(lab.manifest_dir), "--state-root", str(lab.state_root),
                             "--grace", str(GRACE), "--allow-root-servers"],
                            cwd=REPO, stdin=listener.fileno(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    listener.close()
    try:
        client = Client(str(path))
        assert wait_until(lambda: _pings(client), 10)
        with open(f"/proc/{proc.pid}/fdinfo/3") as f:
            flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
        assert flags & os.O_CLOEXEC
        r = sh(client, "ls /proc/self/fd; tr '\\0' '\\n' < /proc/self/environ | grep -c LISTEN_ || true")
        assert r.text.split() == ["0", "1", "2", "3", "0"], r
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, proc.stderr.read()
        assert path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _pings(client):
    try:
        return client.ping()
    except (OSError, TimeoutError):
        return False
