"""Malformed, truncated and hostile messages get error replies, their fds
are closed, and the supervisor keeps serving with its fd count unchanged."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from supervisor.client import Client, RefusedPeer
from svhelpers import connect, recv, run, send, send_raw, sh, wait_until


def _settled_fds(shared_sv, expected):
    """Back to the baseline once idle: the same fds, open on the same things."""
    return shared_sv.idle_fds() == expected


@pytest.fixture
def baseline(shared_sv):
    """The supervisor's fds, idle, once it has built its rulesets."""
    assert sh(shared_sv.client, "true").code == 0 and run(shared_sv.client, "true").code == 0
    return shared_sv.idle_fds()


def _null3():
    return [os.open(os.devnull, os.O_RDWR) for _ in range(3)]


def _close(fds):
    for fd in fds:
        os.close(fd)


SPAWN = {"op": "spawn", "manifest": "sh", "args": ["echo should not run"]}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("data,nfds,code", [
    (b"hello", 0, "bad_request"),
    (b"\xff\xfe", 0, "bad_request"),
    (b"[1, 2]", 0, "bad_request"),
    (b'"spawn"', 0, "bad_request"),
    (b"null", 0, "bad_request"),
    (b"[" * 100000, 0, "too_large"),
    (b"[" * 60000, 0, "bad_request"),                      # deep nesting, within the size limit
    (json.dumps({"v": 2, "op": "ping"}).encode(), 0, "bad_version"),
    (json.dumps({"op": "ping"}).encode(), 0, "bad_version"),
    (json.dumps({"v": "1", "op": "ping"}).encode(), 0, "bad_version"),
    (json.dumps({"v": 1, "op": "frobnicate"}).encode(), 0, "bad_op"),
    (json.dumps({"v": 1, "op": ["spawn"]}).encode(), 0, "bad_op"),
    (json.dumps({"v": 1}).encode(), 0, "bad_op"),
    (json.dumps({"v": 1, "op": "ping"}).encode(), 1, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN}).encode(), 0, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN}).encode(), 2, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN}).encode(), 4, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN}).encode(), 5, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN}).encode(), 40, "bad_fds"),
    (json.dumps({"v": 1, **SPAWN, "pad": "x" * (70 * 1024)}).encode(), 3, "too_large"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": ["sh"]}).encode(), 3, "no_such_manifest"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "args": "echo"}).encode(), 3, "bad_request"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "args": [1]}).encode(), 3, "bad_request"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "args": ["a\u0000b"]}).encode(), 3, "bad_request"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "args": ["x"] * 1000}).encode(), 3, "too_large"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "env": ["A"]}).encode(), 3, "bad_request"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "env": {"A": 1}}).encode(), 3, "bad_request"),
    (json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "env": {"A": "\u0000"}}).encode(), 3,
     "bad_request"),
    (json.dumps({"v": 1, "op": "signal", "signal": 15}).encode(), 0, "no_child"),
    (json.dumps({"v": 1, "op": "status"}).encode(), 0, "no_child"),
    (json.dumps({"v": 1, "op": "connect"}).encode(), 1, "bad_op"),    # control channel only
    (json.dumps({"v": 1, "op": "connect"}).encode(), 0, "bad_op"),
])
def test_malformed_message(shared_sv, baseline, data, nfds, code):
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(nfds)]
    try:
        with connect(str(shared_sv.socket_path)) as s:
            send_raw(s, data, fds)
            reply = recv(s)
            assert reply is not None and reply["event"] == "error", reply
            assert reply["code"] == code, reply
            assert reply["error"]
            # The connection still serves.
            send(s, {"op": "ping"})
            assert recv(s)["event"] == "pong"
    finally:
        _close(fds)
    assert shared_sv.client.ping()["pid"] == shared_sv.pid
    assert _settled_fds(shared_sv, baseline), (baseline, shared_sv.fds())
    assert shared_sv.client.stats()["children"] == 0


@pytest.mark.timeout(30)
def test_stdio_fds_must_be_usable(shared_sv, baseline, module_lab):
    d = os.open(module_lab.dir, os.O_RDONLY | os.O_DIRECTORY)
    p = os.open("/etc/passwd", os.O_PATH)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fds in ([d, null, null], [null, p, null], [null, null, d], [p, p, p]):
            with connect(str(shared_sv.socket_path)) as s:
                send(s, SPAWN, fds)
                reply = recv(s)
                assert reply["event"] == "error" and reply["code"] == "bad_fds", reply
                assert "directory or O_PATH" in reply["error"]
    finally:
        _close([d, p, null])
    assert _settled_fds(shared_sv, baseline)
    assert shared_sv.client.stats()["children"] == 0


@pytest.mark.timeout(30)
def test_many_bad_messages_then_normal_service(shared_sv, baseline):
    """One connection sends a little of everything; the supervisor answers
    each and stays within its fds."""
    with connect(str(shared_sv.socket_path)) as s:
        for i in range(200):
            fds = [os.open(os.devnull, os.O_RDWR) for _ in range(i % 7)]
            try:
                send_raw(s, b"{" if i % 2 else json.dumps({"v": 1, "op": "spawn", "manifest": "sh",
                                                           "args": "not a list"}).encode(), fds)
            finally:
                _close(fds)
            reply = recv(s)
            assert reply["event"] == "error", reply
    assert _settled_fds(shared_sv, baseline)
    assert sh(shared_sv.client, "echo ok").text == "ok\n"


@pytest.mark.timeout(20)
def test_empty_datagram_reads_as_end_of_stream(shared_sv, baseline):
    with connect(str(shared_sv.socket_path)) as s:
        send_raw(s, b"")
        assert recv(s) is None   # the supervisor closed this connection
    null = os.open(os.devnull, os.O_RDWR)
    try:
        with connect(str(shared_sv.socket_path)) as s:
            send_raw(s, b"", [null])
            reply = recv(s)
            assert reply["code"] == "bad_request", reply
    finally:
        os.close(null)
    assert _settled_fds(shared_sv, baseline)
    assert shared_sv.client.ping()


@pytest.mark.timeout(20)
def test_one_spawn_per_connection(shared_sv, baseline):
    fds = _null3()
    try:
        with connect(str(shared_sv.socket_path)) as s:
            send(s, {"op": "spawn", "manifest": "sh", "args": ["exec sleep 100"]}, fds)
            first = recv(s)
            assert first["event"] == "spawned", first
            send(s, {"op": "spawn", "manifest": "sh", "args": ["echo twice"]}, fds)
            reply = recv(s)
            assert reply["event"] == "error" and reply["code"] == "already_spawned", reply
            send(s, {"op": "signal", "signal": "SIGKILL", "group": False})
            assert recv(s)["event"] == "signalled"
            exited = recv(s)
            assert exited["event"] == "exited" and exited["signal"] == 9, exited
            assert exited["reason"] == "signalled_on_request"
            send(s, {"op": "signal", "signal": 15})
            assert recv(s)["code"] == "exited"
            send(s, {"op": "signal", "signal": 12345})
            assert recv(s)["code"] == "bad_signal"
            send(s, {"op": "signal", "signal": "SIGNOPE"})
            assert recv(s)["code"] == "bad_signal"
    finally:
        _close(fds)
    assert _settled_fds(shared_sv, baseline)


@pytest.mark.timeout(20)
def test_unknown_signal_on_a_live_child(shared_sv):
    fds = _null3()
    try:
        with connect(str(shared_sv.socket_path)) as s:
            send(s, {"op": "spawn", "manifest": "sh", "args": ["exec sleep 100"]}, fds)
            assert recv(s)["event"] == "spawned"
            for bad in (12345, "SIGNOPE", 1.5, None, [9], True):
                send(s, {"op": "signal", "signal": bad})
                reply = recv(s)
                assert reply["event"] == "error" and reply["code"] == "bad_signal", (bad, reply)
            send(s, {"op": "status"})
            assert recv(s)["running"] is True
    finally:
        _close(fds)


@pytest.mark.timeout(20)
def test_silent_connection_times_out(lab):
    lab.stock()
    svr = lab.start()
    with connect(str(svr.socket_path)) as s:
        started = time.monotonic()
        s.settimeout(10)
        reply = recv(s)
        assert reply["code"] == "timeout", reply
        assert recv(s) is None
        assert 4 <= time.monotonic() - started < 8
    assert svr.client.ping()


@pytest.mark.timeout(20)
def test_uid_not_allowed_is_refused(lab):
    """With --allow-group the socket is open to others by mode; a uid that is
    neither the supervisor's nor allowed is still refused, by SO_PEERCRED."""
    lab.stock()
    svr = lab.start(extra=["--allow-group", "54321"])
    assert oct(os.stat(svr.socket_path).st_mode & 0o777) == "0o666"
    assert oct(os.stat(svr.socket_path.parent).st_mode & 0o777) == "0o711"
    before = svr.idle_fds()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            try:
                Client(str(svr.socket_path)).ping()
                os.write(w, b"answered")
            except RefusedPeer as e:
                os.write(w, f"refused_peer:{e}".encode())
            except BaseException as e:  # noqa: BLE001
                os.write(w, f"{type(e).__name__}:{e}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert got.startswith("refused_peer:") and "65534" in got, got
    assert svr.client.stats()["refused"] == 1
    assert svr.idle_fds() == before   # its socket and pidfd closed


@pytest.mark.timeout(20)
def test_allowed_group_is_served(lab):
    lab.stock()
    svr = lab.start(extra=["--allow-group", "54321"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([54321])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            try:
                os.write(w, json.dumps(Client(str(svr.socket_path)).ping()).encode())
            except BaseException as e:  # noqa: BLE001
                os.write(w, f"{type(e).__name__}:{e}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    assert json.loads(got)["event"] == "pong", got


@pytest.mark.timeout(20)
def test_socket_modes(shared_sv):
    assert oct(os.stat(shared_sv.socket_path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(shared_sv.socket_path.parent).st_mode & 0o777) == "0o700"


@pytest.mark.timeout(30)
def test_a_client_that_never_reads(shared_sv, baseline):
    """A client that floods requests and never reads the replies cannot
    wedge the loop: once its replies no longer fit, it is dropped (and its
    child ended)."""
    fds = _null3()
    try:
        s = connect(str(shared_sv.socket_path))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        send(s, {"op": "spawn", "manifest": "sh", "args": ["exec sleep 100"]}, fds)
        dropped = False
        for _ in range(3000):
            try:
                send(s, {"op": "status"})
            except OSError:
                dropped = True
                break
        assert dropped
        # Others are served meanwhile.
        for _ in range(3):
            assert run(shared_sv.client, "true").code == 0
        s.close()
    finally:
        _close(fds)
    assert wait_until(lambda: shared_sv.client.stats()["children"] == 0, 5)
    assert shared_sv.idle_fds() == baseline
