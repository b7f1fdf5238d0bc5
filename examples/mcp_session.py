"""A tiny synchronous MCP client over stdio (newline-delimited JSON-RPC 2.0).

Stdlib only. Used by the tests and the demo to talk to a real MCP server
whose stdin/stdout we hold as file descriptors (a subprocess' pipes, or the
fds the supervisor hands back).

    proc = start_unconfined(["node", ".../dist/index.js", "/tmp"], env, cwd)
    with McpSession(proc.stdin, proc.stdout) as s:
        s.initialize()
        tools = s.list_tools()
        result = s.call_tool("read_file", {"path": "/tmp/x"})
    proc.terminate()

Every request has a timeout (select() on the read fd); on expiry a
TimeoutError naming the method is raised. A server that closes its stdout
raises EOFError. Server-initiated requests (ping, roots/list, ...) are
answered minimally so the session does not stall; notifications and log
messages are kept in ``notifications``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "McpError",
    "McpSession",
    "PROTOCOL_VERSION",
    "minimal_env",
    "start_unconfined",
    "stop",
    "tool_text",
]

# Accepted by every server tested (the TypeScript SDK servers also accept
# later revisions and answer with the version they picked).
PROTOCOL_VERSION = "2024-11-05"

CLIENT_INFO = {"name": "landlock-supervisor-tests", "version": "0.1.0"}

# A line longer than this is treated as a broken stream rather than buffered
# without bound.
MAX_LINE = 64 * 1024 * 1024


class McpError(RuntimeError):
    """A JSON-RPC error response from the server."""

    def __init__(self, method: str, error: Mapping[str, Any]):
        self.method = method
        self.code = error.get("code")
        self.message = error.get("message", "")
        self.data = error.get("data")
        super().__init__(f"{method}: JSON-RPC error {self.code}: {self.message}")


def _fileno(f) -> int:
    return f if isinstance(f, int) else f.fileno()


class McpSession:
    """Synchronous MCP client on a pair of file descriptors.

    ``write`` is the server's stdin (an int fd or an object with fileno()),
    ``read`` is the server's stdout. Writes and reads go straight to the fds
    (os.write/os.read), never through Python buffers, so select() is exact.
    """

    def __init__(self, write, read, *, timeout: float = 10.0):
        self._wfd = _fileno(write)
        self._rfd = _fileno(read)
        self._owners = (write, read)  # keep file objects alive
        self.timeout = timeout
        self._buf = b""
        self._next_id = 1
        self.notifications: list[dict] = []
        self.server_info: dict | None = None
        self.server_capabilities: dict | None = None
        self.protocol_version: str | None = None
        self.init_latency: float | None = None  # seconds to the initialize reply

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> "McpSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close our end of the server's stdin (a polite EOF)."""
        w = self._owners[0]
        try:
            if isinstance(w, int):
                os.close(w)
            else:
                w.close()
        except OSError:
            pass

    # -- low level ---------------------------------------------------------
    def _send(self, msg: Mapping[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._wfd, view)
                view = view[n:]
        except BrokenPipeError:
            raise EOFError(f"MCP {msg.get('method', 'reply')}: server closed its stdin") from None

    def _read_message(self, method: str, deadline: float) -> dict:
        """Next JSON object from the server; blank and non-JSON lines skipped."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
                line = line.strip()
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    # A server printing junk on stdout is a server bug; keep
                    # going rather than crash the session on it.
                    self.notifications.append({"junk": line.decode("utf-8", "replace")})
                    continue
                if isinstance(msg, dict):
                    return msg
                continue
            if len(self._buf) > MAX_LINE:
                raise EOFError(f"{method}: line longer than {MAX_LINE} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"MCP {method}: no reply within {self.timeout:g}s")
            r, _, _ = select.select([self._rfd], [], [], remaining)
            if not r:
                raise TimeoutError(f"MCP {method}: no reply within {self.timeout:g}s")
            chunk = os.read(self._rfd, 65536)
            if not chunk:
                raise EOFError(f"MCP {method}: server closed its stdout")
            self._buf += chunk

    def _answer_server_request(self, msg: dict) -> None:
        method = msg.get("method")
        if method == "ping":
            result: dict = {}
        elif method == "roots/list":
            result = {"roots": []}
        else:
            self._send({"jsonrpc": "2.0", "id": msg["id"],
                        "error": {"code": -32601, "message": f"method not found: {method}"}})
            return
        self._send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    def request(self, method: str, params: Mapping[str, Any] | None = None,
                *, timeout: float | None = None) -> Any:
        """Send a request and wait for its response; return its ``result``."""
        rid = self._next_id
        self._next_id += 1
        msg: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = dict(params)
        self._send(msg)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            reply = self._read_message(method, deadline)
            if "method" in reply:
                if "id" in reply:
                    self._answer_server_request(reply)
                else:
                    self.notifications.append(reply)
                continue
            if reply.get("id") != rid:
                continue  # a stale reply to an earlier, timed-out request
            if "error" in reply:
                raise McpError(method, reply["error"])
            return reply.get("result")

    def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        msg: dict = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = dict(params)
        self._send(msg)

    # -- MCP ---------------------------------------------------------------
    def initialize(self, *, protocol_version: str = PROTOCOL_VERSION,
                   capabilities: Mapping[str, Any] | None = None,
                   timeout: float | None = None) -> dict:
        t0 = time.monotonic()
        result = self.request("initialize", {
            "protocolVersion": protocol_version,
            "capabilities": dict(capabilities or {}),
            "clientInfo": CLIENT_INFO,
        }, timeout=timeout)
        self.init_latency = time.monotonic() - t0
        self.server_info = result.get("serverInfo")
        self.server_capabilities = result.get("capabilities")
        self.protocol_version = result.get("protocolVersion")
        self.notify("notifications/initialized")
        return result

    def list_tools(self, *, timeout: float | None = None) -> list[dict]:
        tools: list[dict] = []
        cursor = None
        while True:
            params = {"cursor": cursor} if cursor else {}
            result = self.request("tools/list", params, timeout=timeout)
            tools.extend(result.get("tools", []))
            cursor = result.get("nextCursor")
            if not cursor:
                return tools

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None,
                  *, timeout: float | None = None) -> dict:
        """Call a tool; returns the result dict ({"content": [...], "isError": ...}).

        A tool-level failure is *not* raised: check ``result.get("isError")``
        (tool_text() gives the text). Protocol errors raise McpError.
        """
        return self.request("tools/call", {"name": name, "arguments": dict(arguments or {})},
                            timeout=timeout)


def tool_text(result: Mapping[str, Any]) -> str:
    """The concatenated text items of a tools/call result."""
    parts = []
    for item in result.get("content") or []:
        if item.get("type") == "text":
            parts.append(item.get("text", ""))
    return "\n".join(parts)


def start_unconfined(argv: Sequence[str], env: Mapping[str, str] | None = None,
                     cwd: str | os.PathLike | None = None, *,
                     stderr=subprocess.PIPE) -> subprocess.Popen:
    """Launch a stdio server without any sandbox, for reference runs.

    ``env`` is used as the *whole* environment (None: an empty one, never
    the caller's). The pipes are unbuffered binary; wrap them with
    McpSession(proc.stdin, proc.stdout). stderr is a pipe by default; pass
    subprocess.DEVNULL for servers that log a lot and are not drained.
    """
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(env or {}),
        cwd=None if cwd is None else os.fspath(cwd),
        bufsize=0,
        close_fds=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, timeout: float = 5.0) -> int:
    """Close stdin, wait, then terminate/kill; returns the exit status."""
    for f in (proc.stdin,):
        try:
            if f:
                f.close()
        except OSError:
            pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def minimal_env(extra: Mapping[str, str] | None = None,
                path: Iterable[str] = ("/usr/local/bin", "/usr/bin", "/bin")) -> dict:
    """A clean environment: PATH, LANG=C.UTF-8, plus ``extra``."""
    env = {"PATH": ":".join(path), "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env
