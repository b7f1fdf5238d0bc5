#!/usr/bin/env python3
"""What denial visibility costs a spawn: `serve --audit off|count|detail`, interleaved in one run.

    sudo .venv/bin/python scripts/bench_audit.py [--rounds N] [--json FILE]

Three supervisors (one per mode, pool 0 and `pool: auto` manifests of
/bin/true and of a shell making one denied read) are started side by side;
each round spawns once through each, in turn, timing the request to
`spawned` and to `exited`. Figures are ratios to `off` in the same run.
Before that, `off` alone runs while audit is still off, if it is: once
audit was on, every process forked afterwards pays for a system-call audit
context until reboot, which the interleaved `off` then includes.

Root only; switches the host's audit on for the run (the `count` and
`detail` supervisors do, and put it back), and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from landlock import audit  # noqa: E402
from scripts.bench.audit_exits import MANIFESTS, MODES, interleaved, start, write_manifests  # noqa: E402
from scripts.bench.measure import log  # noqa: E402

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_audit: root only (reading audit records needs CAP_AUDIT_READ)")
    before = audit.status()
    base = Path(tempfile.mkdtemp(prefix="llsv-bench-audit-"))
    write_manifests(base / "m")
    results: dict[str, Any] = {"rounds": args.rounds, "audit_before": before._asdict(), "phases": {}}
    procs = []
    try:
        if before.enabled == 0:
            proc, client = start(base, "off")
            procs.append(proc)
            results["phases"]["off_before_audit"] = interleaved({"off": client}, args.rounds)["off"]
            proc.terminate()
            proc.wait(30)
            procs.remove(proc)
        log("switching audit on for the count and detail supervisors (host-wide; they put it back)")
        clients = {}
        for mode in MODES:
            proc, clients[mode] = start(base, mode)
            procs.append(proc)
        results["phases"].update(interleaved(clients, args.rounds))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)
        after = audit.status()
        results["audit_after"] = after._asdict()
    print(_table(results))
    print("\naudit was switched on for this run and put back; the kernel keeps it 'ever enabled' until reboot "
          "(every process forked since pays for a system-call audit context)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _table(results: dict[str, Any]) -> str:
    phases = results["phases"]
    lines = [f"{'manifest':<12} {'phase':<18} {'spawned p50 ms':>15} {'x off':>7} {'exited p50 ms':>14} {'x off':>7}"]
    for name in MANIFESTS:
        off = phases["off"][name]
        for phase, figures in phases.items():
            s, e = figures[name]["spawned"]["p50_ms"], figures[name]["exited"]["p50_ms"]
            lines.append(f"{name:<12} {phase:<18} {s:>15.3f} {s / off['spawned']['p50_ms']:>7.2f} "
                         f"{e:>14.3f} {e / off['exited']['p50_ms']:>7.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
