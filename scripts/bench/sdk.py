"""What an MCP client feels: the initialize round trip through the official Python SDK, direct against `run`
(daemon and private mode); and what an idle ready child of an adaptive pool costs in memory."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from supervisor.daemon import procfs

from .lab import REPO, Bench
from .measure import log

CLIENT_PYTHON = REPO / ".clients" / "py" / "bin" / "python"
SUPERVISOR = REPO / ".venv" / "bin" / "landlock-supervisor"


def phase(bench: Bench) -> dict[str, Any]:
    """The first real server of the run (mcp-time, else any), started by
    the SDK directly, through the daemon and through a private supervisor."""
    if not CLIENT_PYTHON.exists():
        return {"skipped": f"{CLIENT_PYTHON} missing: run scripts/install-clients"}
    server = next((s for s in bench.mcp if s["real"]), None)
    if server is None:
        return {"skipped": "no real MCP server installed (scripts/install-servers)"}
    m = bench.load_spec(server["name"])
    private_state = bench.tmp / "private-state"
    variants = {
        "direct": {"command": m.command, "args": list(m.args), "env": m.environment(os.environ)},
        "daemon": {"command": str(SUPERVISOR), "args": ["--socket", bench.sock, "run", server["name"]], "env": {}},
        "private": {"command": str(SUPERVISOR), "args": ["run", "--manifests", str(bench.mdir / f"{server['name']}.yaml"),
                                                         "--state-root", str(private_state), server["name"]],
                    "env": {}},
    }
    runs = 10
    spec_path = bench.tmp / "sdk.json"
    spec_path.write_text(json.dumps({"runs": runs, "timeout": 60, "variants": variants}))
    log(f"MCP SDK initialize round trip: {server['label']}, direct / daemon / private, {runs} runs interleaved")
    # -I: not this directory on sys.path (its mcp.py would shadow the SDK).
    r = subprocess.run([str(CLIENT_PYTHON), "-I", str(Path(__file__).with_name("sdk_client.py")), str(spec_path)],
                       capture_output=True, text=True, timeout=600)
    try:
        times = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"label": server["label"], "error": f"exit {r.returncode}: {r.stderr[-500:]}"}
    if "error" in times:
        return {"label": server["label"], "error": times["error"]}
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"label": server["label"], "runs": runs, "ms": times, "median_ms": med,
            "daemon_added_ms": med["daemon"] - med["direct"], "private_added_ms": med["private"] - med["direct"]}


def _rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in KiB: Rss, Pss, private pages."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Pss_Anon"):
                out[key] = int(rest.split()[0])
    return out


def ready_children(bench: Bench) -> dict[str, Any]:
    """What each idle ready child (and its exec helper, sharing its memory) costs: smaps_rollup."""
    zygote = bench.client.stats()["zygote"]
    sessions = {c["pid"] for c in bench.client.list()["children"]}
    others = [p for p in procfs.children_of(bench.daemon_pid) if p not in sessions and p != zygote]
    waiting = [p for p in others if os.getsid(p) == p]          # pooled children lead their own sessions
    helpers = [p for p in others if p not in waiting]
    per: dict[str, list[int]] = {}
    for kind, pids in (("child", waiting), ("helper", helpers), ("zygote", [zygote])):
        for pid in pids:
            try:
                for key, kib in _rollup(pid).items():
                    per.setdefault(f"{kind}_{key}", []).append(kib)
            except OSError:
                continue
    out: dict[str, Any] = {"children": len(waiting), "helpers": len(helpers)}
    out.update({key: statistics.median(v) for key, v in per.items()})
    return out
