#!/usr/bin/env python3
"""The supervisor under a flood of denials from Landlock domains it does not know (issue 20, point 8).

    sudo .venv/bin/python scripts/bench_audit_flood.py [--seconds 10] [--flooders 4] [--json FILE]

A `serve --audit detail` supervisor; `--flooders` unprivileged local users
(uids 64190...), none of them its clients, each keeping `--live` processes
denied in a Landlock domain of their own (DENIALS denials each, then
replaced), for `--seconds`. Meanwhile a client
spawns /bin/true in a loop, timing request -> `spawned`; the supervisor's
RSS is sampled every 20 ms. The same spawn loop runs for as long before
the flood: the baseline, in the same run. Prints RSS (idle, peak during the
flood, the kernel's high-water mark) and spawn latency (p50, p99, max),
flood against baseline.

Root only; switches the host's audit on for the run and puts it back.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.bench.measure import answering, log, rss_kib, summarize  # noqa: E402
from supervisor.client import Client  # noqa: E402

FIRST_UID = 64190
DENIALS = 2000
# Each flooder keeps --live children, each in a fresh domain (READ_FILE
# handled) making DENIALS denied opens, replaced as they end, until the
# deadline: many domains the supervisor does not know, all flooding at once.
FLOODER = """
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
attr = struct.pack("Q", 1 << 2)
end = time.monotonic() + float(sys.argv[1])
live = 0
while time.monotonic() < end:
    while live < int(sys.argv[2]):
        if os.fork() == 0:
            fd = libc.syscall(444, attr, len(attr), 0)
            libc.prctl(38, 1, 0, 0, 0)
            libc.syscall(446, fd, 0)
            for i in range(%d):
                try:
                    os.open("/etc/hostname", os.O_RDONLY)
                except OSError:
                    pass
            os._exit(0)
        live += 1
    os.wait()
    live -= 1
""" % DENIALS


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _spawns(client: Client, until: float) -> list[int]:
    out = []
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        while time.monotonic() < until:
            t0 = time.perf_counter_ns()
            child = client.spawn("true", stdin=null, stdout=null, stderr=null)
            out.append(time.perf_counter_ns() - t0)
            child.wait(30)
            child.close()
    finally:
        os.close(null)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--flooders", type=int, default=4)
    p.add_argument("--live", type=int, default=1, help="processes flooding at once per flooder, each its own domain")
    p.add_argument("--pool", type=int, default=0, help="the spawned manifest's pool (0: a fresh child each time)")
    p.add_argument("--json")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_audit_flood: root only (reading audit records, other users' floods)")
    base = Path(tempfile.mkdtemp(prefix="llsv-bench-flood-"))
    os.chmod(base, 0o755)
    (base / "m").mkdir()
    (base / "m" / "true.yaml").write_text(f"name: 'true'\nallow_root: true\ncommand: /bin/true\npool: {args.pool}\n"
                                          "sandbox: {profiles: [system]}\n")
    (base / "flood.py").write_text(FLOODER)
    os.chmod(base / "flood.py", 0o644)
    sock = base / "sv.sock"
    sv = subprocess.Popen([sys.executable, "-m", "supervisor", "--socket", str(sock), "serve", "--manifests",
                           str(base / "m"), "--state-root", str(base / "state"), "--audit", "detail",
                           "--allow-root-servers"], cwd=REPO, stdin=subprocess.DEVNULL,
                          stderr=open(base / "sv.log", "wb"))
    flooders: list[subprocess.Popen[bytes]] = []
    try:
        client = Client(str(sock))
        answering(client, base / "sv.log")
        _spawns(client, time.monotonic() + 1.0)   # warm: the zygote, the confinement cache
        idle = rss_kib(sv.pid)
        baseline = _spawns(client, time.monotonic() + args.seconds)
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                samples.append(rss_kib(sv.pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        log(f"{args.flooders} flooders for {args.seconds} s")
        for i in range(args.flooders):
            uid = FIRST_UID + i
            flooders.append(subprocess.Popen([sys.executable, "-I", "-S", str(base / "flood.py"), str(args.seconds),
                                              str(args.live)],
                                             user=uid, group=uid, extra_groups=[], env={"PATH": "/usr/bin:/bin"}))
        flood = _spawns(client, time.monotonic() + args.seconds)
        for f in flooders:
            f.wait(60)
        time.sleep(1.0)   # what the socket still held
        done.set()
        sampler.join()
        lost = client.denials()["lost"]
        results: dict[str, Any] = {
            "seconds": args.seconds, "flooders": args.flooders, "live": args.live, "pool": args.pool,
            "rss_kib": {"idle": idle, "peak_during_flood": max(samples, default=0), "vm_hwm": _vm_hwm(sv.pid)},
            "spawned": {"baseline": summarize(baseline), "flood": summarize(flood)}, "lost": lost}
    finally:
        for f in flooders:
            f.kill()
        sv.terminate()
        sv.wait(30)
    rss, sp = results["rss_kib"], results["spawned"]
    print(f"RSS KiB: idle {rss['idle']}, peak during the flood {rss['peak_during_flood']} "
          f"(+{(rss['peak_during_flood'] - rss['idle']) / 1024:.1f} MiB), VmHWM {rss['vm_hwm']}")
    for phase in ("baseline", "flood"):
        f = sp[phase]
        print(f"request -> spawned, {phase:<8}: n {f['n']}, p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms, "
              f"max {f['max_ms']:.2f} ms")
    print(f"p99 flood / baseline: {sp['flood']['p99_ms'] / sp['baseline']['p99_ms']:.2f}; lost: {lost}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
