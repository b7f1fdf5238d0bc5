"""A tiny MCP server that answers initialize: the start-up benchmark's stand-in
when no real server is installed (run by the benchmark, never imported)."""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "serverInfo": {"name": "echo", "version": "0"}}}), flush=True)
