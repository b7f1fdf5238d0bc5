"""Spawning, seen from the supervisor: what to launch, and the zygote that forks it.

Everything is computed here, in the supervisor (argv, environment, the
Confinement with its ruleset fd); the zygote (zygote.py) forks, and the
child makes its system calls in a fixed order and leaves by exec or
os._exit. A failure travels back over a close-on-exec pipe as
"stage:errno:message"; EOF on that pipe means exec succeeded.
"""
from __future__ import annotations

import array
import marshal
import os
import socket
import sys
from dataclasses import dataclass

import _prctl
import prctl

import landlock

from . import zygote

_BOOT = "import sys; sys.path[:0] = sys.argv[1:]; from supervisor import zygote; zygote.main()"
_REPLY_TIMEOUT = 10.0


@dataclass
class Launch:
    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    confinement: landlock.Confinement

    def message(self, pooled: bool = False) -> tuple:
        """The zygote's form; a pool's template leaves argv and env to each request."""
        return (self.program, None if pooled else self.argv, None if pooled else self.env,
                self.cwd, self.umask, tuple(self.confinement.entry))


class SpawnError(Exception):
    def __init__(self, stage: str, errno_: int, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage, self.errno = stage, errno_


def read_error(data: bytes) -> SpawnError:
    stage, _, rest = data.decode(errors="replace").partition(":")
    number, _, message = rest.partition(":")
    return SpawnError(stage, int(number) if number.isdigit() else 0, message)


class Zygote:
    """The supervisor's handle on its zygote: one request at a time, each
    answered before the next (a fork takes well under a millisecond), so a
    child's pid is known before its SIGCHLD can be handled."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.channel: socket.socket | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # -S: no site, so no site-packages; where each import lives, instead.
        paths = list(dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in (
            os.path.dirname(__file__), os.path.dirname(landlock.__file__), prctl.__file__, _prctl.__file__)))
        try:
            # A fresh interpreter, not a fork of ours: small, and nothing of
            # the supervisor's in it. Its own session: a terminal's ^C is the
            # supervisor's to handle. No environment: children get theirs.
            self.pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _BOOT, *paths], {},
                                      file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), zygote.CHANNEL_FD)],
                                      setsid=True, setsigmask=())
        finally:
            theirs.close()
        self.channel = ours
        ours.settimeout(_REPLY_TIMEOUT)
        reply, _ = self._receive()
        if reply[0] != "ready":
            raise OSError(0, f"the zygote said {reply!r} at start")

    def spawn(self, launch: Launch, stdio: list[int], pool: str | None) -> tuple[int, int]:
        """Fork a child for launch (taken from `pool` if it has one ready);
        returns (pid, read end of its error pipe). Raises OSError when the
        fork fails (EAGAIN, ENOMEM) or the zygote is gone twice."""
        fds = stdio + ([launch.confinement.ruleset.fd] if launch.confinement.ruleset.fd >= 0 else [])
        reply, received = self._request(("spawn", pool, launch.message()), fds)
        if reply[0] == "forked" and len(received) == 1:
            return reply[1], received[0]
        for fd in received:
            os.close(fd)
        if reply[0] == "fork_failed":
            raise OSError(reply[1], reply[2])
        raise OSError(0, f"the zygote said {reply!r}")

    def pool(self, name: str, size: int, launch: Launch) -> list[int]:
        """Keep `size` children of this launch ready (0: none); returns the
        pids of the children of its previous pool, which exit unused."""
        fd = launch.confinement.ruleset.fd
        reply, _ = self._request(("pool", name, size, launch.message(pooled=True)), [fd] if fd >= 0 else [])
        return reply[1]

    def drain(self) -> list[int]:
        """Every pool emptied (a reload); returns the pids that exit unused."""
        if self.channel is None:
            return []
        reply, _ = self._request(("drain",), [])
        return reply[1]

    def _request(self, message: tuple, fds: list[int]) -> tuple[tuple, list[int]]:
        for attempt in (1, 2):
            try:
                if self.channel is None:
                    self.start()
                self.channel.sendmsg([marshal.dumps(message)],
                                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
                return self._receive()
            except (OSError, EOFError) as e:
                self.lost()
                if attempt == 2:
                    raise OSError(getattr(e, "errno", 0) or 0, f"the zygote is gone: {e}") from None
        raise AssertionError("unreachable")

    def _receive(self) -> tuple[tuple, list[int]]:
        data, ancillary, flags, _ = self.channel.recvmsg(4096, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        fds = [fd for level, kind, payload in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in array.array("i", payload[:len(payload) - len(payload) % 4])]
        if not data:
            raise EOFError("EOF from the zygote")
        return marshal.loads(data), fds

    def lost(self) -> None:
        """The zygote died (or the channel broke): the next request starts another."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        """At EOF the zygote exits, and its pooled children at theirs."""
        self.lost()

