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
    return 0


if __name__ == "__main__":
    sys.exit(main())
