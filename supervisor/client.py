"""The client library: what a proxy uses to start confined servers.

    with Client().spawn("filesystem", stdin=r, stdout=w, stderr=2) as child:
        ...
        status = child.wait()

One connection per child: closing it (or the proxy dying) ends the child
unless its manifest says `on_disconnect: keep`.
"""
from __future__ import annotations

import functools
import select
import signal as signals
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import landlock

from . import protocol, reap


class SupervisorError(Exception):
    """The supervisor said no; `code` says why in a word (see docs/protocol.md)."""

    def __init__(self, message: str, code: str = "error", reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reply = dict(reply or {})


class NoSuchManifest(SupervisorError): pass
class RefusedPeer(SupervisorError): pass
class ConfinementUnavailable(SupervisorError): pass


class SpawnFailed(SupervisorError):
    """The child could not confine itself or exec; errno and stage say where."""

    @property
    def errno(self) -> int:
        return int(self.reply.get("errno", 0))

    @property
    def stage(self) -> str:
        return str(self.reply.get("stage", ""))


_ERRORS = {"no_such_manifest": NoSuchManifest, "refused_peer": RefusedPeer,
           "confinement_unavailable": ConfinementUnavailable, "spawn_failed": SpawnFailed}


def error_from(reply: Mapping[str, Any]) -> SupervisorError:
    code = str(reply.get("code", "error"))
    return _ERRORS.get(code, SupervisorError)(str(reply.get("error", "unknown error")), code, reply)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _receive(sock: socket.socket, deadline: float | None) -> dict[str, Any]:
    reset = False
    while True:
        ready, _, _ = select.select([sock], [], [], _remaining(deadline))
        if not ready:
            raise TimeoutError("no answer from the supervisor in time")
        try:
            message, fds = protocol.recv(sock)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            # Closed with our request unread: the error comes once, then
            # what the supervisor sent before closing (a refusal) is read.
            if reset:
                raise
            reset = True
            continue
        protocol.close_all(fds)
        if message is None:
            raise ConnectionError("the supervisor closed the connection")
        return message


def _send_first(sock: socket.socket, request: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """A connection's first request. A refused peer finds the connection
    closed under it (EPIPE) with the refusal waiting to be read: raise that."""
    try:
        protocol.send(sock, request, list(fds))
    except (BrokenPipeError, ConnectionResetError):
        try:
            reply = _receive(sock, time.monotonic() + 1)
        except (OSError, TimeoutError, protocol.ProtocolError):
            raise ConnectionError("the supervisor closed the connection") from None
        raise error_from(reply) from None


def spawn_request(name: str, args: Sequence[str], env: Mapping[str, str] | None,
                  narrow: Mapping[str, Any] | None) -> dict[str, Any]:
    request: dict[str, Any] = {"op": "spawn", "manifest": name, "args": list(args)}
    if env:
        request["env"] = dict(env)
    if narrow:
        request["narrow"] = dict(narrow)
    return request


class ChildState:
    """What the supervisor told about a child: shared by the sync and asyncio clients."""

    def __init__(self, sock: socket.socket, spawned: Mapping[str, Any]) -> None:
        self._sock = sock
        self.pid: int = spawned["pid"]
        self.pgid: int = spawned["pgid"]
        self.manifest: str = spawned.get("manifest", "")
        self._report: Mapping[str, Any] = spawned["report"]
        self.exited: dict[str, Any] | None = None   # the `exited` event, once known

    @functools.cached_property
    def report(self) -> landlock.Report:
        """What the kernel enforces on the child (built when first asked for:
        a proxy spawning in a loop may never look)."""
        return landlock.Report.from_dict(self._report)

    @property
    def returncode(self) -> int | None:
        """As subprocess has it: the exit code, or -N for signal N."""
        if self.exited is None:
            return None
        return self.exited["code"] if self.exited["code"] is not None else -self.exited["signal"]

    def _handle(self, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("event") == "exited":
            self.exited = message
        return message

    def fileno(self) -> int:
        """Readable when the supervisor has news (e.g. the exit): for selectors."""
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


class Child(ChildState):
    """A confined child of the supervisor, held by its connection."""

    def _request(self, request: dict[str, Any], expect: str, timeout: float | None = 10) -> dict[str, Any]:
        protocol.send(self._sock, request)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            reply = self._handle(_receive(self._sock, deadline))
            if reply.get("event") == expect:
                return reply
            if reply.get("event") == "error":
                raise error_from(reply)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exited is None:
            self._handle(_receive(self._sock, deadline))
        return self.returncode

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
        if self.exited is not None:
            return
        if not wait:
            protocol.send(self._sock, {"op": "signal", "signal": int(sig), "group": group})
            return
        try:
            self._request({"op": "signal", "signal": int(sig), "group": group}, "signalled")
        except SupervisorError as e:
            if e.code != "exited":
                raise

    def terminate(self) -> None:
        self.signal(signals.SIGTERM)

    def kill(self) -> None:
        self.signal(signals.SIGKILL)

    def status(self) -> dict[str, Any]:
        return self._request({"op": "status"}, "status")

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.exited is None:
                self.kill()
                self.wait(10)
        except (OSError, SupervisorError, TimeoutError):
            pass
        self.close()


class Client:
    """Talks to a running supervisor (its socket), or to a private one (see start())."""

    def __init__(self, socket_path: str | None = None, *,
                 connect: Callable[[], socket.socket] | None = None) -> None:
        if connect is None:
            from .paths import default_socket_path
            path = socket_path or default_socket_path()
            connect = lambda: _connect_path(path)  # noqa: E731
            self.socket_path: str | None = path
        else:
            self.socket_path = None
        self._connect = connect

    def spawn(self, name: str, args: Sequence[str] = (), *, stdin: int = 0, stdout: int = 1,
              stderr: int = 2, env: Mapping[str, str] | None = None,
              narrow: Mapping[str, Any] | None = None, timeout: float | None = 30) -> Child:
        sock = self._connect()
        try:
            _send_first(sock, spawn_request(name, args, env, narrow), [stdin, stdout, stderr])
            reply = _receive(sock, None if timeout is None else time.monotonic() + timeout)
            if reply.get("event") != "spawned":
                raise error_from(reply)
        except BaseException:
            sock.close()
            raise
        return Child(sock, reply)

    def _short(self, op: str, timeout: float = 10, **fields: Any) -> dict[str, Any]:
        sock = self._connect()
        try:
            _send_first(sock, {"op": op, **fields})
            reply = _receive(sock, time.monotonic() + timeout)
        finally:
            sock.close()
        if reply.get("event") == "error":
            raise error_from(reply)
        return reply

    def ping(self) -> dict[str, Any]:
        return self._short("ping")

    def list(self) -> dict[str, Any]:
        return self._short("list")

    def stats(self) -> dict[str, Any]:
        return self._short("stats")

    def describe(self, name: str) -> dict[str, Any]:
        """What a client may give manifest `name`: its client_env names, client_args."""
        return self._short("describe", manifest=name)


def _connect_path(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ConnectionError(f"cannot reach the supervisor at {path}: {e.strerror}") from None
    return sock


def exit_status(child: Child) -> int:
    """The status a shell gives the child: its code, or 128 + its signal."""
    return reap.shell_status(child.exited) if child.exited else 0
