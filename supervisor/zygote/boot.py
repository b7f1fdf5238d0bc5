"""Spawning the zygote, apart from waiting for it: light to import.

A private supervisor spawns its zygote before it imports the server's
modules and loads its manifest (cli._serve, early.prepare first): the fresh
interpreter's ~13 ms of start-up then run on the other core meanwhile, and
ZygoteProcess.start reads its Ready later. A daemon does both at once.
"""
from __future__ import annotations

import os
import socket

from ..client import interpreter

REQUESTS_FD, EVENTS_FD = 3, 4   # messages.REQUESTS_FD, EVENTS_FD (not imported here: checked in process)
ENTRY = "from supervisor.zygote import main; main.main()"
IMPORTS = ("supervisor", "landlock", "prctl", "_prctl")


class Booting:
    """A zygote spawned, its Ready not read yet. (Not a NamedTuple: typing
    is ~2.5 ms of a supervisor's start-up, and nothing else needs it.)"""
    __slots__ = ("pid", "requests", "events")

    def __init__(self, pid: int, requests: socket.socket, events: socket.socket) -> None:
        self.pid, self.requests, self.events = pid, requests, events

    def abandon(self) -> None:
        """Never used: EOF on its channels ends it; reaped here."""
        self.requests.close()
        self.events.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def launch() -> Booting:
    """Spawn the zygote with its two channels on fds 3 and 4 (zygote.messages)."""
    kind = socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC
    requests, their_requests = socket.socketpair(*kind)
    events, their_events = socket.socketpair(*kind)
    try:
        # A fresh interpreter, not a fork of ours: small, and nothing of
        # the supervisor's in it. Its own session: a terminal's ^C is the
        # supervisor's to handle. No environment: children get theirs.
        argv = interpreter.argv(ENTRY, IMPORTS)
        pid = os.posix_spawn(argv[0], argv, {},
                             file_actions=[(os.POSIX_SPAWN_DUP2, their_requests.fileno(), REQUESTS_FD),
                                           (os.POSIX_SPAWN_DUP2, their_events.fileno(), EVENTS_FD)],
                             setsid=True, setsigmask=())
    except OSError:
        requests.close()
        events.close()
        raise
    finally:
        their_requests.close()
        their_events.close()
    return Booting(pid, requests, events)
