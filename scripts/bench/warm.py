"""Warm servers (issue 28): every example server with `warm: 1`, in a daemon of its own (root: warm servers need one).

- `run NAME` to the initialize reply through the official Python SDK, beside
  `run` of a trivial warm server (run's own start: one session before each
  server's) and the direct launch;
- the supervisor's part, spawn request to the pipe ends in hand
  (Client.spawn(stdio="pipes") of a ready warm server, from its connect(2)
  to the reply's recvmsg(2): the library's own work before and after is
  the client's), the whole call beside it, and that server's first reply on
  those pipes (the server's own share);
- the relay's cost as the SDK meets it (the issue's targets): tools/call
  of `everything`'s echo, one character and 5 MiB, through `run` of it
  (warm: relayed) against `run` of the same server with none (on the SDK's
  own pipes); and the relay's own, to a client that only moves bytes: a
  small round trip and a 5 MiB one through `run` of a warm `cat` against a
  fresh `cat` spawned on the client's own pipes (and on them widened as
  `run` widens its own);
- what each warm server costs in memory: `list`'s pss_kib once settled.
Medians of interleaved rounds. Asserts nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from supervisor.client.relay import OUR_PIPE_SIZE, PIPE_SIZE

from .lab import REPO, Bench
from .mcp import INIT, _read_reply
from .measure import log
from .sdk import CLIENT_PYTHON, SUPERVISOR

SMALL = b"x" * 63 + b"\n"   # one small message (a short JSON-RPC line's size)
BIG = 5 << 20
RELAY_SERVER = "everything"  # an example with an echo tool: the relay as the SDK meets it
TRIVIAL = "trivial"          # the echo server: its reply is immediate, so `run`'s own start is what it measures
# After each session (not timed): the server handed over replaced and started up, so that no
# measurement shares the CPUs with a replacement's start (npx and uvx ones take ~1 s here).
PAUSE_S = {True: 1.5, False: 2.5}    # by --quick
SETTLE_S = 3.0               # a warm server's memory read this long after it is ready


def phase(bench: Bench) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "warm servers need a root supervisor: run the benchmark as root"}
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    import e2ehelpers  # type: ignore[import-not-found]  # (tests/e2e, on the path just above)
    problem = e2ehelpers.servers_problem()
    if problem:
        return {"skipped": problem}
    world = e2ehelpers.World(bench.tmp / "warm-world")
    try:
        world.build()
        names = _manifests(bench, world)
        try:
            daemon = Daemon(bench, world, names)
        except RuntimeError as e:
            return {"error": str(e)}
        try:
            return _measure(bench, daemon, names)
        except Exception as e:  # noqa: BLE001 - reported, never faked
            return {"error": f"{type(e).__name__}: {e}; the supervisor said: {daemon.log.read_text()[-1500:]}"}
        finally:
            daemon.stop()
    finally:
        # Its state root (~300 MB of cache copies) is in /dev/shm where there is room: not under bench.tmp.
        shutil.rmtree(world.state, ignore_errors=True)


def _manifests(bench: Bench, world: Any) -> list[str]:
    """examples/*.yaml with `warm: 1`, the trivial server and the two cats; the examples' names."""
    mdir = bench.tmp / "warm-manifests"
    mdir.mkdir()
    names = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        (mdir / path.name).write_text(path.read_text() + "\nwarm: 1\n")
        names.append(path.stem)
    echo = bench.tmp / "echo_server.py"
    echo.write_bytes(Path(__file__).with_name("echo_server.py").read_bytes())
    os.chmod(echo, 0o644)
    (mdir / f"{TRIVIAL}.yaml").write_text(json.dumps({
        "command": "/usr/bin/python3", "args": ["-I", str(echo)], "user": "nobody", "warm": 1,
        "sandbox": {"profiles": ["system"], "read_only": ["/usr/lib/python3.11"], "read_only_noexec": [str(echo)]}}))
    # The relay as the SDK meets it: the same server without warm ones, on the SDK's own pipes.
    (mdir / f"{RELAY_SERVER}-fresh.yaml").write_text((REPO / "examples" / f"{RELAY_SERVER}.yaml").read_text())
    for name, warm in (("cat-warm", 1), ("cat-fresh", 0)):
        (mdir / f"{name}.yaml").write_text(json.dumps({"command": "/bin/cat", "user": "nobody", "warm": warm,
                                                       "sandbox": {"profiles": ["system"]}}))
    return names


class Daemon:
    """The warm section's supervisor: its manifests, the e2e world's environment (caches seeded)."""

    def __init__(self, bench: Bench, world: Any, names: list[str]) -> None:
        from supervisor.client import Client
        self.sock = str(bench.tmp / "warm-run" / "socket")
        self.log = bench.tmp / "warm-supervisor.log"
        argv = [sys.executable, "-m", "supervisor", "--socket", self.sock, "serve", "--manifests",
                str(bench.tmp / "warm-manifests"), "--state-root", str(world.state)]
        with open(self.log, "ab") as logf:
            # No warm server drained for want of demand while a section waits (300 s by default).
            env = world.env() | {"LANDLOCK_SUPERVISOR_POOL_IDLE": "3600"}
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        self.client = Client(self.sock)
        self.all = [*names, TRIVIAL, "cat-warm"]
        if not self.ready(self.all, 180):
            raise RuntimeError(f"warm servers not ready in 180 s: {self.log.read_text()[-2000:]}")

    def ready(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                warm = self.client.stats()["warm"]
                if all(warm.get(n) for n in names):
                    return True
            except (OSError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _measure(bench: Bench, daemon: Daemon, names: list[str]) -> dict[str, Any]:
    runs = 3 if bench.args.quick else 10
    time.sleep(SETTLE_S)
    out: dict[str, Any] = {"runs": runs, "pss_kib": _pss(daemon)}
    log(f"warm: hand-over and first reply on its pipes, {len(names) + 1} servers, {runs} rounds")
    out["handover"] = _handovers(daemon, [*names, TRIVIAL], runs, PAUSE_S[bench.args.quick])
    out["wake_us"] = idle_wake(bench.tmp / "wake.sock", runs * 3, PAUSE_S[bench.args.quick])
    log(f"warm: `run NAME` to the initialize reply through the SDK, {runs} interleaved rounds")
    out["sdk"] = _sdk(bench, daemon, names, runs)
    log(f"warm: the relay against a fresh spawn's direct pipes, {runs} interleaved rounds")
    # (The SDK's last sessions' replacements start meanwhile, a second of CPU
    # each for npx and uvx ones: a third process on 2 cores pays for that more.)
    daemon.ready(daemon.all, 120)
    time.sleep(PAUSE_S[bench.args.quick])
    out["relay"] = _relay(daemon, runs, 50 if bench.args.quick else 200)
    log(f"warm: the relay as the SDK meets it, {runs} interleaved rounds")
    daemon.ready(daemon.all, 120)
    out["sdk_relay"] = _sdk_relay(bench, daemon, runs, 10 if bench.args.quick else 20)
    log(f"warm: the same, no CPU left idle, {runs} interleaved rounds")
    with _cpus_awake():
        out["sdk_relay_awake"] = _sdk_relay(bench, daemon, runs, 10 if bench.args.quick else 20)
    # Warm servers that failed or were found changed (0: every hand-over was of a sound one);
    # not cat-warm's first one, replaced unused at warm_max_age before the relay's rounds (600 s).
    out["discarded"] = sum("discarded:" in line and "warm_max_age" not in line
                           for line in daemon.log.read_text().splitlines())
    return out


def _pss(daemon: Daemon) -> dict[str, dict[str, int]]:
    """Each warm server's PSS as `list` gives it: the process the supervisor
    started, and its whole session's (npx and uvx start the server as their child)."""
    return {c["manifest"]: {"list": c["pss_kib"], "session": c["session_pss_kib"],
                            "processes": c["session_processes"]}
            for c in daemon.client.list()["children"] if c.get("warm") and "pss_kib" in c}


def _handovers(daemon: Daemon, names: list[str], runs: int, pause: float) -> dict[str, Any]:
    """Per server: the spawn request (from its connect(2)) -> pipe ends in
    hand (the reply's recvmsg(2) returned with them) (ms), the whole
    Client.spawn() call (ms: the client library's own work too, its path
    checks and socket before, the reply's decoding and the Child it makes
    after), and the first initialize reply on the pipes (ms); each with
    every warm server ready and started up, and the supervisor idle for
    `pause` s (as a client finds it)."""
    from supervisor.client import Client
    from supervisor.client.paths import check_length
    marks: dict[str, float] = {}

    class Timed(socket.socket):
        """The client's socket, noting when its first message came (`spawned`, the pipe ends with it)."""

        def recvmsg(self, *args: Any) -> Any:
            got = super().recvmsg(*args)
            marks.setdefault("received", time.perf_counter())
            return got

    def connect() -> socket.socket:
        check_length(daemon.sock)
        sock = Timed(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        marks.clear()
        marks["connect"] = time.perf_counter()
        sock.connect(daemon.sock)
        return sock
    client = Client(connect=connect)
    took: dict[str, dict[str, list[float]]] = {n: {"handover": [], "call": [], "first_reply": []} for n in names}
    for _ in range(runs):
        for name in names:
            daemon.ready(daemon.all, 120)
            time.sleep(pause)
            t0 = time.perf_counter()
            child = client.spawn(name, stdio="pipes")
            t1 = time.perf_counter()
            try:
                assert child.warm and child.stdin and child.stdout, child.not_warm
                os.write(child.stdin.fileno(), json.dumps(INIT).encode() + b"\n")
                _read_reply(child.stdout.fileno(), 60)
                t2 = time.perf_counter()
            finally:
                child.kill()
                child.close()
            took[name]["handover"].append((marks["received"] - marks["connect"]) * 1000)
            took[name]["call"].append((t1 - t0) * 1000)
            took[name]["first_reply"].append((t2 - t1) * 1000)
    return {n: {k: statistics.median(v) for k, v in t.items()} | {"handover_max": max(t["handover"])}
            for n, t in took.items()}


def idle_wake(path: Path, rounds: int, pause: float) -> float:
    """The machine's own share of a hand-over: a process asleep in
    epoll_wait for `pause` s, as the supervisor is when a client comes, woken
    by a connect(2) to its socket: from the connect to the accept, us, median
    (twice on a hand-over's path: the supervisor's wake, then the client's)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    listener.bind(str(path))
    listener.listen(4)
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:   # the sleeper: accept, say when, until killed
        try:
            poller = select.epoll()
            poller.register(listener.fileno(), select.EPOLLIN)
            while True:
                poller.poll()
                at = time.perf_counter()
                listener.accept()[0].close()
                os.write(w, struct.pack("d", at))
        finally:
            os._exit(0)
    took = []
    try:
        for _ in range(rounds):
            time.sleep(pause)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
                t0 = time.perf_counter()
                sock.connect(str(path))
                took.append((struct.unpack("d", os.read(r, 8))[0] - t0) * 1e6)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        for fd in (r, w):
            os.close(fd)
        listener.close()
    return statistics.median(took)


def _sdk(bench: Bench, daemon: Daemon, names: list[str], runs: int) -> dict[str, Any]:
    """The SDK's start -> initialize reply: `run NAME` of each warm example,
    and `run` of the trivial one before each of theirs, every session after
    the same idle (every warm server ready, then PAUSE_S: as _handovers
    times the bound's other term). The bound's first term is then a median
    of runs x len(names) sessions, not of `runs`: on a machine where a
    process's start takes ~30% longer at random (two modes here), one median
    of 10 came out ~4 ms either side of the next run's and moved every
    server's bound with it. Without the wait, a session after a trivial one
    followed more idle than one after an npx server's (its replacement still
    starting): paired, that put ~+2-5 ms on every server's side of the
    comparison (run 22, and an A/B of four servers)."""
    # (A session that found no warm server would take a fresh one's whole start: hundreds of ms.)
    times = _sdk_client(bench, "warm-sdk", {"runs": runs, "timeout": 120, "pause_s": PAUSE_S[bench.args.quick],
                                             "variants": _run_variants(daemon, [TRIVIAL, *names]),
                                             "baseline": TRIVIAL,
                                             "ready": {"argv": [str(SUPERVISOR), "--socket", daemon.sock, "stats"],
                                                       "names": daemon.all}})
    if "error" in times or "skipped" in times:
        return times
    return {n: statistics.median(v) for n, v in times.items()}


def _sdk_relay(bench: Bench, daemon: Daemon, runs: int, calls: int) -> dict[str, Any]:
    """The relay as the official SDK meets it: `calls` tools/call of
    everything's echo with one character and one with 5 MiB, each session's
    own, in sessions through `run everything` (a warm server: relayed) and
    `run everything-fresh` (none: the server on the SDK's own pipes), interleaved."""
    variants = _run_variants(daemon, [RELAY_SERVER, RELAY_SERVER + "-fresh"])
    times = _sdk_client(bench, "warm-sdk-relay", {
        "runs": runs, "timeout": 300, "pause_s": PAUSE_S[bench.args.quick],
        "variants": {"run": variants[RELAY_SERVER], "direct": variants[RELAY_SERVER + "-fresh"]},
        "calls": {"tool": "echo", "argument": "message", "small": calls, "big_bytes": BIG}})
    if "error" in times or "skipped" in times:
        return times
    med = {f"{kind}_{way}_ms": statistics.median(times[way][kind]) for kind in ("small", "big") for way in times}
    return med | {"small_added_ms": med["small_run_ms"] - med["small_direct_ms"],
                  "big_added": med["big_run_ms"] / med["big_direct_ms"] - 1, "calls": calls}


@contextlib.contextmanager
def _cpus_awake() -> Iterator[None]:
    """A spinner at SCHED_IDLE on each CPU while in the block: any task that
    wakes preempts it, so no CPU halts between messages. The relay adds two
    wakes of `run` to each round trip, and where an idle CPU halts (this VM:
    idle_wake), waking it costs more than the relay's own work: measured
    both ways, what the machine adds is told apart from what the relay does."""
    # Each ends with us, killed or not: a spinner left behind would skew whatever runs next.
    spin = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\n" \
           "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n" \
           "parent = int(sys.argv[2])\nwhile os.getppid() == parent:\n    pass\n"
    spinners = [subprocess.Popen([sys.executable, "-I", "-c", spin, str(cpu), str(os.getpid())],
                                 stdin=subprocess.DEVNULL) for cpu in sorted(os.sched_getaffinity(0))]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def _run_variants(daemon: Daemon, names: list[str]) -> dict[str, dict[str, Any]]:
    """sdk_client.py's variants: `run NAME` of each, with the environment the SDK passes by default."""
    return {n: {"command": str(SUPERVISOR), "args": ["--socket", daemon.sock, "run", n], "env": {}} for n in names}


def _sdk_client(bench: Bench, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """sdk_client.py's result for this spec (its doc), or {"error"} or {"skipped"}."""
    if not CLIENT_PYTHON.exists():
        return {"skipped": f"{CLIENT_PYTHON} missing: run scripts/install-clients"}
    path = bench.tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    r = subprocess.run([str(CLIENT_PYTHON), "-I", str(Path(__file__).with_name("sdk_client.py")), str(path)],
                       capture_output=True, text=True, timeout=3600)
    try:
        result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return result
    except (ValueError, IndexError):
        return {"error": f"exit {r.returncode}: {r.stderr[-500:]}"}


def _relay(daemon: Daemon, runs: int, trips: int) -> dict[str, Any]:
    """Per round, each way in turn: `trips` small round trips and one of 5 MiB,
    through `run cat-warm` (the relay), a fresh `cat` on our own pipes as
    pipe(2) makes them (the target's baseline) and on ours widened as `run`
    widens its own (the relay's own cost, pipes alike); each session's first
    round trip not timed, and through `run`, cat-warm's replacement ready
    before the timed ones (its start is not the relay's cost)."""
    ways = ("direct", "wide", "run")
    small: dict[str, list[float]] = {way: [] for way in ways}
    big: dict[str, list[float]] = {way: [] for way in ways}
    payload, echo = os.urandom(BIG), bytearray(BIG)
    for _ in range(runs):
        for way in ways:
            if way == "run":
                daemon.ready(["cat-warm"], 60)
            with _Session(daemon, way) as (w, r):
                _round_trip(w, r, SMALL, echo)   # the session is up (through run: the warm server handed over)
                if way == "run":
                    daemon.ready(["cat-warm"], 60)
                for _ in range(trips):
                    t0 = time.perf_counter()
                    _round_trip(w, r, SMALL, echo)
                    small[way].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                _round_trip(w, r, payload, echo)
                big[way].append((time.perf_counter() - t0) * 1000)
                assert echo == payload, f"{way}: the echo differs from what was sent"
    med = {f"{kind}_{way}_ms": statistics.median(v[way]) for kind, v in (("small", small), ("big", big))
           for way in ways}
    return med | {"small_added_ms": med["small_run_ms"] - med["small_direct_ms"],
                  "big_added": med["big_run_ms"] / med["big_direct_ms"] - 1,
                  "big_own": med["big_run_ms"] / med["big_wide_ms"] - 1, "trips": trips}


class _Session:
    """A cat: `run cat-warm` on pipes of ours, or a fresh cat spawned with
    them (widened for "wide"); our ends non-blocking (_round_trip)."""

    def __init__(self, daemon: Daemon, way: str) -> None:
        self.daemon, self.way = daemon, way

    def __enter__(self) -> tuple[int, int]:
        if self.way == "run":
            self.proc = subprocess.Popen([str(SUPERVISOR), "--socket", self.daemon.sock, "run", "cat-warm"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
                                         env={"PATH": "/usr/bin:/bin"})
            assert self.proc.stdin and self.proc.stdout
            ends = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        else:
            in_r, self.w = os.pipe2(os.O_CLOEXEC)
            self.r, out_w = os.pipe2(os.O_CLOEXEC)
            if self.way == "wide":
                for fd in (self.w, self.r):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, OUR_PIPE_SIZE)
            self.child = self.daemon.client.spawn("cat-fresh", stdin=in_r, stdout=out_w, stderr=2)
            os.close(in_r)
            os.close(out_w)
            ends = self.w, self.r
        for fd in ends:   # (our ends: the other ends are the child's, or run's, own files)
            os.set_blocking(fd, False)
        return ends

    def __exit__(self, *exc: object) -> None:
        if self.way == "run":
            self.proc.communicate(timeout=30)
            return
        os.close(self.w)
        self.child.wait(30)
        self.child.close()
        os.close(self.r)


def _round_trip(w: int, r: int, data: bytes, echo: bytearray) -> None:
    """data written to w (non-blocking) while its echo is read back from r
    into `echo`: with no buffer made on each read, it is the pipes and the
    relay that are timed, not this process (a 1 MiB read's new buffer had
    made it the slowest of the three, its own CPU the round trip)."""
    view, into, got = memoryview(data), memoryview(echo), 0
    while got < len(data):
        ready_r, ready_w, _ = select.select([r], [w] if view else [], [], 60)
        if not ready_r and not ready_w:
            raise TimeoutError("no echo in 60 s")
        if ready_w:
            with contextlib.suppress(BlockingIOError):
                view = view[os.write(w, view[:PIPE_SIZE]):]
        if ready_r:
            try:
                n = os.readv(r, [into[got:len(data)]])
            except BlockingIOError:
                continue
            if not n:
                raise EOFError("the echo ended early")
            got += n


def rows(r: dict[str, Any]) -> list[str]:
    """The report's lines."""
    head = "Warm servers (warm: 1 each; issue 28): ms, medians"
    if "skipped" in r or "error" in r:
        return [head, f"  {r.get('skipped') or 'failed: ' + r['error']}"]
    out = [head + f" of {r['runs']} interleaved rounds; warm servers discarded (failed or changed): {r['discarded']}"]
    sdk, hand = r["sdk"], r["handover"]
    if "error" in sdk or "skipped" in sdk:
        out.append(f"  SDK: {sdk.get('skipped') or sdk['error']}")
        sdk = {}
    own = sdk.get(TRIVIAL)
    out.append(f"  `run` of the trivial warm server (run's own start): {_ms(own)}"
               + (f" ({r['runs'] * (len(hand) - 1)} sessions, one before each server's)" if own is not None else ""))
    if "wake_us" in r:
        out.append(f"  this machine waking a process idle as the supervisor was (connect -> accept): "
                   f"{r['wake_us']:.0f} us, twice in each hand-over")
    out.append(f"  {'server':<18}{'run -> reply':>14}{'own start + first reply + 5':>30}{'hand-over':>11}"
               f"{'(max)':>8}{'call':>7}{'first reply':>13}{'PSS MiB':>9}   (hand-over: connect(2) -> recvmsg(2) of the pipe ends; "
               "call: Client.spawn(); PSS: its session's processes)")
    for name, h in hand.items():
        if name == TRIVIAL:
            continue
        bound = own + h["first_reply"] + 5 if own is not None else None
        verdict = "" if bound is None or name not in sdk else (" PASS" if sdk[name] <= bound else " MISS")
        out.append(f"  {name:<18}{_ms(sdk.get(name)):>14}{_ms(bound):>30}{h['handover']:>11.2f}"
                   f"{h['handover_max']:>8.2f}{h['call']:>7.2f}{h['first_reply']:>13.1f}"
                   f"{r['pss_kib'].get(name, {}).get('session', 0) / 1024:>9.1f}{verdict}")
    sdk_rel = r.get("sdk_relay") or {"skipped": "not measured"}
    if "small_run_ms" in sdk_rel:
        out.append(f"  relay as the SDK meets it ({sdk_rel['calls']} tools/call of {RELAY_SERVER}'s echo a session, "
                   f"call -> result): {_calls(sdk_rel)}")
    else:
        out.append(f"  relay as the SDK meets it: {sdk_rel.get('skipped') or sdk_rel.get('error')}")
    awake = r.get("sdk_relay_awake") or {}
    if "small_run_ms" in awake:
        out.append(f"    the same with no CPU left idle (a SCHED_IDLE spinner each): {_calls(awake)}")
    rel = r["relay"]
    out.append(f"  relay's own cost, a client that only moves bytes ({rel['trips']} small round trips a round to a "
               f"cat): small: direct pipes {rel['small_direct_ms']:.3f}, through run {rel['small_run_ms']:.3f} "
               f"({rel['small_added_ms']:+.3f} ms); 5 MiB: direct {rel['big_direct_ms']:.1f}, through run "
               f"{rel['big_run_ms']:.1f} ({rel['big_added']:+.1%})")
    if "big_wide_ms" in rel:
        out.append(f"    5 MiB, direct pipes widened as run widens its own: {rel['big_wide_ms']:.1f} "
                   f"(through run {rel['big_own']:+.1%})")
    return out


def _calls(f: dict[str, Any]) -> str:
    """_sdk_relay's figures, direct and through `run`."""
    return (f"one character: direct pipes {f['small_direct_ms']:.3f}, through run {f['small_run_ms']:.3f} "
            f"({f['small_added_ms']:+.3f} ms); 5 MiB: direct {f['big_direct_ms']:.1f}, through run "
            f"{f['big_run_ms']:.1f} ({f['big_added']:+.1%})")


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def targets(r: dict[str, Any] | None) -> list[tuple[str, float | None, float, str]]:
    """(name, measured, limit, format) of issue 28's targets: `run` -> reply
    over its bound, the worst example's; the hand-over's worst median; the
    relay's two, as the issue measures them, with the official SDK (None
    where it was not measured)."""
    if not r or "relay" not in r:
        return []
    worst = max(h["handover"] for h in r["handover"].values())
    sdk_rel = r.get("sdk_relay") or {}
    sdk = r.get("sdk") or {}
    own = sdk.get(TRIVIAL)
    over = [sdk[n] - (own + h["first_reply"] + 5) for n, h in r["handover"].items()
            if n != TRIVIAL and n in sdk and own is not None]
    return [("warm: `run` -> initialize reply <= run's own start + first reply + 5 ms, the worst example "
             "(issue 28)", max(over) if over else None, 0.0, "{:+.1f} ms"),
            ("warm: spawn request (connect) -> pipe ends, p50 <= 1 ms (issue 28)", worst, 1.0, "{:.2f} ms"),
            ("warm: relay (SDK), small round trip p50 <= +0.1 ms (issue 28)", sdk_rel.get("small_added_ms"), 0.1,
             "{:+.3f} ms"),
            ("warm: relay (SDK), 5 MiB round trip <= +10% (issue 28)", sdk_rel.get("big_added"), 0.10, "{:+.1%}")]
