"""Spawning: exit statuses, stdio through passed pipes, fd hygiene, the
child's environment, what a client may add, instant exits, exec failures
and signals that land between fork and exec."""
from __future__ import annotations

import errno
import os
import selectors
import signal
import time

import pytest

from supervisor.client import SpawnFailed, SupervisorError
from svhelpers import (children_of, connect, proc_status, read_all, recv, run, send, sh, spawn_bg,
                       state, stat_fields, wait_until)


# ---- exit status -------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_exit_code(shared_sv, code):
    r = sh(shared_sv.client, f"exit {code}")
    assert r.code == code
    assert r.child.exited["code"] == code and r.child.exited["signal"] is None
    assert r.child.exited["reason"] == "exited"
    assert r.child.returncode == code


@pytest.mark.timeout(20)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV])
def test_exit_by_signal(shared_sv, sig):
    r = sh(shared_sv.client, f"kill -{int(sig)} $$")
    assert r.child.exited["code"] is None
    assert r.child.exited["signal"] == sig
    assert r.child.exited["signal_name"] == sig.name
    assert r.child.exited["reason"] == "signalled"
    assert r.code == -sig


@pytest.mark.timeout(20)
def test_signal_on_request(shared_sv):
    child, pipes = spawn_bg(shared_sv.client, "sh", ["echo up; exec sleep 100"])
    try:
        assert pipes.line() == "up"
        assert child.pgid == child.pid
        status = child.status()
        assert status["running"] is True and status["pid"] == child.pid
        child.signal(signal.SIGUSR1)
        assert child.wait(10) == -signal.SIGUSR1
        assert child.exited["reason"] == "signalled_on_request"
        child.signal(signal.SIGTERM)  # after the exit: a no-op, not an error
    finally:
        child.close()
        pipes.close()


@pytest.mark.timeout(20)
def test_spawned_report_and_rusage(shared_sv):
    r = sh(shared_sv.client, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
    assert r.code == 0
    report = r.child.report
    assert report.enforced and report.abi >= 1 and report.no_new_privs
    rusage = r.child.exited["rusage"]
    assert rusage["utime"] + rusage["stime"] > 0
    assert rusage["maxrss_kib"] > 0


# ---- stdio and fd hygiene ------------------------------------------------------

@pytest.mark.timeout(20)
def test_stdio_through_passed_pipes(shared_sv):
    payload = b"".join(b"line %d\n" % i for i in range(5000))  # > a pipe buffer
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    child = shared_sv.client.spawn("cat", stdin=in_r, stdout=out_w, stderr=2)
    os.close(in_r)
    os.close(out_w)
    with child:
        got = b""
        view = memoryview(payload)
        os.set_blocking(in_w, False)
        sel = selectors.DefaultSelector()
        sel.register(in_w, selectors.EVENT_WRITE)
        sel.register(out_r, selectors.EVENT_READ)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for key, _ in sel.select(1):
                if key.fd == in_w:
                    n = os.write(in_w, view[:65536])
                    view = view[n:]
                    if not view:
                        sel.unregister(in_w)
                        os.close(in_w)
                else:
                    chunk = os.read(out_r, 65536)
                    if not chunk:
                        sel.unregister(out_r)
                    got += chunk
            if not sel.get_map():
                break
        sel.close()
        os.close(out_r)
        assert got == payload
        assert child.wait(10) == 0


@pytest.mark.timeout(20)
def test_stderr_is_the_third_fd(shared_sv):
    r = sh(shared_sv.client, "echo out; echo err >&2; read x; echo got $x", stdin=b"input\n")
    assert r.code == 0
    assert r.out == b"out\ngot input\n"
    assert r.err == b"err\n"


@pytest.mark.timeout(20)
def test_child_has_only_stdio(shared_sv):
    # Open fds in the test process (inheritable ones too) must not show up.
    stray = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(stray, True)
    try:
        r = sh(shared_sv.client, "ls /proc/self/fd")
    finally:
        os.close(stray)
    assert r.code == 0, r
    # 0, 1, 2, and the directory ls itself opened to list it.
    fds = sorted(int(x) for x in r.text.split())
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds
    # The shell itself, as ls sees it from outside: nothing above 2 either.
    r = sh(shared_sv.client, "ls /proc/$$/fd; exit 0")
    assert sorted(int(x) for x in r.text.split()) == [0, 1, 2], r


@pytest.mark.timeout(40)
def test_no_fd_leak_in_supervisor_after_200_spawns(sv):
    client = sv.client
    # Warm-up: builds and caches the ruleset of each manifest.
    assert sh(client, "true").code == 0 and run(client, "true").code == 0
    before = sv.idle_fds()
    # Their paths' directories watched (daemon/currency.py): one inotify instance for all.
    assert list(before.values()).count("anon_inode:inotify") == 1, before
    stats_before = client.stats()["fds"]
    for i in range(200):
        r = run(client, "true") if i % 2 else sh(client, "echo $$")
        assert r.code == 0, r
    # The supervisor closes each connection when it sees its EOF: settle.
    assert sv.idle_fds() == before
    after = client.stats()
    assert after["fds"] == stats_before
    assert after["children"] == 0 and after["connections"] == 1
    assert after["spawned"] >= 201 and after["exited"] >= 201


@pytest.mark.timeout(20)
def test_received_fds_closed_after_spawn(shared_sv):
    """The supervisor must not keep the client's pipe: EOF comes when the child exits."""
    child, pipes = spawn_bg(shared_sv.client, "sh", ["echo hi"])
    try:
        out, err = read_all(pipes.out_r, pipes.err_r, timeout=5)
        pipes.out_r = pipes.err_r = -1
        assert out == b"hi\n"
        assert child.wait(5) == 0
    finally:
        child.close()
        pipes.close()


# ---- environment and what a client may add ----------------------------------------

@pytest.mark.timeout(20)
def test_environment_is_exactly_the_manifests(lab):
    lab.manifest("env", command="/usr/bin/env", args=["-0"],
                 env={"FROM_MANIFEST": "m", "PATH": "/usr/bin"},
                 inherit_env=["LLS_INHERITED", "LLS_NOT_SET"], client_env=["TOKEN", "OTHER"])
    svr = lab.start(env={"LLS_INHERITED": "inherited", "LLS_SUPERVISOR_MARKER": "secret",
                         "LD_PRELOAD": "", "HOME": "/root"})
    r = run(svr.client, "env", env={"TOKEN": "t0k3n"})
    assert r.code == 0, r
    env = dict(item.split("=", 1) for item in r.text.split("\0") if item)
    assert env == {"FROM_MANIFEST": "m", "PATH": "/usr/bin", "LLS_INHERITED": "inherited",
                   "TOKEN": "t0k3n", "LLS_TEST_TAG": lab.tag}
    assert "LLS_SUPERVISOR_MARKER" not in r.text


@pytest.mark.timeout(20)
def test_client_env_names_not_listed_are_refused(lab):
    lab.manifest("env", command="/usr/bin/env", client_env=["TOKEN"])
    svr = lab.start()
    with pytest.raises(SupervisorError) as e:
        run(svr.client, "env", env={"TOKEN": "x", "LD_PRELOAD": "/tmp/evil.so", "EVIL": "1"})
    assert e.value.code == "env_refused"
    assert "LD_PRELOAD" in str(e.value) and "EVIL" in str(e.value)
    assert "TOKEN" not in str(e.value).split("does not take")[1].split("(")[0]
    assert svr.client.stats()["children"] == 0
    assert run(svr.client, "env", env={"TOKEN": "x"}).code == 0


@pytest.mark.timeout(20)
def test_client_args_refused_unless_allowed(shared_sv):
    with pytest.raises(SupervisorError) as e:
        run(shared_sv.client, "cat", ["/etc/passwd"])
    assert e.value.code == "args_refused"
    assert "cat" in str(e.value)
    # sleep allows them.
    assert run(shared_sv.client, "sleep", ["0"]).code == 0


@pytest.mark.timeout(20)
def test_no_such_manifest(shared_sv):
    from supervisor.client import NoSuchManifest
    with pytest.raises(NoSuchManifest) as e:
        run(shared_sv.client, "nonexistent")
    assert "nonexistent" in str(e.value)


# ---- instant exits: exactly one `exited` after `spawned` ----------------------------

def _spawn_raw(path, name, args=()):
    s = connect(path)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        send(s, {"op": "spawn", "manifest": name, "args": list(args)}, [null, null, null])
    finally:
        os.close(null)
    return s


@pytest.mark.timeout(40)
@pytest.mark.parametrize("name,args,expect", [
    ("true", [], {"code": 0, "signal": None}),
    ("false", [], {"code": 1, "signal": None}),
    ("sh", ["kill -9 $$"], {"code": None, "signal": 9}),
    ("sh", ["exec 2>&-; kill -15 $$"], {"code": None, "signal": 15}),
])
def test_instant_exit_gets_exactly_one_exited(shared_sv, name, args, expect):
    for _ in range(30):
        with _spawn_raw(str(shared_sv.socket_path), name, args) as s:
            first = recv(s)
            assert first["event"] == "spawned", first
            second = recv(s)
            assert second["event"] == "exited", second
            assert {k: second[k] for k in expect} == expect
            assert second["pid"] == first["pid"]
            # A barrier: the status reply comes next, no second `exited` before it.
            send(s, {"op": "status"})
            third = recv(s)
            assert third["event"] == "status" and third["running"] is False, third
            assert third["exited"]["code"] == expect["code"]
    assert wait_until(lambda: shared_sv.client.stats()["children"] == 0, 5)


# ---- exec failure ---------------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("how,expected_errno", [("chmod", errno.EACCES), ("delete", errno.ENOENT)])
def test_exec_failure_is_reported(lab, how, expected_errno):
    program = lab.dir / "bin" / "server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\necho never\n")
    program.chmod(0o755)
    lab.manifest("server", command=str(program))
    svr = lab.start()
    if how == "chmod":
        program.chmod(0o644)
    else:
        program.unlink()
    with pytest.raises(SpawnFailed) as e:
        run(svr.client, "server")
    assert e.value.code == "spawn_failed"
    assert e.value.stage == "exec"
    assert e.value.errno == expected_errno
    assert "server" in str(e.value)
    assert wait_until(lambda: svr.client.stats()["children"] == 0, 5)
    assert svr.client.stats()["failed"] == 1
    assert not [p for p in children_of(svr.pid) if state(p) == "Z"]


# ---- signals between fork and exec -------------------------------------------------------

def _hammer(target_pids, signals, stop_after, pace=0.0):
    """A forked process that sends each of signals to target_pids() in turn,
    in a loop (pace: seconds between rounds); returns its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            deadline = time.monotonic() + stop_after
            while time.monotonic() < deadline:
                for sig in signals:
                    for p in target_pids():
                        try:
                            os.kill(p, sig)
                        except OSError:
                            pass
                if pace:
                    time.sleep(pace)
        finally:
            os._exit(0)
    return pid


def _stop(pid):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.timeout(60)
def test_signal_storm_during_200_spawns(sv):
    """SIGCHLD (cheap: a reap loop) thousands of times a second, and SIGHUP
    (a full reload, some ms each) fifty times a second, while 200 children
    are spawned:
    every spawn succeeds and reports its own status, nothing is taken for
    a signal it is not, and the supervisor serves on."""
    client = sv.client
    chld = _hammer(lambda: [sv.pid], [signal.SIGCHLD], 60, pace=0.0002)
    hup = _hammer(lambda: [sv.pid], [signal.SIGHUP], 60, pace=0.02)
    try:
        for i in range(200):
            r = run(client, "true") if i % 2 else sh(client, "exit 3")
            assert r.code == (0 if i % 2 else 3), (i, r)
            assert r.child.exited["reason"] == "exited", r.child.exited
    finally:
        _stop(chld)
        _stop(hup)
    assert client.ping()["pid"] == sv.pid
    stats = client.stats()
    assert stats["failed"] == 0 and stats["children"] == 0 and stats["reaped_orphans"] == 0
    assert sv.proc.poll() is None
    assert "reloaded" in sv.log()
    assert "reload failed" not in sv.log()


def _task_children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@pytest.mark.timeout(60)
def test_sigterm_to_fresh_children_is_not_the_supervisors(sv):
    """SIGTERM/SIGINT/SIGHUP sent to children as soon as they exist (before
    exec, often): they die of it, and the supervisor does not take them for
    its own (no shutdown: it still serves; no reload: none logged)."""
    client = sv.client
    hammers = [_hammer(lambda: _task_children(sv.pid), [sig], 60)
               for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
    outcomes = {"exited": 0, "signalled": 0}
    try:
        for i in range(150):
            try:
                r = run(client, "sh", ["sleep 0.002"])
            except SpawnFailed as e:  # signalled before its error pipe reported exec
                pytest.fail(f"spawn {i}: {e} {e.reply}")
            ex = r.child.exited
            assert ex["reason"] in ("exited", "signalled"), ex
            if ex["signal"] is not None:
                assert ex["signal"] in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP), ex
                outcomes["signalled"] += 1
            else:
                assert ex["code"] == 0, ex
                outcomes["exited"] += 1
    finally:
        for h in hammers:
            _stop(h)
    assert outcomes["signalled"] > 0, outcomes
    assert sv.proc.poll() is None, sv.log()
    assert client.ping()["pid"] == sv.pid
    assert "reload" not in sv.log()
    assert client.stats()["children"] == 0


@pytest.mark.timeout(30)
def test_killpg_right_after_spawn(shared_sv):
    """TERM to the child's process group as soon as `spawned` arrives."""
    for _ in range(50):
        child, pipes = spawn_bg(shared_sv.client, "sh", ["trap '' HUP; exec sleep 30"])
        try:
            os.killpg(child.pgid, signal.SIGTERM)
            assert child.wait(5) == -signal.SIGTERM
            assert child.exited["reason"] == "signalled"
        finally:
            child.close()
            pipes.close()
    assert shared_sv.proc.poll() is None
    assert shared_sv.client.ping()


@pytest.mark.timeout(20)
def test_children_lead_their_own_session(shared_sv):
    r = sh(shared_sv.client, "cat /proc/$$/stat")
    fields = r.text[r.text.rindex(")") + 2:].split()
    pid = r.child.pid
    assert int(fields[2]) == pid and int(fields[3]) == pid  # pgrp, session
    assert int(fields[1]) == shared_sv.pid
    assert stat_fields(shared_sv.pid)[3] != str(pid)


@pytest.mark.timeout(20)
def test_signal_dispositions_reset(shared_sv):
    """Python ignores SIGPIPE and SIGXFSZ; the supervisor catches CHLD, TERM,
    INT, HUP: none of that reaches the child, and its mask is empty."""
    r = sh(shared_sv.client, "exec cat /proc/self/status")
    status = proc_status(r.text)
    assert int(status["SigBlk"], 16) == 0, status
    assert int(status["SigCgt"], 16) == 0, status
    assert int(status["SigIgn"], 16) == 0, status
