"""The client library: what a proxy uses to start confined servers.

    with Client().spawn("filesystem", stdin=r, stdout=w, stderr=2) as child:
        ...
        status = child.wait()

One connection per child: closing it (or the proxy dying) ends the child
unless its manifest says `on_disconnect: keep`. The exchanges themselves are
in client/exchange; this module waits for them with select() and deadlines.
"""
from __future__ import annotations

import _socket
import select
import signal as signals
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from . import exchange as core
from .. import protocol
from .exchange import (ConfinementUnavailable, NoSuchManifest, RefusedPeer, SpawnFailed, SupervisorError,
                       error_from, shell_status)
from .paths import SocketPathError, check_fallback, check_length, default_socket_paths

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Child", "Client", "ConfinementUnavailable", "NoSuchManifest", "RefusedPeer", "SpawnFailed",
           "SupervisorError", "connect_first", "connect_path", "error_from", "shell_status"]

_REPLY_TIMEOUT = 10   # seconds: ping, list, stats, describe, signal, status, leaving a `with`


def _run(exchange: core.Exchange[core.T], timeout: float | None, wakeup: int | None = None) -> core.T:
    """Drive an exchange to its end, waiting in select() for at most
    `timeout` seconds; a byte on `wakeup` (left unread) ends it as the
    timeout does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    run = core.Run(exchange)
    others = [] if wakeup is None else [wakeup]
    for wait in run:
        until = deadline if wait.within is None else time.monotonic() + wait.within
        try:
            remaining = None if until is None else max(0.0, until - time.monotonic())
            sock = wait.sock.fileno()
            if sock not in select.select([sock, *others], [], [], remaining)[0]:
                run.thrown = TimeoutError(core.NO_ANSWER)
        except BaseException as e:  # ^C included: the exchange cleans up
            run.thrown = e
    return run.result


class Child(core.ChildState):
    """A confined child of the supervisor, held by its connection."""

    def wait(self, timeout: float | None = None) -> int:
        return _run(self._exit(), timeout)

    def settle(self, timeout: float = core.SETTLE_BOUND, wakeup: int | None = None) -> dict[str, Any] | None:
        """After the exit: its denials in all, the kernel's count included
        once `settled` came (waited for up to timeout seconds, or until a
        byte on `wakeup`, a signal's self-pipe say; what was known by then,
        if it did not come or the connection closed)."""
        try:
            return _run(self._settle(), timeout, wakeup)
        except (TimeoutError, ConnectionError, SupervisorError):   # (a malformed reply: what it knew)
            return self.denial_counts

    def poll(self) -> int | None:
        if self.exited is None:
            try:
                self.wait(0)
            except TimeoutError:
                pass
        return self.returncode

    def signal(self, sig: int = signals.SIGTERM, group: bool = True, wait: bool = True) -> None:
        """Signal the child's process group (or the child alone). wait=False
        only sends the request: safe from a signal handler."""
        if wait:
            _run(self._signal(sig, group), _REPLY_TIMEOUT)
        elif self.exited is None:
            protocol.send(self._sock, core.signal_request(sig, group))

    def terminate(self) -> None:
        self.signal(signals.SIGTERM)

    def kill(self) -> None:
        self.signal(signals.SIGKILL)

    def status(self) -> dict[str, Any]:
        return _run(self._request({"op": "status"}, "status"), _REPLY_TIMEOUT)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        _run(self._leave(), _REPLY_TIMEOUT)


class Client:
    """Talks to a running supervisor (its socket), or to a private one (see start())."""

    def __init__(self, socket_path: str | None = None, *,
                 connect: Callable[[], _socket.socket] | None = None) -> None:
        self.socket_path: str | None = None
        if connect is None:
            self.socket_path = socket_path
            paths = [socket_path] if socket_path else default_socket_paths()
            connect = lambda: connect_first(paths)  # noqa: E731
        self._connect = connect

    def spawn(self, name: str, args: Sequence[str] = (), *, stdin: int = 0, stdout: int = 1,
              stderr: int = 2, env: Mapping[str, str] | None = None,
              narrow: Mapping[str, Any] | None = None, timeout: float | None = 30,
              cwd: str | None = None, stdio: str | None = None) -> Child:
        """cwd: the supervisor makes `.`, `./...` and `../...` among args absolute against it.
        stdio="pipes": the child comes with pipes (child.stdin, .stdout, .stderr),
        stdin, stdout and stderr unused; a warm server may serve it (child.warm)."""
        request = core.spawn_request(name, args, env, narrow, cwd, stdio)
        sock = self._connect()
        return Child(sock, *_run(core.spawn(sock, request, [] if stdio else [stdin, stdout, stderr]), timeout))

    def _short(self, op: str, **fields: Any) -> dict[str, Any]:
        return _run(core.short(self._connect(), op, **fields), _REPLY_TIMEOUT)

    def ping(self) -> dict[str, Any]:
        return self._short("ping")

    def list(self) -> dict[str, Any]:
        return self._short("list")

    def stats(self) -> dict[str, Any]:
        return self._short("stats")

    def describe(self, name: str) -> dict[str, Any]:
        """What a client may give manifest `name`: its client_env names, client_args."""
        return self._short("describe", manifest=name)

    def denials(self) -> dict[str, Any]:
        """The recent denials this uid may see (the supervisor's owner: all), the mode, what was lost."""
        return self._short("denials")

    def follow_denials(self) -> Iterator[dict[str, Any]]:
        """The `denials` reply, then each `denied` event as it comes, until the supervisor goes."""
        sock = self._connect()
        try:
            _run(core.send_first(sock, {"op": "denials", "follow": True}), _REPLY_TIMEOUT)
            while True:
                try:
                    message = _run(core.receive(sock), None)
                except ConnectionError:
                    return
                if message.get("event") == "error":
                    raise error_from(message)
                yield message
        finally:
            sock.close()


def connect_path(path: str) -> _socket.socket:
    """A connection to the supervisor's socket at `path`."""
    return connect_first([path])


def connect_first(paths: Sequence[str]) -> _socket.socket:
    """A connection to the first of these sockets that answers (a socket
    path too long, or in a fallback directory not this user's own: an error
    of its own, SocketPathError)."""
    failures = []
    for path in paths:
        check_length(path)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
        try:
            check_fallback(path, create=False)
            sock.connect(path)
        except SocketPathError:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            failures.append(f"{path}: {e.strerror}")
        else:
            return sock
    raise ConnectionError("cannot reach the supervisor at " + "; nor at ".join(failures))
