"""One benchmark run: the world set up, the phases, the report printed (or a throughput worker)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import lab, mcp, options, phases, report, worker
from .measure import log, rss_kib


def main(argv: list[str] | None = None) -> int:
    args = options.parse(argv)
    if args.worker:
        return worker.main(args)
    bench = lab.Bench(args)
    t_start = time.monotonic()
    res = bench.results
    res["machine"] = lab.machine()
    res["mode"] = "quick" if args.quick else "full"
    lab.schedule(args, res["machine"])
    try:
        import landlock
        res["machine"]["landlock_abi"] = landlock.abi_version()
        bench.write_manifests(mcp.servers(bench))
        res["manifest"] = bench.manifest_summary()
        log(f"manifests in {bench.mdir}; starting the supervisor on {bench.sock}")
        bench.start_daemon()
        by_phase = phases.run(bench)
        if res.get("rss"):
            res["rss"]["end_kib"] = rss_kib(bench.daemon_pid)
        res["supervisor_stats_end"] = bench.client.stats()
        report.build(res, by_phase)
        res["targets"] = report.targets(res)
        res["elapsed_s"] = time.monotonic() - t_start
        res["machine"]["loadavg_end"] = lab.loadavg()
    finally:
        bench.close()
    print(report.table(res, bench.shown_targets(), args.quick, args.pool), flush=True)
    print(f"\n({res['elapsed_s']:.0f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    failed = smoke_failures(res) if args.quick else []
    for line in failed:   # the smoke check CI runs: a section that broke, not a figure missed
        print(f"bench: smoke check failed: {line}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def smoke_failures(res: dict) -> list[str]:
    """What broke in a run (figures are never asserted): the warm section,
    where it ran, served every example warm, through `run` and the SDK."""
    warm = res.get("warm")
    if not warm or "skipped" in warm:
        return []
    if "error" in warm:
        return [f"warm: {warm['error']}"]
    examples = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    out = []
    if sorted(warm.get("handover", ())) != sorted([*examples, "trivial"]):
        out.append(f"warm: handed over {sorted(warm.get('handover', ()))}, not every example")
    sdk = warm.get("sdk", {})
    if "skipped" not in sdk and ("error" in sdk or sorted(sdk) != sorted([*examples, "trivial"])):
        out.append(f"warm: the SDK sessions: {str(sdk)[:500]}")
    if warm.get("discarded"):
        out.append(f"warm: {warm['discarded']} warm server(s) discarded")
    pss = warm.get("pss_kib", {})
    if not all(p["session"] >= p["list"] > 0 for p in pss.values()):
        out.append(f"warm: PSS unread: {pss}")
    return out


if __name__ == "__main__":
    sys.exit(main())
