"""The phases of a run (latency from a small and a big client, RSS, throughput, MCP), each method in interleaved rounds."""
from __future__ import annotations

import argparse
import shutil
import time
from typing import Any

from . import audit_exits, mcp, sdk, warm
from . import methods as m
from .bigheap import BigHeap
from .lab import Bench
from .measure import cpu_sample, log, rss_kib, summarize
from .methods import Method
from .worker import throughput

TARGETS = ("true", "cat")
# Peers this benchmark does not run, and why.
UNWIRED_PEERS = (("landrun", "not on PATH: a Go program, packaged by neither Debian 12 "
                  "nor PyPI nor npm (the registries this machine reaches)"),
                 ("nsjail", "not on PATH: not packaged by Debian 12"))


def counts(quick: bool, fast: bool, slow_budget: float) -> tuple[int, float]:
    """(spawns, time budget in s) of a fast or a slow method."""
    if fast:
        return (300, 20.0) if quick else (5000, 120.0)
    return (100, min(slow_budget, 3.0)) if quick else (2000, slow_budget)


def rounds(args: argparse.Namespace) -> int:
    return 5 if args.quick else 10


def run(bench: Bench) -> dict[str, list[Method]]:
    """Every phase --sections asks for, in a fixed order; the latency methods by phase."""
    args, res = bench.args, bench.results
    sections = set(args.sections.split(","))
    phases: dict[str, list[Method]] = {}
    if "latency" in sections:
        phases["small"] = small_client(bench)
        res["ready_child"] = sdk.ready_children(bench)   # the adaptive pool has children ready now
    if "rss" in sections:
        res["rss"] = rss(bench)
    if "throughput" in sections:
        res["throughput"] = {}
        duration = 2.0 if args.quick else 5.0
        for n in (1, 4, 16):
            for kind in ("floor", "forkserver"):
                log(f"throughput: {kind}, {n} client(s), {duration} s")
                res["throughput"][f"{kind}:{n}"] = throughput(bench, kind, n, duration)
    if "mcp" in sections:
        res["mcp"] = mcp.phase(bench)
    if "sdk" in sections:
        res["sdk"] = sdk.phase(bench)
    if "warm" in sections:
        res["warm"] = warm.phase(bench)
    if "big" in sections:
        phases["big"] = big_client(bench)
    if "audit" in sections:   # last: it switches the host's audit on, which slows every process forked after
        res["audit"] = audit_exits.phase(bench)
    return phases


def run_interleaved(methods: list[Method], rounds: int, warmup: int, server_pid: int = 0) -> None:
    """Each round runs a slice of every method in turn, so that drift in the
    machine's state (other work on a shared machine) spreads over all of them
    alike. CPU time is counted per method too: it is far less sensitive to
    the machine's load than the latency is."""
    for meth in methods:
        for _ in range(min(warmup, max(2, meth.n // 20))):
            meth.run()
    for r in range(rounds):
        for meth in methods:
            want = (meth.n * (r + 1)) // rounds - len(meth.total)
            budget = meth.budget_s * (r + 1) / rounds
            c0 = cpu_sample(server_pid)
            t0 = time.monotonic()
            for _ in range(want):
                if meth.spent + (time.monotonic() - t0) > budget and len(meth.total) >= 20:
                    break
                total, to_pid = meth.run()
                meth.total.append(total)
                if to_pid is not None:
                    meth.to_pid.append(to_pid)
            meth.spent += time.monotonic() - t0
            c1 = cpu_sample(server_pid)
            meth.cpu = [a + (y - x) for a, x, y in zip(meth.cpu, c0, c1)]


def floor_and_forkserver(bench: Bench, t: str, suffix: str, floor_label: str, forkserver_label: str
                         ) -> list[Method]:
    """The two fast methods every phase compares, for target t."""
    n, budget = counts(bench.args.quick, True, 0)
    if bench.args.spawns:
        n = bench.args.spawns
    return [Method(f"floor{suffix}:{t}", floor_label, m.floor(bench, t), n, budget),
            Method(f"forkserver{suffix}:{t}", forkserver_label, m.forkserver(bench, t), n, budget)]


def small_client(bench: Bench) -> list[Method]:
    """The floor, the fork-server and the peers, from this (small) process."""
    args = bench.args
    methods = []
    for t in TARGETS:
        methods += floor_and_forkserver(bench, t, "", "1 floor: posix_spawn + waitpid, unconfined",
                                        "2 fork-server: Client.spawn + wait, confined")
        if t == "true":
            # The same manifest without a pool setting: what a user gets (pool: auto).
            n, budget = methods[-1].n, methods[-1].budget_s
            methods.append(Method("forkserver_auto:true", "2 fork-server, the manifest without pool: (auto)",
                                  m.forkserver(bench, "true-auto"), n, budget))
        if not args.no_peers:
            n, b = counts(args.quick, False, 40.0)
            methods.append(Method(f"landlock_exec:{t}", "5 re-exec wrapper: landlock-exec, same spec",
                                  m.landlock_exec(bench, t), n, b))
    methods += peers(bench)
    for peer, why in UNWIRED_PEERS:
        where = shutil.which(peer)
        bench.results["skipped"][peer] = f"installed at {where} but not wired into this benchmark" if where else why
    log(f"latency, small client: {len(methods)} methods, {rounds(args)} interleaved rounds")
    run_interleaved(methods, rounds(args), warmup=50, server_pid=bench.daemon_pid)
    return methods


def peers(bench: Bench) -> list[Method]:
    """bubblewrap and the PyPI landlock wrapper where they run; why not recorded otherwise."""
    args, res = bench.args, bench.results
    methods = []
    bw = m.bwrap_argv(bench) if not args.no_peers else "not run (--no-peers)"
    if isinstance(bw, str):
        res["skipped"]["bwrap"] = bw
    else:
        res["bwrap_argv"] = bw
        for t in TARGETS:
            n, b = counts(args.quick, False, 30.0)
            methods.append(Method(f"bwrap:{t}", "6 bubblewrap --ro-bind / / --unshare-all ...",
                                  m.bwrap(bench, t, bw), n, b))
    pw = m.pypi_wrapper(bench) if not args.no_peers else "not run (--no-peers)"
    if isinstance(pw, str):
        res["skipped"]["pypi_landlock"] = pw
    else:
        for t in TARGETS:
            n, b = counts(args.quick, False, 40.0)
            methods.append(Method(f"pypi_landlock:{t}", f"6 PyPI landlock {res['pypi_landlock_version']} in a wrapper",
                                  m.pypi(bench, t, pw), n, b))
    return methods


def rss(bench: Bench) -> dict[str, Any]:
    """The supervisor's RSS over many spawns, and once its timers have run out."""
    n_rss = bench.args.rss_spawns or (2000 if bench.args.quick else 10000)
    log(f"supervisor RSS over {n_rss} spawns")
    spawn = m.forkserver(bench, "true")
    for _ in range(200):
        spawn()
    before = rss_kib(bench.daemon_pid)
    every = max(1, n_rss // 10)
    samples = [before]
    for i in range(1, n_rss + 1):
        spawn()
        if i % every == 0:
            samples.append(rss_kib(bench.daemon_pid))
    after = rss_kib(bench.daemon_pid)
    stats_after = bench.client.stats()
    settle = 6.0  # the supervisor's 5 s timers (request deadline, KILL after TERM) run out
    time.sleep(settle)
    bench.client.ping()  # one turn of its loop, so expired timers are popped
    time.sleep(0.1)
    settled = rss_kib(bench.daemon_pid)
    return {"fresh_kib": bench.results["supervisor_rss_kib_fresh"], "before_kib": before,
            "after_kib": after, "spawns": n_rss, "growth_kib": after - before,
            "settle_s": settle, "settled_kib": settled, "every": every, "samples_kib": samples,
            "stats_after": stats_after}


def big_client(bench: Bench) -> list[Method]:
    """This process grown to --heap-mib with threads: the heap sweep, then the big-client methods."""
    args, res = bench.args, bench.results
    big = BigHeap(0, args.threads, args.busy_threads)
    res["heap_sweep"] = [heap_point(bench, big, mib)
                         for mib in [x for x in (64, 256, 512) if x < args.heap_mib] + [args.heap_mib]]
    res["big_client"] = {"rss_kib": big.rss_kib, "threads": big.thread_count,
                         "sleeping_threads": args.threads, "busy_threads": args.busy_threads}
    methods = []
    for t in TARGETS:
        methods += floor_and_forkserver(bench, t, "_big", "1 floor, from the 1 GiB client",
                                        "3 fork-server, from the 1 GiB client")
        n, b = counts(args.quick, False, 30.0)
        methods.append(Method(f"preexec_big:{t}", "4 Popen(preexec_fn=landlock.apply), 1 GiB client",
                              m.preexec(bench, t), min(n, 1000), b))
    log(f"latency, big client: {len(methods)} methods")
    run_interleaved(methods, rounds(args), warmup=20, server_pid=bench.daemon_pid)
    big.close()
    return methods


def heap_point(bench: Bench, big: BigHeap, mib: int) -> dict[str, Any]:
    """How the cost grows with the client's heap: one size on the way up."""
    quick = bench.args.quick
    big.grow(mib)
    log(f"client heap {big.rss_kib // 1024} MiB: preexec_fn and fork-server spawns")
    point: dict[str, Any] = {"heap_mib": mib, "rss_kib": big.rss_kib}
    for key, spawn, n in (("preexec", m.preexec(bench, "true"), 15 if quick else 40),
                          ("forkserver", m.forkserver(bench, "true"), 100 if quick else 400),
                          ("floor", m.floor(bench, "true"), 100 if quick else 400)):
        spawn()
        point[key] = summarize([spawn()[0] for _ in range(n)])
    return point
