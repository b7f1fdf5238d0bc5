"""The client library for asyncio proxies: the same calls, awaitable.

    client = AsyncClient()
    child = await client.spawn("filesystem", stdin=r, stdout=w, stderr=2)
    status = await child.wait()

The exchanges are in client/exchange; this module waits for them in the event
loop (bound them with asyncio.wait_for).
"""
from __future__ import annotations

import asyncio
import signal as signals
import _socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import protocol
from . import exchange as core
from .sync import Client, connect_first
from .paths import default_socket_paths


async def _readable(sock: _socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:   # the reader may fire again before we resume
        if not ready.done():
            ready.set_result(None)
    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _run(exchange: core.Exchange[core.T]) -> core.T:
    """Drive an exchange to its end in the event loop."""
    run = core.Run(exchange)
    for wait in run:
        try:
            await asyncio.wait_for(_readable(wait.sock), wait.within)
        except asyncio.TimeoutError:
            run.thrown = TimeoutError(core.NO_ANSWER)
        except BaseException as e:  # a cancellation included: the exchange cleans up
            run.thrown = e
    return run.result


class AsyncChild(core.ChildState):
    def __init__(self, sock: _socket.socket, spawned: Mapping[str, Any], pipes: Sequence[int] = ()) -> None:
        super().__init__(sock, spawned, pipes)
        self._lock = asyncio.Lock()   # one reader of the connection at a time

    async def wait(self) -> int:
        async with self._lock:
            return await _run(self._exit())

    async def settle(self, timeout: float = core.SETTLE_BOUND) -> dict[str, Any] | None:
        """After the exit: its denials in all (see Child.settle)."""
        try:
            async with self._lock:
                return await asyncio.wait_for(_run(self._settle()), timeout)
        except (asyncio.TimeoutError, TimeoutError, ConnectionError):
            return self.denial_counts

    async def signal(self, sig: int = signals.SIGTERM, group: bool = True) -> None:
        if self._lock.locked():
            # Another task reads the connection (wait(), say, until the exit
            # this signal brings): the request only sent, its reply is that reader's.
            self._send_signal(sig, group)
            return
        async with self._lock:
            await _run(self._signal(sig, group))

    def _send_signal(self, sig: int, group: bool) -> None:
        if self.exited is None:
            protocol.send(self._sock, core.signal_request(sig, group))

    async def terminate(self) -> None:
        await self.signal(signals.SIGTERM)

    async def kill(self) -> None:
        await self.signal(signals.SIGKILL)

    async def __aenter__(self) -> "AsyncChild":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._lock.locked():
            self._send_signal(signals.SIGKILL, True)   # (as signal(): the task reading ends with the exit)
        try:
            await asyncio.wait_for(self._leave_locked(), 10)
        except asyncio.TimeoutError:
            pass

    async def _leave_locked(self) -> None:
        async with self._lock:
            await _run(self._leave())


class AsyncClient:
    def __init__(self, socket_path: str | None = None, *,
                 connect: Callable[[], _socket.socket] | None = None) -> None:
        if connect is None:
            paths = [socket_path] if socket_path else default_socket_paths()
            connect = lambda: connect_first(paths)  # noqa: E731
        self._connect = connect

    @classmethod
    def private(cls, client: Client) -> "AsyncClient":
        """Share a private supervisor started with supervisor.start()."""
        return cls(connect=client._connect)

    def _open(self) -> _socket.socket:
        sock = self._connect()
        sock.setblocking(False)
        return sock

    async def spawn(self, name: str, args: Sequence[str] = (), *, stdin: int = 0, stdout: int = 1,
                    stderr: int = 2, env: Mapping[str, str] | None = None,
                    narrow: Mapping[str, Any] | None = None, cwd: str | None = None,
                    stdio: str | None = None) -> AsyncChild:
        """cwd: the supervisor makes `.`, `./...` and `../...` among args absolute against it.
        stdio="pipes": as Client.spawn."""
        request = core.spawn_request(name, args, env, narrow, cwd, stdio)
        sock = self._open()
        return AsyncChild(sock, *await _run(core.spawn(sock, request, [] if stdio else [stdin, stdout, stderr])))

    async def _short(self, op: str, **fields: Any) -> dict[str, Any]:
        return await _run(core.short(self._open(), op, **fields))

    async def ping(self) -> dict[str, Any]:
        return await self._short("ping")

    async def list(self) -> dict[str, Any]:
        return await self._short("list")

    async def stats(self) -> dict[str, Any]:
        return await self._short("stats")

    async def describe(self, name: str) -> dict[str, Any]:
        return await self._short("describe", manifest=name)
