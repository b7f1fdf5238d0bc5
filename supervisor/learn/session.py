"""The MCP session a learn run drives over the server's stdio: initialize, tools/list, the given calls.

Newline-delimited JSON-RPC 2.0. The server's own requests (ping,
roots/list) get a minimal answer, so the session does not stall on them.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import struct
import termios
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

PROTOCOL_VERSION = "2024-11-05"
CLIENT_INFO = {"name": "landlock-supervisor-learn", "version": "1"}
INITIALIZE = {"method": "initialize", "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                                  "clientInfo": CLIENT_INFO}}
MAX_LINE = 16 << 20


class SessionFileError(ValueError):
    pass


def requests(calls: Sequence[tuple[str, str]], session_lines: Iterable[str] | None,
             source: str = "--session") -> list[dict[str, Any]]:
    """initialize, then tools/list and the --call tools, or the session
    file's requests (JSON lines: {"method": ..., "params": ...}; its own
    initialize replaces ours)."""
    out: list[dict[str, Any]] = [dict(INITIALIZE)]
    if session_lines is None:
        out.append({"method": "tools/list", "params": {}})
    else:
        for number, line in enumerate(session_lines, 1):
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError as e:
                raise SessionFileError(f"{source}:{number}: not JSON: {e}") from None
            if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
                raise SessionFileError(f"{source}:{number}: expected an object with a \"method\"")
            request = {"method": msg["method"], "params": msg.get("params", {})}
            if request["method"] == "initialize" and len(out) == 1:
                out[0] = request
            else:
                out.append(request)
    for tool, arguments in calls:
        try:
            parsed = json.loads(arguments)
        except ValueError as e:
            raise SessionFileError(f"--call {tool}: the arguments are not JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise SessionFileError(f"--call {tool}: the arguments must be a JSON object")
        out.append({"method": "tools/call", "params": {"name": tool, "arguments": parsed}})
    return out


# Why a request failed: its tool said so (`isError`), a JSON-RPC error, no
# reply in time, the server closed its stdout (or the pipe broke).
TOOL_ERROR, RPC_ERROR, TIMEOUT, CLOSED = "tool error", "error", "no reply in time", "no reply"


@dataclass
class Outcome:
    method: str
    ok: bool
    detail: str      # the error (the server's own message), or a short account of the result
    failure: str = ""    # TOOL_ERROR, RPC_ERROR, TIMEOUT, CLOSED; "" when ok
    tool: str = ""       # the tool of a tools/call
    number: int = 0      # its place in the session (initialize is 1): two calls of one tool differ

    @property
    def call(self) -> str:
        """The request as a person names it: `tools/call fetch`."""
        return f"{self.method} {self.tool}" if self.tool else self.method


def drive(stdin: int, stdout: int, plan: Sequence[dict[str, Any]], timeout: float,
          start_timeout: float = 300.0) -> list[Outcome]:
    """Send each request, wait for its reply; stop at the first that gets
    none (a timeout, the server closing its stdout). The timeout runs once
    the server has read the request: until it reads or says anything, the
    server is still starting (a first `npx -y` or `uvx` fetches its
    packages meanwhile), for at most start_timeout from the first send.
    stdin is made non-blocking (ours alone): no write waits past a deadline."""
    os.set_blocking(stdin, False)
    out: list[Outcome] = []
    reader = _Reader(stdout, stdin, timeout, start_timeout)
    for number, request in enumerate(plan, 1):
        message = {"jsonrpc": "2.0", "id": number, **request}
        tool = request.get("params", {}).get("name") if request["method"] == "tools/call" else None
        try:
            reader.send(message)
            reply = reader.reply(number)
        except (OSError, EOFError, TimeoutError) as e:
            out.append(Outcome(request["method"], False, str(e) or type(e).__name__,
                               TIMEOUT if isinstance(e, TimeoutError) else CLOSED, str(tool or ""), number))
            return out
        out.append(replace(outcome(request["method"], str(tool or ""), reply), number=number))
        if request["method"] == "initialize" and "error" not in reply:
            with contextlib.suppress(OSError, TimeoutError):   # (the next request finds what failed)
                reader.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return out


def outcome(method: str, tool: str, reply: dict[str, Any]) -> Outcome:
    """A reply judged: a JSON-RPC error, or a tool's `isError` result, is a
    failure, with the server's own message (the caller escapes it)."""
    if "error" in reply:
        error = reply["error"] if isinstance(reply["error"], dict) else {}
        return Outcome(method, False, f"error {error.get('code')}: {error.get('message')}"[:300], RPC_ERROR, tool)
    result = reply.get("result")
    if not isinstance(result, dict):
        return Outcome(method, True, "", "", tool)
    if method == "tools/call" and result.get("isError"):
        content = result.get("content")   # (the server's: any shape)
        texts = [str(c.get("text", "")) for c in content if isinstance(c, dict)] if isinstance(content, list) else []
        return Outcome(method, False, " ".join(texts)[:300] or "(no message)", TOOL_ERROR, tool)
    if method == "tools/list":
        tools = result.get("tools")
        return Outcome(method, True, f"{len(tools) if isinstance(tools, list) else 0} tools", "", tool)
    return Outcome(method, True, "", "", tool)


def _unread(fd: int) -> int:
    """The bytes in the pipe whose write end is fd that no one has read yet."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


class _Reader:
    """One session's two pipes and its clock."""

    def __init__(self, fd: int, stdin: int, timeout: float, start_timeout: float) -> None:
        self.fd, self.buffer = fd, b""
        self.stdin, self.timeout, self.start_timeout = stdin, timeout, start_timeout
        self.started_by = time.monotonic() + start_timeout
        self.starting = True   # until it reads its stdin or writes to its stdout

    def send(self, message: dict[str, Any], until: float | None = None) -> None:
        """Written whole by `until` (default: the timeout from now, or the
        start's end), or TimeoutError: a server that does not read its stdin
        never holds us. What it writes meanwhile is read (it may wait for
        its stdout to be read before it reads again)."""
        data = memoryview((json.dumps(message, separators=(",", ":")) + "\n").encode())
        if until is None:
            until = time.monotonic() + self.timeout
            if self.starting:
                until = max(until, self.started_by)
        while data:
            try:
                data = data[os.write(self.stdin, data):]
            except BlockingIOError:
                remaining = until - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("its stdin full: not read in time") from None
                # (what it wrote, kept to be parsed after: bounded as a line is)
                readers = [self.fd] if len(self.buffer) <= MAX_LINE else []
                readable, _, _ = select.select(readers, [self.stdin], [], remaining)
                if readable:
                    self._read()

    def reply(self, number: int) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            message, deadline = self._message(deadline)
            if "method" in message and "id" in message:   # the server asks us something
                answers: dict[str, dict[str, Any]] = {"ping": {}, "roots/list": {"roots": []}}
                answer = answers.get(message["method"])
                self.send({"jsonrpc": "2.0", "id": message["id"], **(
                    {"result": answer} if answer is not None else
                    {"error": {"code": -32601, "message": f"method not found: {message['method']}"}})},
                          deadline)   # (within the reply's own time)
            elif message.get("id") == number:
                return message

    def _message(self, deadline: float) -> tuple[dict[str, Any], float]:
        """The next message, and the deadline as it now stands."""
        while True:
            line, newline, rest = self.buffer.partition(b"\n")
            if newline:
                self.buffer = rest
                try:
                    message = json.loads(line)
                except ValueError:
                    continue   # a server printing to stdout: not ours to judge here
                if isinstance(message, dict):
                    return message, deadline
                continue
            if len(self.buffer) > MAX_LINE:
                raise EOFError("a line longer than 16 MiB")
            now = time.monotonic()
            if self.starting:
                if not _unread(self.stdin):
                    # It reads: the timeout runs from here, seen within a second of its read (the
                    # deadline of the last look before it could be all but spent).
                    self.starting = False
                    deadline = max(deadline, now + self.timeout)
                elif now >= self.started_by:
                    raise TimeoutError(f"not started in time: its stdin unread after {self.start_timeout:g} s")
                else:
                    deadline = max(deadline, now + self.timeout)
            if now >= deadline:
                raise TimeoutError("no reply in time")
            # While it may still be starting, looked at each second.
            wait = min(deadline - now, 1.0, self.started_by - now) if self.starting else deadline - now
            if select.select([self.fd], [], [], max(wait, 0.0))[0]:
                self._read()

    def _read(self) -> None:
        chunk = os.read(self.fd, 65536)
        if not chunk:
            raise EOFError("the server closed its stdout")
        self.buffer += chunk
        self.starting = False   # it speaks: started
