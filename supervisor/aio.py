"""The client library for asyncio proxies: the same calls, awaitable.

    client = AsyncClient()
    child = await client.spawn("filesystem", stdin=r, stdout=w, stderr=2)
    status = await child.wait()
"""
from __future__ import annotations

import asyncio
import signal as signals
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import protocol
from .client import ChildState, SupervisorError, _connect_path, error_from, spawn_request


async def _receive(sock: socket.socket) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    reset = False
    while True:
        try:
            message, fds = protocol.recv(sock)
        except ConnectionResetError:
            # See client._receive: the refusal is read after the reset.
            if reset:
                raise
            reset = True
            continue
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            continue
        protocol.close_all(fds)
        if message is None:
            raise ConnectionError("the supervisor closed the connection")
        return message


async def _send_first(sock: socket.socket, request: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """A connection's first request; a refused peer's refusal is raised."""
    try:
        protocol.send(sock, request, list(fds))
    except (BrokenPipeError, ConnectionResetError):
        try:
            reply = await asyncio.wait_for(_receive(sock), 1)
        except (OSError, asyncio.TimeoutError, protocol.ProtocolError):
            raise ConnectionError("the supervisor closed the connection") from None
        raise error_from(reply) from None


class AsyncChild(ChildState):
    def __init__(self, sock: socket.socket, spawned: Mapping[str, Any]) -> None:
        super().__init__(sock, spawned)
        self._lock = asyncio.Lock()   # one reader of the connection at a time

    async def _next(self) -> dict[str, Any]:
        return self._handle(await _receive(self._sock))

    async def wait(self) -> int:
        async with self._lock:
            while self.exited is None:
                await self._next()
        return self.returncode

    async def signal(self, sig: int = signals.SIGTERM, group: bool = True) -> None:
        if self.exited is not None:
            return
        async with self._lock:
            protocol.send(self._sock, {"op": "signal", "signal": int(sig), "group": group})
            while True:
                reply = await self._next()
                if reply.get("event") == "signalled":
                    return
                if reply.get("event") == "error":
                    if reply.get("code") == "exited":
                        return
                    raise error_from(reply)

    async def terminate(self) -> None:
        await self.signal(signals.SIGTERM)

    async def kill(self) -> None:
        await self.signal(signals.SIGKILL)

    async def __aenter__(self) -> "AsyncChild":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.exited is None:
                await self.kill()
                await asyncio.wait_for(self.wait(), 10)
        except (OSError, SupervisorError, asyncio.TimeoutError):
            pass
        self.close()


class AsyncClient:
    def __init__(self, socket_path: str | None = None, *,
                 connect: Callable[[], socket.socket] | None = None) -> None:
        if connect is None:
            from .paths import default_socket_path
            path = socket_path or default_socket_path()
            connect = lambda: _connect_path(path)  # noqa: E731
        self._connect = connect

    @classmethod
    def private(cls, client: Any) -> "AsyncClient":
        """Share a private supervisor started with supervisor.start()."""
        return cls(connect=client._connect)

    async def spawn(self, name: str, args: Sequence[str] = (), *, stdin: int = 0, stdout: int = 1,
                    stderr: int = 2, env: Mapping[str, str] | None = None,
                    narrow: Mapping[str, Any] | None = None) -> AsyncChild:
        sock = self._connect()
        sock.setblocking(False)
        try:
            await _send_first(sock, spawn_request(name, args, env, narrow), [stdin, stdout, stderr])
            reply = await _receive(sock)
            if reply.get("event") != "spawned":
                raise error_from(reply)
        except BaseException:
            sock.close()
            raise
        return AsyncChild(sock, reply)

    async def _short(self, op: str, **fields: Any) -> dict[str, Any]:
        sock = self._connect()
        sock.setblocking(False)
        try:
            await _send_first(sock, {"op": op, **fields})
            reply = await _receive(sock)
        finally:
            sock.close()
        if reply.get("event") == "error":
            raise error_from(reply)
        return reply

    async def ping(self) -> dict[str, Any]:
        return await self._short("ping")

    async def list(self) -> dict[str, Any]:
        return await self._short("list")

    async def stats(self) -> dict[str, Any]:
        return await self._short("stats")

    async def describe(self, name: str) -> dict[str, Any]:
        return await self._short("describe", manifest=name)
