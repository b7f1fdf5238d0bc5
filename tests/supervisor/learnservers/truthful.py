"""An MCP server (stdlib, offline) whose tools fail, connect, hang and make temporary names: learn must tell each truly.

Tools: `fail` answers isError with a message of two lines; `rpcfail` a
JSON-RPC error; `connect` {"port": N} connects to 127.0.0.1:N, its error
(a denial) as isError; `hang` {"port": N} connects (its denial held), then
never answers; `temp` makes names as Python's tempfile does and tries one
in /var/tmp (a random name, as its probe does); `grow` {"dir": D} reads
D/1/f .. D/n/f in its n-th run (counted in its state directory, $HOME): each
round needs one directory more.
"""
import json
import os
import secrets
import socket
import sys
import tempfile
import time


def connect(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        return s.recv(100).decode()


def temp() -> str:
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x")
    scratch = tempfile.mkdtemp()
    os.rmdir(scratch)
    probe = f"/var/tmp/{secrets.token_hex(4)}"
    try:   # as tempfile's probe does: a directory it may not write is no error
        with open(probe, "w") as f:
            f.write("probe")
        os.unlink(probe)
    except OSError:
        pass
    return "made"


def grow(directory: str) -> str:
    runs = os.path.join(os.environ["HOME"], "runs")
    n = len(open(runs).read()) + 1 if os.path.exists(runs) else 1
    with open(runs, "a") as f:
        f.write("x")
    for i in range(1, n + 1):
        try:
            open(os.path.join(directory, str(i), "f")).close()
        except OSError:
            pass
    return f"run {n}"


def call(name: str, args: dict) -> dict:
    if name == "grow":
        return {"content": [{"type": "text", "text": grow(args["dir"])}]}
    if name == "fail":
        return {"content": [{"type": "text", "text": "not a public address,\nstart with --allow-private-ips"}],
                "isError": True}
    if name == "hang":
        try:
            connect(args["port"])
        except OSError:
            pass
        time.sleep(3600)
    try:
        text = connect(args["port"]) if name == "connect" else temp()
    except OSError as e:
        return {"content": [{"type": "text", "text": f"{name} failed: {e}"}], "isError": True}
    return {"content": [{"type": "text", "text": text}]}


for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    reply = {"jsonrpc": "2.0", "id": msg["id"]}
    if msg["method"] == "initialize":
        reply["result"] = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                           "serverInfo": {"name": "truthful", "version": "1"}}
    elif msg["method"] == "tools/list":
        reply["result"] = {"tools": [{"name": n, "inputSchema": {"type": "object"}}
                                     for n in ("fail", "rpcfail", "connect", "hang", "temp", "grow")]}
    elif msg["params"]["name"] == "rpcfail":
        reply["error"] = {"code": -32000, "message": "the database is locked\u2028really"}
    else:
        reply["result"] = call(msg["params"]["name"], msg["params"].get("arguments") or {})
    print(json.dumps(reply), flush=True)
