"""The wire protocol: one JSON object per SOCK_SEQPACKET datagram, fds by SCM_RIGHTS.

See docs/protocol.md. Every received fd is close-on-exec from the moment it
arrives (MSG_CMSG_CLOEXEC), and a message that was truncated, or that
brought other fds than expected, is rejected with all its fds closed.
"""
from __future__ import annotations

import _socket
import array
import json
import os
from collections.abc import Sequence

from .errors import Code, SupervisorError

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_MESSAGE = 64 * 1024
MAX_FDS = 3
MAX_DEPTH = 32  # nesting of a message's JSON
# Room for one fd more than allowed, so that an extra one is seen and refused
# rather than silently cut (MSG_CTRUNC); alignment may add room for another.
_CMSG_SPACE = _socket.CMSG_SPACE((MAX_FDS + 1) * array.array("i").itemsize)


class ProtocolError(SupervisorError):
    """A message that breaks the protocol; `code` is machine-readable."""

    def __init__(self, message: str, code: Code = Code.BAD_REQUEST) -> None:
        super().__init__(message, code)


# ---- the supervisor's events (docs/protocol.md), one builder each ------------
# The keys go on the wire in the order written here.

Event = dict[str, "Any"]
_UNASKED: Any = object()   # an `error` that answers no request (a refused peer, a timeout) names no `op`


def error(code: Code, text: str, *, op: Any = _UNASKED, stage: str | None = None,
          errno: int | None = None) -> Event:
    """`error`: op echoes the request's (even a missing one, as null); a
    spawn that failed in the child names its `stage` and `errno`."""
    event: Event = {"event": "error", "code": code}
    if stage is not None:
        event["stage"], event["errno"] = stage, errno
    event["error"] = text
    if op is not _UNASKED:
        event["op"] = op
    return event


def spawned(pid: int, manifest: str, report: dict[str, Any], denials: dict[str, Any],
            warm: dict[str, Any] | None) -> Event:
    """`spawned`: the child leads its own process group; `warm` says whether a warm server served it."""
    return {"event": "spawned", "pid": pid, "pgid": pid, "manifest": manifest, "report": report,
            "denials": denials, **(warm or {})}


def exited(pid: int, reason: str, status: dict[str, Any], denials: dict[str, Any] | None = None,
           dac: list[str] | None = None) -> Event:
    """`exited`: status is reap.describe's; denials the tally so far (with `final`); dac what file permissions stopped."""
    event: Event = {"event": "exited", "pid": pid, "reason": reason, **status}
    if denials is not None:
        event["denials"] = denials
    if dac:
        event["dac"] = dac
    return event


def settled(pid: int, denials: dict[str, Any], why: str | None = None) -> Event:
    """`settled`: the session's denials in all; `why` when the kernel's count never came."""
    event: Event = {"event": "settled", "pid": pid, "denials": denials}
    if why is not None:
        event["why"] = why
    return event


def denied(pid: int, manifest: str, rights: list[str], kind: str, obj: str, process: dict[str, Any] | None,
           allow: str | None, why_not: str | None) -> Event:
    """`denied`: one distinct denial of a session, with the line that would allow it (or why none)."""
    event: Event = {"event": "denied", "pid": pid, "manifest": manifest, "rights": rights, "kind": kind,
                    "object": obj, "process": process, "allow": allow}
    if why_not is not None:
        event["why_not"] = why_not
    return event


def pong(pid: int) -> Event:
    return {"event": "pong", "pid": pid}


def listed(manifests: list[str], children: list[dict[str, Any]]) -> Event:
    return {"event": "list", "manifests": manifests, "children": children}


def stats(counters: dict[str, int], **now: Any) -> Event:
    """`stats`: the counters since the start, then what is so now (children, zygote, pools...)."""
    return {"event": "stats", **counters, **now}


def described(manifest: str, client_env: list[str], client_args: bool, uses: list[str], warm: int) -> Event:
    return {"event": "described", "manifest": manifest, "client_env": client_env, "client_args": client_args,
            "uses": uses, "warm": warm}


def status(pid: int, exited: dict[str, Any] | None) -> Event:
    return {"event": "status", "pid": pid, "running": exited is None, "exited": exited}


def signalled(signal: int) -> Event:
    return {"event": "signalled", "signal": signal}


def relative_arg(arg: str) -> bool:
    """An argument a spawn's `cwd` resolves: `.`, `..`, `./...`, `../...`."""
    return arg in (".", "..") or arg.startswith(("./", "../"))


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps({"v": VERSION, **message}, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}", Code.TOO_LARGE)
    return data


def send(sock: _socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    sock.sendmsg([encode(message)], rights(fds))


def rights(fds: Sequence[int]) -> list[tuple[int, int, array.array[int]]]:
    """sendmsg()'s ancillary data passing fds (none: no ancillary data)."""
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))] if fds else []


def recv(sock: _socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and its fds; (None, []) at end of stream.

    Raises ProtocolError after closing whatever fds came with a bad message.
    """
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, _CMSG_SPACE, _socket.MSG_CMSG_CLOEXEC)
    fds = received_fds(ancdata)
    try:
        if flags & _socket.MSG_CTRUNC:
            raise ProtocolError("too many file descriptors attached", Code.BAD_FDS)
        if flags & _socket.MSG_TRUNC or len(data) > MAX_MESSAGE:
            raise ProtocolError(f"message exceeds {MAX_MESSAGE} bytes", Code.TOO_LARGE)
        if not data:
            if fds:
                raise ProtocolError("empty message", Code.BAD_REQUEST)
            return None, []
        return decode(data), fds
    except ProtocolError:
        close_all(fds)
        raise


def decode(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    # Fewer brackets than levels cannot nest too deep: most messages skip the walk.
    if data.count(b"{") + data.count(b"[") > MAX_DEPTH and not _shallow(message):
        raise ProtocolError(f"nested deeper than {MAX_DEPTH} levels")
    version = message.get("v")
    if type(version) is not int or version != VERSION:  # JSON true is no version
        raise ProtocolError(f"unsupported protocol version {_clip(version)} (this is {VERSION})",
                            Code.BAD_VERSION)
    return message


def _shallow(message: Any) -> bool:
    """No request nests deeply: a deep one would make the repr() of an error
    message, or the JSON of a reply echoing it, recurse past Python's limit."""
    todo = [(message, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)
    return True


def _clip(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def shortened(message: dict[str, Any], limit: int = 1024) -> dict[str, Any]:
    """A reply that fits: long strings (an error quoting a huge request) cut,
    anything else but numbers, booleans and null replaced by a short repr."""
    out: dict[str, Any] = {}
    for key, value in message.items():
        if isinstance(value, str):
            out[key] = value if len(value) <= limit else value[:limit] + "..."
        elif value is None or isinstance(value, (bool, int, float)):
            out[key] = value
        else:
            out[key] = _clip(value, limit)
    return out


def received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[:len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return fds


def close_all(fds: list[int]) -> None:
    """Emptied as well: closed twice, a number could be another fd by then."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if isinstance(fds, list):
        fds.clear()
