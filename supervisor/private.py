"""Private mode: a proxy's own fork-server, joined to it by a socketpair alone.

No socket file exists, so no confined child can even name it. The server is
a fresh interpreter (exec, not a fork of the proxy: the proxy may be large
and have threads), and exits when the proxy's end of the channel closes.
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

from . import protocol
from .client import Client

_CONTROL_FD = 3


class PrivateStartFailed(RuntimeError):
    """The private supervisor exited at start (it said why on stderr)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class PrivateClient(Client):
    """A Client whose every connection is a new socketpair handed over the control channel."""

    def __init__(self, control: socket.socket, pid: int) -> None:
        super().__init__(connect=self._pair)
        self._control = control
        self.server_pid = pid

    def _pair(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            protocol.send(self._control, {"op": "connect"}, [theirs.fileno()])
        except OSError as e:
            ours.close()
            raise ConnectionError(f"the private supervisor is gone: {e.strerror}") from None
        finally:
            theirs.close()
        return ours

    def close(self, timeout: float = 10) -> int | None:
        """End the supervisor (and with it every child) and reap it."""
        self._control.close()
        try:
            _, status = os.waitpid(self.server_pid, 0)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status)

    def __enter__(self) -> "PrivateClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _inheritable_fds() -> list[int]:
    """This process's fds above 2 that an exec would pass on (not fd 3: the
    control socket is put there)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != _CONTROL_FD and os.get_inheritable(fd):
                out.append(fd)
        except OSError:
            pass  # the listing's own fd, closed by now
    return out


def start(manifests: Sequence[str] | str, *, state_root: str | None = None, only: str | None = None,
          python: str = sys.executable, extra_args: Sequence[str] = ()) -> PrivateClient:
    """Start a private supervisor for these manifests (only: the one of that
    name, the others read for their name alone); call early in main()."""
    paths = [manifests] if isinstance(manifests, (str, os.PathLike)) else list(manifests)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = [python, "-m", "supervisor", "serve", "--control-fd", str(_CONTROL_FD)]
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
            (os.POSIX_SPAWN_DUP2, theirs.fileno(), _CONTROL_FD),
            *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds())])
    finally:
        os.close(devnull)
        theirs.close()
    client = PrivateClient(ours, pid)
    try:
        client.ping()
    except (OSError, TimeoutError) as e:
        status = client.close()
        raise PrivateStartFailed(f"the private supervisor did not start ({e}): see above", status) from None
    return client
