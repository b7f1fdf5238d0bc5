"""A real MCP client, the official Python SDK (mcp), run from its own venv
(.clients/py, scripts/install-clients), never imported by the tests.

    .clients/py/bin/python driver.py SPEC.json

SPEC: {"timeout", "sessions": {KEY: {"command", "args", "env" (the client
config's env: the SDK adds HOME, LOGNAME, PATH, SHELL, TERM, USER of this
process's own environment, as every client does), "roots" (directories
announced through the roots capability, or null: none), "settle": {"tool",
"arguments", "until"} (repeated until its text holds `until`: the server
asks for the roots after initialization), "calls": [{"tool", "arguments"}...]}}}. One process runs them all, one after the other: the
SDK's import is what costs here.

For each session it starts the server as an MCP client does (stdio_client),
initializes, lists the tools, makes the calls in order, closes the session,
then waits for what the server left behind: this process is a child
subreaper, so whatever `run` started that outlives it (a private supervisor,
a server) becomes our child. Prints one JSON object {KEY: {"server",
"protocol", "tools", "calls": [{"isError", "text"}], "leftover": [cmdlines],
"seconds"} (on failure "error" and "stage" instead of what is missing)}.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

PR_SET_CHILD_SUBREAPER = 36


def children() -> dict[int, str]:
    """Our live children (zombies reaped first): pid -> cmdline."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    me = os.getpid()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    return out


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def session(spec: dict[str, Any], timeout: float, out: dict[str, Any]) -> None:
    params = StdioServerParameters(command=spec["command"], args=spec.get("args", []), env=spec.get("env"))
    roots = spec.get("roots")

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=Path(p).as_uri(), name=Path(p).name) for p in roots])

    stage = "start"
    try:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=timeout,
                                     list_roots_callback=list_roots if roots is not None else None) as s:
                stage = "initialize"
                with anyio.fail_after(timeout):
                    init = await s.initialize()
                out["server"] = init.server_info.name
                out["protocol"] = init.protocol_version
                stage = "tools/list"
                with anyio.fail_after(timeout):
                    out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
                settle = spec.get("settle")
                if settle:
                    stage = f"settle {settle['tool']}"
                    with anyio.fail_after(timeout):
                        while settle["until"] not in text_of(await s.call_tool(settle["tool"], settle["arguments"])):
                            await anyio.sleep(0.05)
                out["calls"] = []
                for call in spec.get("calls", []):
                    stage = f"tools/call {call['tool']}"
                    with anyio.fail_after(timeout):
                        result = await s.call_tool(call["tool"], call.get("arguments") or {})
                    out["calls"].append({"isError": bool(result.is_error), "text": text_of(result)})
                stage = "close"
    except BaseException as e:  # noqa: BLE001 - reported, whatever it is
        out["error"] = f"{type(e).__name__}: {e}"
        if isinstance(e, BaseExceptionGroup):
            out["error"] += " | " + " | ".join(f"{type(x).__name__}: {x}" for x in e.exceptions)
        out["stage"] = stage


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER")
    timeout = float(spec.get("timeout", 30))
    results: dict[str, Any] = {}
    for key, one in spec["sessions"].items():
        out: dict[str, Any] = {}
        t0 = time.monotonic()
        anyio.run(session, one, timeout, out)
        out["seconds"] = round(time.monotonic() - t0, 3)
        # What is left of the server's side: give it the time a client would.
        deadline = time.monotonic() + float(spec.get("leftover_wait", 5))
        left = children()
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = children()
        out["leftover"] = sorted(left.values())
        for pid in left:   # not to be blamed on the next session
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        results[key] = out
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
