"""Every wire error code with its meaning, and the one exception family of server and clients.

Imports nothing but enum: clients load it (docs/protocol.md's table is
checked against Code; its stage list against supervisor.zygote.child.STAGES,
derived from the sequences the child walks: FRESH, POOLED, POOLED_SHARED_GID).
"""
from __future__ import annotations

from enum import Enum

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class Code(str, Enum):
    """An error reply's `code`: a str, so it goes on the wire and compares as one."""

    meaning: str

    def __new__(cls, value: str, meaning: str) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    def __str__(self) -> str:
        return self.value

    BAD_REQUEST = "bad_request", "not JSON, not an object, too deep, a field of the wrong type, an unknown spawn field"
    BAD_VERSION = "bad_version", "`v` is not the protocol's version"
    BAD_OP = "bad_op", "unknown operation"
    BAD_FDS = "bad_fds", "wrong number or kind of fds"
    BAD_SIGNAL = "bad_signal", "`signal` names no signal"
    TOO_LARGE = "too_large", "message over 64 KiB, or too many/too long args"
    NO_SUCH_MANIFEST = "no_such_manifest", "the name is not served: unknown (the message lists the names and the nearest one), or its file does not load now (the message names file and key)"
    ARGS_REFUSED = "args_refused", "the manifest does not let clients add arguments"
    ENV_REFUSED = "env_refused", "the manifest does not take that variable from clients"
    BAD_SPEC = "bad_spec", "a narrowing that would widen, or a path that cannot be used"
    CONFINEMENT_UNAVAILABLE = "confinement_unavailable", "the kernel lacks Landlock or a required feature"
    SPAWN_FAILED = "spawn_failed", "the child could not confine itself or exec, or its sandbox could not be built"
    FORK_FAILED = "fork_failed", "fork() failed (EAGAIN, ENOMEM), or the zygote is gone"
    TOO_MANY_CHILDREN = "too_many_children", "the total or per-uid child limit, or no session gid free"
    TOO_MANY_CONNECTIONS = "too_many_connections", "a connection limit, or what is kept for the owner"
    ALREADY_SPAWNED = "already_spawned", "a second spawn on one connection"
    NO_CHILD = "no_child", "signal/status before a spawn"
    EXITED = "exited", "signal after the child exited"
    REFUSED_PEER = "refused_peer", "the peer may not use this supervisor"
    TIMEOUT = "timeout", "no request within the deadline"
    SHUTTING_DOWN = "shutting_down", "the supervisor is stopping"
    INTERNAL = "internal", "a bug in the supervisor; it goes on serving"


# The asker's own mistake (a usage error for `landlock-supervisor run`), not the supervisor's state.
USAGE_CODES = frozenset({Code.BAD_REQUEST, Code.BAD_VERSION, Code.BAD_OP, Code.BAD_FDS, Code.BAD_SIGNAL,
                         Code.BAD_SPEC, Code.ARGS_REFUSED, Code.ENV_REFUSED})

class SupervisorError(Exception):
    """The one base of the supervisor's errors, server and clients alike
    (protocol.ProtocolError, Refused, the client's NoSuchManifest...):
    `code` says why in a word; `reply` is the `error` event a client got
    (empty elsewhere)."""

    def __init__(self, message: str, code: Code = Code.BAD_REQUEST, reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reply = dict(reply or {})


class Refused(SupervisorError):
    """A request the supervisor will not serve: answered with an `error` of `code`."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message, code)
