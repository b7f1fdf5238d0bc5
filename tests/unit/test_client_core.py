"""The client's exchanges without a supervisor: a socketpair plays its part."""
from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

from supervisor.client import exchange as core
from supervisor.client import aio
from supervisor import protocol
from supervisor.client import _run


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield ours, theirs
    ours.close()
    theirs.close()


def _read(sock: socket.socket) -> dict:
    message, fds = protocol.recv(sock)
    protocol.close_all(fds)
    assert message is not None
    return message


def test_short_exchange_returns_the_reply_and_closes(pair):
    ours, theirs = pair
    protocol.send(theirs, {"event": "pong", "pid": 7})
    assert _run(core.short(ours, "ping"), 5) == {"v": 1, "event": "pong", "pid": 7}
    assert _read(theirs) == {"v": 1, "op": "ping"}
    assert ours.fileno() == -1


@pytest.mark.parametrize("code, kind", [("no_such_manifest", core.NoSuchManifest),
                                        ("refused_peer", core.RefusedPeer),
                                        ("confinement_unavailable", core.ConfinementUnavailable),
                                        ("spawn_failed", core.SpawnFailed),
                                        ("bad_spec", core.SupervisorError)])
def test_an_error_reply_is_its_exception(pair, code, kind):
    ours, theirs = pair
    protocol.send(theirs, {"event": "error", "code": code, "error": "no", "stage": "exec", "errno": 2})
    with pytest.raises(kind) as raised:
        _run(core.spawn(ours, core.spawn_request("x", [], None, None), [0, 1, 2]), 5)
    assert type(raised.value) is kind and raised.value.code == code and str(raised.value) == "no"
    assert ours.fileno() == -1     # a failed spawn closes its connection
    if kind is core.SpawnFailed:
        assert (raised.value.stage, raised.value.errno) == ("exec", 2)


def test_one_error_family() -> None:
    """Every client exception and the wire's ProtocolError are errors.SupervisorError,
    each with its Code; a code the client does not know is INTERNAL, its word kept."""
    from supervisor import client, errors
    assert client.SupervisorError is errors.SupervisorError
    for kind in (core.NoSuchManifest, core.RefusedPeer, core.ConfinementUnavailable, core.SpawnFailed,
                 protocol.ProtocolError, errors.Refused):
        assert issubclass(kind, errors.SupervisorError)
    for code in errors.Code:
        e = core.error_from({"event": "error", "code": code.value, "error": "no"})
        assert e.code is code and isinstance(e, errors.SupervisorError)
    for word in ("from_a_newer_supervisor", None, 3):
        e = core.error_from({"event": "error", "code": word})
        assert e.code is errors.Code.INTERNAL and e.reply.get("code") == word


def test_a_malformed_reply_is_in_the_family_and_not_a_usage_error(pair):
    ours, theirs = pair
    theirs.send(b"garbage")
    with pytest.raises(protocol.ProtocolError) as raised:
        _run(core.short(ours, "ping"), 5)
    assert raised.value.code == "internal" and "malformed reply" in str(raised.value)


def _refuse(ours: socket.socket, theirs: socket.socket) -> None:
    """The supervisor refuses and closes with our first request unread."""
    protocol.send(ours, {"op": "early"})
    protocol.send(theirs, {"event": "error", "code": "refused_peer", "error": "go away"})
    theirs.close()


def test_a_refused_peer_reads_the_refusal_after_a_failed_send(pair):
    _refuse(*pair)
    with pytest.raises(core.RefusedPeer, match="go away"):
        _run(core.short(pair[0], "ping"), 5)


def test_a_reset_read_once_then_the_refusal(pair):
    _refuse(*pair)
    assert _run(core.receive(pair[0]), 5)["code"] == "refused_peer"


def test_a_silent_close_is_a_connection_error(pair):
    ours, theirs = pair
    theirs.close()
    with pytest.raises(ConnectionError, match="closed"):
        _run(core.short(ours, "ping"), 5)


def test_no_answer_in_time(pair):
    ours, _ = pair
    with pytest.raises(TimeoutError):
        _run(core.short(ours, "ping"), 0.05)
    assert ours.fileno() == -1


def test_requests_are_the_protocols_bytes():
    assert protocol.encode(core.spawn_request("fs", ("a",), {"T": "1"}, {"read_only": ["/x"]})) == json.dumps(
        {"v": 1, "op": "spawn", "manifest": "fs", "args": ["a"], "env": {"T": "1"},
         "narrow": {"read_only": ["/x"]}}, separators=(",", ":")).encode()
    assert core.spawn_request("fs", [], None, {}) == {"op": "spawn", "manifest": "fs", "args": []}
    assert core.spawn_request("fs", [], None, {}, None) == {"op": "spawn", "manifest": "fs", "args": []}
    assert protocol.encode(core.spawn_request("fs", (".",), None, None, "/home/u/p")) == \
        b'{"v":1,"op":"spawn","manifest":"fs","args":["."],"cwd":"/home/u/p"}'
    assert core.signal_request(15, True) == {"op": "signal", "signal": 15, "group": True}


def test_child_state_follows_the_events(pair):
    ours, theirs = pair
    child = core.ChildState(ours, {"pid": 5, "pgid": 5, "report": {"abi": 3, "enforced": True}})
    assert child.returncode is None and child.report.abi == 3 and child.report.enforced
    protocol.send(theirs, {"event": "exited", "pid": 5, "code": None, "signal": 9})
    assert _run(child._exit(), 5) == -9
    assert core.shell_status(child.exited) == 137
    assert _run(child._signal(15, True), 5) is None      # exited: nothing sent
    _run(child._leave(), 5)
    assert ours.fileno() == -1


def test_signal_after_exit_is_no_error(pair):
    ours, theirs = pair
    child = core.ChildState(ours, {"pid": 5, "pgid": 5, "report": {}})
    protocol.send(theirs, {"event": "error", "code": "exited", "error": "it has exited"})
    _run(child._signal(15, False), 5)
    assert _read(theirs) == {"v": 1, "op": "signal", "signal": 15, "group": False}


def test_shell_status():
    assert core.shell_status({"code": 3, "signal": None}) == 3
    assert core.shell_status({"code": None, "signal": 15}) == 143


def test_the_event_loop_drives_the_same_exchanges(pair):
    ours, theirs = pair
    ours.setblocking(False)
    protocol.send(theirs, {"event": "pong", "pid": 7})
    assert asyncio.run(aio._run(core.short(ours, "ping")))["pid"] == 7


def test_a_cancelled_spawn_closes_its_connection(pair):
    ours, _ = pair
    ours.setblocking(False)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aio._run(core.spawn(ours, {"op": "spawn"}, [0, 1, 2])), 0.05)
    asyncio.run(main())
    assert ours.fileno() == -1


_COUNTS = {"received": 1, "shown": 1, "suppressed": 0, "hidden": 0}


def test_settled_follows_exited_with_the_final_counts_past_unknown_events(pair):
    ours, theirs = pair
    child = core.ChildState(ours, {"pid": 5, "pgid": 5, "report": {}, "denials": {"mode": "detail"}})
    protocol.send(theirs, {"event": "exited", "pid": 5, "code": 0, "signal": None,
                           "denials": {**_COUNTS, "kernel": None, "final": False}})
    assert _run(child._exit(), 5) == 0
    assert child.settling and child.denial_counts["kernel"] is None
    protocol.send(theirs, {"event": "denied", "pid": 5, "object": "/etc/hostname"})   # came after `exited`
    protocol.send(theirs, {"event": "news_of_a_later_version", "pid": 5})             # ignored
    protocol.send(theirs, {"event": "settled", "pid": 5, "denials": {**_COUNTS, "received": 2, "kernel": 2}})
    assert _run(child._settle(), 5) == {**_COUNTS, "received": 2, "kernel": 2}
    assert not child.settling and [e["object"] for e in child.denied] == ["/etc/hostname"]


@pytest.mark.parametrize("denials", [None, {**_COUNTS, "kernel": 1, "final": True}, {**_COUNTS, "kernel": 1}],
                         ids=["not seen", "final", "older supervisor"])
def test_no_settled_to_wait_for(pair, denials):
    ours, theirs = pair
    child = core.ChildState(ours, {"pid": 5, "pgid": 5, "report": {}})
    protocol.send(theirs, {"event": "exited", "pid": 5, "code": 0, "signal": None,
                           **({"denials": denials} if denials else {})})
    assert _run(child._settle(), 0.5) == (dict(denials) if denials else None)   # nothing more read
    assert not child.settling


def test_the_asyncio_client_settles_too(pair):
    ours, theirs = pair
    ours.setblocking(False)

    async def main() -> dict | None:
        child = aio.AsyncChild(ours, {"pid": 5, "pgid": 5, "report": {}})
        protocol.send(theirs, {"event": "exited", "pid": 5, "code": 0, "signal": None,
                               "denials": {**_COUNTS, "kernel": None, "final": False}})
        protocol.send(theirs, {"event": "settled", "pid": 5, "denials": {**_COUNTS, "kernel": 1}})
        return await child.settle()
    assert asyncio.run(main()) == {**_COUNTS, "kernel": 1}


def test_a_settled_that_never_comes_leaves_what_was_known(pair):
    from supervisor.client import Child
    ours, theirs = pair
    child = Child(ours, {"pid": 5, "pgid": 5, "report": {}})
    protocol.send(theirs, {"event": "exited", "pid": 5, "code": 0, "signal": None,
                           "denials": {**_COUNTS, "kernel": None, "final": False}})
    assert child.settle(0.1) == {**_COUNTS, "kernel": None, "final": False}
    theirs.close()
    assert child.settle(1) == {**_COUNTS, "kernel": None, "final": False}   # closed: no error


def test_a_byte_on_the_wakeup_fd_ends_the_wait_for_settled(pair):
    """`run` waits for the kernel's count with its signals' self-pipe: a
    signal ends the wait at once, the byte left for its reader."""
    import time
    from supervisor.client import Child
    ours, theirs = pair
    child = Child(ours, {"pid": 5, "pgid": 5, "report": {}})
    protocol.send(theirs, {"event": "exited", "pid": 5, "code": 0, "signal": None,
                           "denials": {**_COUNTS, "kernel": None, "final": False}})
    r, w = os.pipe()
    try:
        os.write(w, b"\x0f")
        started = time.monotonic()
        assert child.settle(30, wakeup=r) == {**_COUNTS, "kernel": None, "final": False}
        assert time.monotonic() - started < 10 and child.exited is not None
        assert os.read(r, 1) == b"\x0f"
    finally:
        os.close(r)
        os.close(w)
