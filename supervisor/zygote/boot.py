"""Spawning the zygote, apart from waiting for it: os, socket and sys only.

A private supervisor spawns its zygote before it imports the server's
modules and loads its manifest (cli._serve, early.prepare first): the fresh
interpreter's ~13 ms of start-up then run on the other core meanwhile, and
ZygoteProcess.start reads its Ready later. A daemon does both at once.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import sys
from typing import NamedTuple

REQUESTS_FD, EVENTS_FD = 3, 4   # messages.REQUESTS_FD, EVENTS_FD (not imported here: checked in process)
_BOOT = "import sys; sys.path[:0] = sys.argv[1:]; from supervisor.zygote import main; main.main()"


class Booting(NamedTuple):
    """A zygote spawned, its Ready not read yet."""
    pid: int
    requests: socket.socket
    events: socket.socket

    def abandon(self) -> None:
        """Never used: EOF on its channels ends it; reaped here."""
        self.requests.close()
        self.events.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _origin(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    return spec.origin


def import_paths() -> list[str]:
    """The zygote runs with -S: no site, so no site-packages; where each of
    its imports lives, instead (found without importing them here)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the supervisor package
    return list(dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in (
        here, os.path.dirname(_origin("landlock")), _origin("prctl"), _origin("_prctl"))))


def launch() -> Booting:
    """Spawn the zygote with its two channels on fds 3 and 4 (zygote.messages)."""
    kind = socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC
    requests, their_requests = socket.socketpair(*kind)
    events, their_events = socket.socketpair(*kind)
    try:
        # A fresh interpreter, not a fork of ours: small, and nothing of
        # the supervisor's in it. Its own session: a terminal's ^C is the
        # supervisor's to handle. No environment: children get theirs.
        pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _BOOT, *import_paths()], {},
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
