"""Spawning a private supervisor apart from connecting to it: os, socket and sys only.

`run --manifests` spawns it as soon as its arguments are parsed, before it
imports the client (private.connect): the new interpreter's start-up (its
imports, PyYAML, the manifest: most of private mode's cost) then runs beside
the rest of `run`'s own on the other core.
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

CONTROL_FD = 3


class Booting:
    """A private supervisor spawned, not known to answer yet. (Not a
    NamedTuple: typing alone takes longer to import than this module.)"""

    def __init__(self, pid: int, control: socket.socket) -> None:
        self.pid, self.control = pid, control


def _inheritable_fds() -> list[int]:
    """This process's fds above 2 that an exec would pass on (not fd 3: the
    control socket is put there)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != CONTROL_FD and os.get_inheritable(fd):
                out.append(fd)
        except OSError:
            pass  # the listing's own fd, closed by now
    return out


def launch(manifests: Sequence[str] | str, *, state_root: str | None = None, only: str | None = None,
           python: str = sys.executable, extra_args: Sequence[str] = ()) -> Booting:
    """Spawn a private supervisor for these manifests (only: the one of that
    name, the others read for their name alone)."""
    paths = [manifests] if isinstance(manifests, (str, os.PathLike)) else list(manifests)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = [python, "-m", "supervisor", "serve", "--control-fd", str(CONTROL_FD)]
    for p in paths:
        argv += ["--manifests", os.fspath(p)]
    if state_root:
        argv += ["--state-root", state_root]
    if only:
        argv += ["--only", only]
    argv += list(extra_args)
    # Its stdin and stdout are the proxy's protocol channel: keep off them.
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        # posix_spawn closes no fd: the proxy's inheritable ones (a pipe to
        # another child, say) would stay open in the server for its life.
        pid = os.posix_spawn(python, argv, dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
            (os.POSIX_SPAWN_DUP2, theirs.fileno(), CONTROL_FD),
            *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds())])
    except OSError:
        ours.close()
        raise
    finally:
        os.close(devnull)
        theirs.close()
    return Booting(pid, ours)
