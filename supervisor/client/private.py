"""Private mode: a proxy's own fork-server, joined to it by a socketpair alone.

No socket file exists, so no confined child can even name it. The server
start() gives a proxy is a fresh `python -I -S` (not a fork of the proxy,
which may be large and have threads); `run --manifests`, threadless at the
top of its main, forks its own (private_boot). Either exits when the
proxy's end of the channel closes.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from .. import protocol
from .sync import Client
from .private_boot import Booting, launch


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


def connect(booting: Booting) -> PrivateClient:
    """The client of a private supervisor spawned by private_boot.launch,
    once it answers."""
    client = PrivateClient(booting.control, booting.pid)
    try:
        client.ping()
    except (OSError, TimeoutError) as e:
        status = client.close()
        raise PrivateStartFailed(f"the private supervisor did not start ({e}): see above", status) from None
    return client


def start(manifests: Sequence[str] | str, *, state_root: str | None = None, only: str | None = None,
          extra_args: Sequence[str] = ()) -> PrivateClient:
    """Start a private supervisor for these manifests (only: the one of that
    name, the others read for their name alone); call early in main()."""
    return connect(launch(manifests, state_root=state_root, only=only, extra_args=extra_args))
