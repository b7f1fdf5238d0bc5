"""The two records the parts share: a client's Connection and the Session of the child it spawned.

A leaf of data: `connections` keeps the one, `children` the other, each
pointing at its partner, and neither module needs the other for it.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from . import peers

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .denials import Tally
    from .loop import Timer
    from ..manifests.manifest import Manifest
    from ..zygote.process import Launch

    Retry = tuple[Launch, list[int]]


@dataclass
class Connection:
    """One client connection: its socket, its peer, the session it spawned."""
    sock: socket.socket
    peer: peers.Peer
    control: bool = False          # private mode's control channel
    session: Session | None = None
    deadline: float | None = None   # monotonic time it is closed by unless it asks for something


@dataclass
class Session:
    """A spawned child, from its request to its reaping: its client, error pipe, exit, session gid, denials."""
    pid: int
    manifest: Manifest
    conn: Connection | None
    report: dict[str, Any]
    uid: int
    errpipe: int = -1               # open until exec (EOF) or a failure report
    spawned: bool = False           # the `spawned` reply went out
    exited: dict[str, Any] | None = None
    kill_reason: str | None = None
    record: str | None = None       # the file in sessions/ that outlives a crash
    kill_timer: Timer | None = None
    first_term: float | None = None  # monotonic time of the first TERM a client asked for: the grace runs from it
    gid: int | None = None          # its session gid (Config.session_gids)
    leftovers: bool = False         # processes of its session outlived it: its gid stays taken until the KILL
    retry: Retry | None = None      # a pooled child's request and the client's stdio, kept until it
                                    # execs: a fresh child's if it was tampered with
    tally: Tally | None = None      # its denials, when they are read (supervisor/daemon/audit.py)
    held: bool = False              # a warm server nobody's yet (supervisor/daemon/warm.py): `spawned` waits for its client
    pipes: list[int] | None = None  # the client's ends of its stdio pipes (`stdio: "pipes"`), sent with `spawned`
    warm: dict[str, Any] | None = None   # in `spawned`: whether a warm server served it, and if not why

    def update(self, pipes: list[int] | None, warm: dict[str, Any] | None) -> "Session":
        self.pipes, self.warm = pipes, warm
        return self
