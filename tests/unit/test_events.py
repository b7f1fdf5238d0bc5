"""The supervisor's events, one builder each (supervisor/protocol.py): their
wire bytes, keys in order, as they were when written by hand (docs/protocol.md)."""
from __future__ import annotations

import pytest

from supervisor import protocol
from supervisor.errors import Code

CASES = [
    (protocol.error(Code.TIMEOUT, "no request within 5 s"),
     b'{"v":1,"event":"error","code":"timeout","error":"no request within 5 s"}'),
    (protocol.error(Code.BAD_OP, "unknown operation None", op=None),
     b'{"v":1,"event":"error","code":"bad_op","error":"unknown operation None","op":null}'),
    (protocol.error(Code.SPAWN_FAILED, "m: exec: ENOENT", op="spawn", stage="exec", errno=2),
     b'{"v":1,"event":"error","code":"spawn_failed","stage":"exec","errno":2,"error":"m: exec: ENOENT","op":"spawn"}'),
    (protocol.spawned(7, "m", {"abi": 7}, {"mode": "off"}, {"warm": False, "why": "w"}),
     b'{"v":1,"event":"spawned","pid":7,"pgid":7,"manifest":"m","report":{"abi":7},"denials":{"mode":"off"},'
     b'"warm":false,"why":"w"}'),
    (protocol.exited(7, "exited", {"code": 1, "signal": None}, {"shown": 0, "final": True}, ["x"]),
     b'{"v":1,"event":"exited","pid":7,"reason":"exited","code":1,"signal":null,"denials":{"shown":0,"final":true},'
     b'"dac":["x"]}'),
    (protocol.exited(7, "signalled", {"code": None, "signal": 9}, None, []),
     b'{"v":1,"event":"exited","pid":7,"reason":"signalled","code":null,"signal":9}'),
    (protocol.settled(7, {"shown": 1}, "audit is off"),
     b'{"v":1,"event":"settled","pid":7,"denials":{"shown":1},"why":"audit is off"}'),
    (protocol.settled(7, {"shown": 1}),
     b'{"v":1,"event":"settled","pid":7,"denials":{"shown":1}}'),
    (protocol.denied(7, "m", ["read_file"], "path", "/etc/x", None, None, "a secret"),
     b'{"v":1,"event":"denied","pid":7,"manifest":"m","rights":["read_file"],"kind":"path","object":"/etc/x",'
     b'"process":null,"allow":null,"why_not":"a secret"}'),
    (protocol.pong(3), b'{"v":1,"event":"pong","pid":3}'),
    (protocol.listed(["m"], []), b'{"v":1,"event":"list","manifests":["m"],"children":[]}'),
    (protocol.stats({"spawned": 1}, children=0, zygote=None),
     b'{"v":1,"event":"stats","spawned":1,"children":0,"zygote":null}'),
    (protocol.described("m", ["A"], False, ["HOME"], 0),
     b'{"v":1,"event":"described","manifest":"m","client_env":["A"],"client_args":false,"uses":["HOME"],"warm":0}'),
    (protocol.status(7, None), b'{"v":1,"event":"status","pid":7,"running":true,"exited":null}'),
    (protocol.signalled(15), b'{"v":1,"event":"signalled","signal":15}'),
]


@pytest.mark.parametrize("event, wire", CASES)
def test_each_event_on_the_wire(event: protocol.Event, wire: bytes) -> None:
    assert protocol.encode(event) == wire
