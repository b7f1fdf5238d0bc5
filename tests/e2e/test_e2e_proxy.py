"""examples/proxy.py as an MCP client runs it: a subprocess on pipes, with its
own private supervisor, fronting the filesystem and time servers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2ehelpers import EXAMPLES, PYTHON, REPO, TIMEOUT, McpSession, World, tool_text  # noqa: E402
from mcp_session import McpError  # noqa: E402


@pytest.fixture(scope="module")
def proxy(world: World) -> Iterator[tuple[subprocess.Popen[bytes], McpSession, Path]]:
    log = world.dir / "proxy.stderr"
    state = world.dir / "proxy-state"    # its own: the supervisor of `world` owns world.state
    with open(log, "wb") as err:
        p = subprocess.Popen([PYTHON, str(EXAMPLES / "proxy.py"), "--manifests", str(EXAMPLES),
                              "--state-root", str(state), "--server", "filesystem", "--server", "time"],
                             cwd=REPO, env=world.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err, bufsize=0, start_new_session=True)
    session = McpSession(p.stdin, p.stdout, timeout=TIMEOUT)
    yield p, session, log
    if p.poll() is None:
        p.kill()
        p.wait()


def test_proxy_initialize_list_call(proxy: tuple[subprocess.Popen[bytes], McpSession, Path],
                                    world: World) -> None:
    p, s, log = proxy
    try:
        info = s.initialize()
        assert info["serverInfo"]["name"] == "landlock-supervisor-proxy"
        assert info["protocolVersion"] == "2024-11-05"
        tools = {t["name"]: t for t in s.list_tools()}
        assert {"filesystem__read_text_file", "filesystem__list_allowed_directories",
                "time__get_current_time", "time__convert_time"} <= set(tools), sorted(tools)
        assert all(name.startswith(("filesystem__", "time__")) for name in tools), sorted(tools)
        assert "inputSchema" in tools["filesystem__read_text_file"]

        result = s.call_tool("filesystem__read_text_file", {"path": str(world.projects / "notes.txt")})
        assert not result.get("isError") and tool_text(result) == "hello from an allowed project\n", result
        result = s.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert json.loads(tool_text(result))["timezone"] == "UTC", result
        # Errors come back as the server gave them (here its own check: the
        # proxy hands the server no extra directories).
        result = s.call_tool("filesystem__read_text_file", {"path": str(world.secret / "id_ed25519")})
        assert result.get("isError") and "Access denied - path outside allowed directories" in tool_text(result)

        with pytest.raises(McpError) as e:
            s.request("resources/list", {})
        assert e.value.code == -32601
        with pytest.raises(McpError) as e:
            s.call_tool("nosuch__tool", {})
        assert e.value.code == -32602
    except (EOFError, TimeoutError, AssertionError) as e:
        raise AssertionError(f"{e}\n--- proxy stderr:\n{log.read_text(errors='replace')[-3000:]}") from None
    s.close()   # EOF: the proxy ends its servers and its private supervisor, then itself
    assert p.wait(15) == 0, log.read_text(errors="replace")[-3000:]
