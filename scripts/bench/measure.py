"""Figures of the benchmark: percentiles of samples, RSS and CPU time read from /proc."""
from __future__ import annotations

import math
import os
import resource
import sys
import time
from typing import Any

from supervisor.daemon import procfs

now_ns = time.perf_counter_ns


def summarize(samples_ns: list[int]) -> dict[str, Any]:
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    n = len(s)

    def rank(q: float) -> float:
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6

    return {"n": n, "p50_ms": rank(0.50), "p90_ms": rank(0.90), "p99_ms": rank(0.99),
            "mean_ms": sum(s) / n / 1e6, "min_ms": s[0] / 1e6, "max_ms": s[-1] / 1e6}


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process, 0 when it cannot be read (gone)."""
    return procfs.rss_kib(pid) or 0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def proc_cpu(pid: int | str) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def cpu_sample(server_pid: int) -> list[float]:
    """CPU seconds so far: ours, our reaped children's, the supervisor's and its reaped children's.
    The supervisor's live Python children (a helper process such as a forking
    zygote, never a confined child: those exec) count as the supervisor."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = [me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, 0.0, 0.0]
    if server_pid:
        out[2], out[3] = proc_cpu(server_pid)
        for pid in _python_children(server_pid):
            own, reaped = proc_cpu(pid)
            out[2] += own
            out[3] += reaped
    return out


def _python_children(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return []
    out = []
    for child in children:
        try:
            with open(f"/proc/{child}/comm") as f:
                if f.read().startswith("python"):
                    out.append(child)
        except OSError:
            continue
    return out


def answering(client: Any, log_path: Any, tries: int = 500) -> None:
    """Once the supervisor behind `client` answers a ping (its log shown if it never does)."""
    for _ in range(tries):
        try:
            client.ping()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"the supervisor did not start: {open(log_path).read()[-3000:]}")
