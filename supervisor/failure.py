"""A command's failure: one line on stderr, what and where, beside its exit status; and a
warning's line."""
from __future__ import annotations

import sys

TYPE_CHECKING = False   # (typing's own, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    import argparse


def fail(code: int, message: str) -> int:
    print(f"landlock-supervisor: {message}", file=sys.stderr)
    return code


def warn(message: str) -> None:
    """One line on stderr that the command goes on after (a deprecated spelling)."""
    print(f"landlock-supervisor: warning: {message}", file=sys.stderr, flush=True)


def supervisor_of(args: argparse.Namespace) -> str:
    """Which supervisor a client command talked to, for its one line."""
    if getattr(args, "manifests", None):
        return "the private supervisor"
    from .client.paths import default_socket_path
    return f"the supervisor at {args.socket or default_socket_path()}"


def talking(args: argparse.Namespace, e: Exception) -> int:
    """The one line for a client command that failed talking to its
    supervisor: a socket path that cannot be used is usage; a reply that is
    no supervisor's names who sent it ("a malformed reply: what")."""
    from landlock.exits import EXIT_USAGE

    from .client.paths import SocketPathError
    from .protocol import ProtocolError
    if isinstance(e, SocketPathError):
        return fail(EXIT_USAGE, str(e))
    if isinstance(e, ProtocolError):   # (a peer that is no supervisor, or one of another version)
        return fail(1, f"{supervisor_of(args)} sent {e}")
    return fail(1, str(e))
