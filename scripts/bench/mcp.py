"""MCP server start-up: spawn -> initialize reply, through the supervisor and unconfined."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from .lab import ENV, USER, Bench, user_ids
from .measure import log, now_ns

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                   "clientInfo": {"name": "bench_spawn", "version": "1"}}}


def servers(bench: Bench) -> list[dict[str, Any]]:
    """The installed real servers (scripts/install-servers), else a tiny echo server."""
    servers_dir = Path(bench.args.servers_dir)
    out = []
    time_bin = servers_dir / "venv" / "bin" / "mcp-server-time"
    node = shutil.which("node")
    fs_js = servers_dir / "node" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
    base = {"cwd": str(bench.rw), **USER, "umask": "077"}
    if time_bin.exists():
        out.append({"name": "mcp-time", "label": "mcp-server-time (Python)", "real": True, "manifest": {
            **base, "name": "mcp-time", "command": str(time_bin), "args": ["--local-timezone", "UTC"],
            "env": ENV, "sandbox": {"profiles": ["system", "python"], "read_write_noexec": [str(bench.rw)],
                                    "rlimits": {"NOFILE": 1024, "CORE": 0}}}})
    if node and fs_js.exists():
        out.append({"name": "mcp-fs", "label": "server-filesystem (Node)", "real": True, "manifest": {
            **base, "name": "mcp-fs", "command": node, "args": [str(fs_js), str(bench.rw)],
            "env": ENV, "sandbox": {"profiles": ["system", "node"], "read_only_noexec": [str(servers_dir / "node")],
                                    "read_write_noexec": [str(bench.rw)], "rlimits": {"NOFILE": 1024, "CORE": 0}}}})
    if not out:
        script = bench.tmp / "echo_server.py"
        shutil.copyfile(Path(__file__).with_name("echo_server.py"), script)
        os.chmod(script, 0o644)
        out.append({"name": "mcp-echo", "label": "tiny Python echo server (no real server installed)",
                    "real": False, "manifest": {
                        **base, "name": "mcp-echo", "command": "/usr/bin/python3", "args": ["-I", str(script)],
                        "env": ENV, "sandbox": {"profiles": ["system"], "read_only": ["/usr/lib/python3.11"],
                                                "read_only_noexec": [str(script)],
                                                "read_write_noexec": [str(bench.rw)]}}})
    return out


def phase(bench: Bench) -> dict[str, Any]:
    """Each loaded server, started runs times each way, alternating."""
    out = {}
    runs = 5 if bench.args.quick else 15
    for server in bench.mcp:
        log(f"MCP start-up: {server['label']}, {runs} runs each way")
        entry: dict[str, Any] = {"label": server["label"], "real_server": server["real"], "runs": runs}
        try:
            entry.update(_measure(bench, server, runs))
        except Exception as e:  # noqa: BLE001 - reported, never faked
            entry["error"] = f"{type(e).__name__}: {e}"
        out[server["name"]] = entry
        if not server["real"]:
            bench.results["notes"].append("MCP start-up measured with a tiny echo server: no real server "
                                          f"installed in {bench.args.servers_dir} (scripts/install-servers)")
    return out


def _measure(bench: Bench, server: dict[str, Any], runs: int) -> dict[str, Any]:
    once(bench, server, True)  # warm the page cache and the ruleset cache
    once(bench, server, False)
    un, co = [], []
    for _ in range(runs):
        un.append(once(bench, server, False))
        co.append(once(bench, server, True))
    un.sort()
    co.sort()
    entry: dict[str, Any] = dict(unconfined_ms=un, confined_ms=co, unconfined_p50_ms=un[len(un) // 2],
                                 confined_p50_ms=co[len(co) // 2], unconfined_min_ms=un[0], confined_min_ms=co[0])
    entry["added_p50_ms"] = entry["confined_p50_ms"] - entry["unconfined_p50_ms"]
    entry["added_pct"] = 100 * entry["added_p50_ms"] / entry["unconfined_p50_ms"]
    return entry


def _read_reply(fd: int, timeout: float) -> dict[str, Any]:
    buf = b""
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == 1:
                return msg
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no initialize reply")
        data = os.read(fd, 65536)
        if not data:
            raise EOFError("the server closed its stdout before replying")
        buf += data


def once(bench: Bench, server: dict[str, Any], confined: bool) -> float:
    """ms from the spawn to the initialize reply."""
    m = bench.load_spec(server["name"])
    r_in, w_in = os.pipe2(os.O_CLOEXEC)
    r_out, w_out = os.pipe2(os.O_CLOEXEC)
    request = (json.dumps(INIT) + "\n").encode()
    child = pid = None
    try:
        t0 = now_ns()
        if confined:
            child = bench.client.spawn(server["name"], stdin=r_in, stdout=w_out, stderr=bench.devnull)
        else:
            # Unconfined, but as the same user, with the same argv, env and cwd.
            pid = _spawn_as(m.command, [m.command, *m.args], m.environment(os.environ), m.cwd,
                            (r_in, w_out, bench.devnull), user_ids())
        os.close(r_in)
        os.close(w_out)
        r_in = w_out = -1
        os.write(w_in, request)
        reply = _read_reply(r_out, 30)
        t1 = now_ns()
        if "result" not in reply:
            raise RuntimeError(f"{server['name']}: initialize failed: {reply}")
        return (t1 - t0) / 1e6
    finally:
        for fd in (r_in, w_out, w_in):
            if fd >= 0:
                os.close(fd)
        if child is not None:
            try:
                child.wait(5)
            except TimeoutError:
                child.kill()
            child.close()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        os.close(r_out)


def _spawn_as(program: str, argv: list[str], env: dict[str, str], cwd: str, stdio: tuple[int, int, int],
              ids: tuple[int, int]) -> int:
    """Unconfined reference launch as the manifest's user: a tiny fork+exec
    (the launch method costs nothing next to a server's start-up)."""
    uid, gid = ids
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.geteuid() != 0:
                uid, gid = os.getuid(), os.getgid()
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            os.chdir(cwd)
            if os.geteuid() == 0:
                os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(program, argv, env)
        finally:
            os._exit(127)
    return pid
