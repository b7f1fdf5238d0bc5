#!/usr/bin/env python3
"""A small stdio MCP proxy in front of confined servers.

    python examples/proxy.py --socket /run/user/1000/landlock-supervisor/socket \\
        --server filesystem --server time
    python examples/proxy.py --manifests examples --server filesystem --server time

An MCP client runs this as its one server. It starts each named server
through the supervisor (its daemon socket, or with --manifests a private
supervisor of its own), holds one pipe pair per server, and speaks
newline-delimited JSON-RPC on its own stdio:

  initialize   initializes every server, then answers itself
  tools/list   every server's tools, renamed NAME__TOOL
  tools/call   NAME__TOOL goes to server NAME as TOOL, its answer comes back
  ping         answered here
  other        error -32601 (method not found); notifications are dropped

Its stdin closing ends the servers (their stdin closes) and then the proxy.
Stdlib and this project's client library only.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor.client.aio import AsyncChild, AsyncClient  # noqa: E402
from supervisor.client import SupervisorError  # noqa: E402

SEPARATOR = "__"
LINE_LIMIT = 64 * 1024 * 1024      # a tool result may carry a whole file, base64


async def pipe_streams(read_fd: int, write_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio streams over a pair of pipe (or tty) fds."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
    # A StreamWriter needs a protocol with flow control: StreamReaderProtocol has it.
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(write_fd, "wb", 0))
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "error"))
        self.error = error


class Backend:
    """One confined server: requests out, replies matched back by id."""

    def __init__(self, name: str, child: AsyncChild, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.name, self.child, self.reader, self.writer = name, child, reader, writer
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.task = asyncio.create_task(self.read_loop())

    @classmethod
    async def start(cls, client: AsyncClient, name: str) -> "Backend":
        to_child, ours_w = os.pipe2(os.O_CLOEXEC)
        ours_r, from_child = os.pipe2(os.O_CLOEXEC)
        try:
            child = await client.spawn(name, stdin=to_child, stdout=from_child, stderr=2)
        except BaseException:
            os.close(ours_w)
            os.close(ours_r)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        return cls(name, child, *await pipe_streams(ours_r, ours_w))

    async def read_loop(self) -> None:
        try:
            while line := await self.reader.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                if "method" in message:          # the server asks something of us
                    if "id" in message:
                        await send(self.writer, {"jsonrpc": "2.0", "id": message["id"], "error": {
                            "code": -32601, "message": f"the proxy does not serve {message['method']}"}})
                    continue
                future = self.pending.pop(message.get("id"), None)
                if future and not future.done():
                    if "error" in message:
                        future.set_exception(RpcError(message["error"]))
                    else:
                        future.set_result(message.get("result"))
        except (ValueError, OSError) as e:       # a line over LINE_LIMIT, a broken pipe
            print(f"proxy: server {self.name}: {e}", file=sys.stderr)
        finally:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(RpcError({"code": -32603, "message": f"server {self.name} has exited"}))
            self.pending.clear()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        if self.task.done():
            raise RpcError({"code": -32603, "message": f"server {self.name} has exited"})
        rid = next(self.ids)
        self.pending[rid] = asyncio.get_running_loop().create_future()
        await send(self.writer, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        return await self.pending[rid]

    async def tools(self) -> list[dict[str, Any]]:
        tools, cursor = [], None
        while True:
            result = await self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools += result.get("tools", [])
            if not (cursor := result.get("nextCursor")):
                return tools

    async def close(self) -> None:
        """EOF on the server's stdin (an MCP server's cue to leave), then KILL if it lingers."""
        self.writer.close()
        try:
            await asyncio.wait_for(self.child.wait(), 5)
        except asyncio.TimeoutError:
            await self.child.kill()
        self.child.close()


class Proxy:
    def __init__(self, backends: list[Backend], writer: asyncio.StreamWriter) -> None:
        self.backends = {b.name: b for b in backends}
        self.writer = writer

    def route(self, tool: str) -> tuple[Backend, str]:
        for name in sorted(self.backends, key=len, reverse=True):   # longest prefix wins
            if tool.startswith(name + SEPARATOR):
                return self.backends[name], tool[len(name) + len(SEPARATOR):]
        raise RpcError({"code": -32602, "message": f"unknown tool {tool!r} (tools are SERVER{SEPARATOR}TOOL)"})

    async def answer(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            # The client's version and identity; no client capabilities: the
            # proxy relays no request from a server (roots, sampling) back.
            results = await asyncio.gather(*(b.request("initialize", dict(params, capabilities={}))
                                             for b in self.backends.values()))
            for b in self.backends.values():
                await send(b.writer, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            versions = {r.get("protocolVersion") for r in results}
            return {"protocolVersion": versions.pop() if len(versions) == 1 else params.get("protocolVersion"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "landlock-supervisor-proxy", "version": "0.1.0"}}
        if method == "ping":
            return {}
        if method == "tools/list":
            listed = await asyncio.gather(*(b.tools() for b in self.backends.values()))
            return {"tools": [dict(tool, name=f"{b.name}{SEPARATOR}{tool['name']}")
                              for b, tools in zip(self.backends.values(), listed) for tool in tools]}
        if method == "tools/call":
            backend, tool = self.route(str(params.get("name", "")))
            return await backend.request("tools/call", dict(params, name=tool))
        raise RpcError({"code": -32601, "message": f"method not found: {method}"})

    async def handle(self, message: dict[str, Any]) -> None:
        if "id" not in message or "method" not in message:
            return                          # a notification, or a stray reply: nothing to answer
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            reply["result"] = await self.answer(str(message.get("method")), message.get("params") or {})
        except RpcError as e:
            reply["error"] = e.error
        except OSError as e:                # its stdin is gone: the server has exited
            reply["error"] = {"code": -32603, "message": f"server unreachable: {e}"}
        await send(self.writer, reply)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        tasks = set()
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                await send(self.writer, {"jsonrpc": "2.0", "id": None,
                                         "error": {"code": -32700, "message": "parse error"}})
                continue
            if isinstance(message, dict):   # each request on its own: a slow tool holds up no other
                tasks.add(task := asyncio.create_task(self.handle(message)))
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)


async def main(args: argparse.Namespace) -> int:
    private, backends = None, []
    try:
        if args.manifests:
            from supervisor.client.private import start
            private = start(args.manifests, state_root=args.state_root)
            client = AsyncClient.private(private)
        else:
            client = AsyncClient(args.socket)
        for name in args.server:
            backends.append(await Backend.start(client, name))
    except (SupervisorError, OSError, RuntimeError) as e:
        print(f"proxy: {e}", file=sys.stderr)
        await asyncio.gather(*(b.close() for b in backends), return_exceptions=True)
        if private is not None:
            private.close()
        return 1
    try:
        stdin, stdout = await pipe_streams(os.dup(0), os.dup(1))
        serving = asyncio.create_task(Proxy(backends, stdout).serve(stdin))
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, serving.cancel)
        try:
            await serving
        except asyncio.CancelledError:
            pass
        return 0
    finally:
        await asyncio.gather(*(b.close() for b in backends), return_exceptions=True)
        if private is not None:
            private.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--socket", help="a running supervisor's socket (default: its usual place)")
    where.add_argument("--manifests", action="append", help="start a private supervisor with these")
    parser.add_argument("--state-root", help="the private supervisor's state root")
    parser.add_argument("--server", action="append", required=True, metavar="NAME",
                        help="a manifest name to start (repeatable)")
    sys.exit(asyncio.run(main(parser.parse_args())))
