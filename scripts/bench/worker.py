"""Throughput: N client processes (this program's hidden --worker mode) spawning in a loop at once."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

from .lab import ENV, REPO, TRUE, Bench
from .measure import cpu_sample, now_ns, summarize

COMMAND = REPO / "scripts" / "bench_spawn.py"


def main(args: argparse.Namespace) -> int:
    """A client process: spawn and wait in a loop between two instants read
    from stdin; print its count and latencies as one JSON line."""
    once = _spawner(args)
    for _ in range(5):
        once()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    start, duration = map(float, sys.stdin.readline().split())
    while time.monotonic() < start:
        time.sleep(min(0.001, max(0.0, start - time.monotonic())))
    end = start + duration
    count, lat = 0, []
    while True:
        t0 = now_ns()
        once()
        t1 = now_ns()
        if time.monotonic() > end:
            break
        count += 1
        lat.append(t1 - t0)
    sys.stdout.write(json.dumps({"count": count, **summarize(lat)}) + "\n")
    sys.stdout.flush()
    return 0


def _spawner(args: argparse.Namespace) -> Callable[[], None]:
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    if args.worker == "forkserver":
        from supervisor.client import Client
        client = Client(args.socket)

        def via_supervisor() -> None:
            child = client.spawn(args.manifest, stdin=devnull, stdout=devnull, stderr=devnull)
            if child.wait(30) != 0:
                raise RuntimeError(f"exit {child.exited}")
            child.close()
        return via_supervisor
    fa = [(os.POSIX_SPAWN_DUP2, devnull, i) for i in range(3)]

    def floor() -> None:
        pid = os.posix_spawn(TRUE, [TRUE], ENV, file_actions=fa)
        if os.waitpid(pid, 0)[1] != 0:
            raise RuntimeError("floor: /bin/true failed")
    return floor


def throughput(bench: Bench, kind: str, clients: int, duration: float) -> dict[str, Any]:
    """Start the workers, let them all run for duration, sum their reports."""
    procs = [_start_worker(bench, kind) for _ in range(clients)]
    for _, _, out in procs:
        if out.readline().strip() != "ready":
            raise RuntimeError(f"throughput worker ({kind}) failed to start")
    c0 = cpu_sample(bench.daemon_pid)
    start = time.monotonic() + 0.1
    for _, inp, _ in procs:
        inp.write(f"{start} {duration}\n")
        inp.flush()
    reports = []
    for pid, inp, out in procs:
        line = out.readline()
        inp.close()
        out.close()
        _, status = os.waitpid(pid, 0)
        if not line or status != 0:
            raise RuntimeError(f"throughput worker ({kind}) failed: status {status}")
        reports.append(json.loads(line))
    c1 = cpu_sample(bench.daemon_pid)
    total = sum(r["count"] for r in reports)
    p50s = sorted(r.get("p50_ms", 0) for r in reports)
    return {"clients": clients, "duration_s": duration, "spawns": total,
            "spawns_per_s": total / duration, "per_client_p50_ms_median": p50s[len(p50s) // 2],
            "supervisor_cpu_ms_per_spawn": 1000 * (c1[2] - c0[2]) / max(1, total) if kind == "forkserver" else None}


def _start_worker(bench: Bench, kind: str) -> tuple[int, Any, Any]:
    """(pid, its stdin, its stdout) of one worker."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    pid = os.posix_spawn(sys.executable, [sys.executable, str(COMMAND), "--worker", kind,
                                          "--socket", bench.sock, "--manifest", "true"], env,
                         file_actions=[(os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1),
                                       (os.POSIX_SPAWN_CLOSE, w_in), (os.POSIX_SPAWN_CLOSE, r_out)])
    os.close(r_in)
    os.close(w_out)
    return pid, os.fdopen(w_in, "w"), os.fdopen(r_out, "r")

