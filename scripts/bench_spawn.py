#!/usr/bin/env python3
"""Spawn-latency benchmark: the fork-server against the floor and the alternatives.

    .venv/bin/python scripts/bench_spawn.py [--quick] [--json FILE]

Measures, in one run and from one client process, the time from "request a
spawn" to "exit status known" for /bin/true and for /bin/cat of a small
allowed file (to /dev/null), and reports p50, p99, mean and the ratio of
each to the floor of the same target:

  1. floor: os.posix_spawn + waitpid, unconfined;
  2. the fork-server (a daemon started here on a temporary socket, with a
     realistic manifest) through supervisor.client.Client; request -> pid
     (Client.spawn returning) is reported separately;
  3. the same from this process holding a 1 GiB heap and extra threads;
  4. a naive proxy: subprocess.Popen(preexec_fn=landlock.apply) from that
     same 1 GiB client;
  5. the re-exec wrapper, landlock-exec, with the same rules;
  6. peers when installed: bubblewrap, landrun, nsjail, and the PyPI
     `landlock` package in a wrapper (skipped with the reason otherwise).

Also: throughput with 1, 4 and 16 concurrent client processes; the
supervisor's RSS before and after N spawns; the start-up time of a real MCP
server (initialize reply) through the supervisor against unconfined.

The benchmark is not a test: nothing here asserts a time. The targets of
issue 5 are checked and printed as PASS/MISS for the reader.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
TRUE = "/bin/true"
CAT = "/bin/cat"
NOBODY = "nobody"
AS_ROOT = os.geteuid() == 0
# As root every confined target runs as nobody (a root supervisor wants a
# user); otherwise as whoever runs the benchmark.
USER = {"user": NOBODY} if AS_ROOT else {}
PYPI_VENV = "/tmp/bench-venv"
now_ns = time.perf_counter_ns


# ---- statistics -------------------------------------------------------------

def summarize(samples_ns: list[int]) -> dict[str, Any]:
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    n = len(s)

    def rank(q: float) -> float:
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6

    return {"n": n, "p50_ms": rank(0.50), "p90_ms": rank(0.90), "p99_ms": rank(0.99),
            "mean_ms": sum(s) / n / 1e6, "min_ms": s[0] / 1e6, "max_ms": s[-1] / 1e6}


def _rss_kib(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the environment of the run ---------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-spawn-"))
        os.chmod(self.tmp, 0o755)  # the children run as nobody
        self.data = self.tmp / "data.txt"
        self.data.write_bytes(b"a small file the target may read\n" * 100)
        os.chmod(self.data, 0o644)
        self.rw = self.tmp / "rw"
        self.rw.mkdir(mode=0o777)
        os.chmod(self.rw, 0o777)
        self.mdir = self.tmp / "manifests"
        self.mdir.mkdir()
        self.state = self.tmp / "state"
        self.sock = str(self.tmp / "run" / "socket")
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.fa_null = [(os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, self.devnull, 1),
                        (os.POSIX_SPAWN_DUP2, self.devnull, 2)]
        self.daemon_pid = 0
        self.results: dict[str, Any] = {"latency": {}, "skipped": {}, "notes": []}
        self.targets = {"true": [TRUE], "cat": [CAT, str(self.data)]}

    # ---- manifests and the daemon ----

    def sandbox(self) -> dict[str, Any]:
        """~10 read-only paths (the system profile gives most), one read-write
        path, rlimits, scopes, a TCP port: what a small stdio server gets."""
        return {
            "profiles": ["system"],
            "read_only_noexec": [str(self.data), "/etc/hosts", "/etc/resolv.conf"],
            "read_write_noexec": [str(self.rw)],
            "network": {"connect_tcp": [443]},
            "rlimits": {"NOFILE": 1024, "CORE": 0, "CPU": 600, "DATA": "1GiB"},
            "scopes": ["abstract_unix_socket", "signal"],
        }

    def write_manifests(self) -> None:
        for name, argv in self.targets.items():
            manifest = {"name": name, "command": argv[0], "args": argv[1:], "cwd": str(self.rw),
                        "env": ENV, **USER, "umask": "077", "pool": self.args.pool, "sandbox": self.sandbox()}
            # JSON is YAML.
            (self.mdir / f"{name}.yaml").write_text(json.dumps(manifest, indent=1))
        self.mcp: list[dict[str, Any]] = []
        for m in _mcp_servers(self):
            path = self.mdir / f"{m['name']}.yaml"
            path.write_text(json.dumps(m["manifest"], indent=1))
            try:
                self.load_spec(m["name"])
                self.mcp.append(m)
            except Exception as e:  # noqa: BLE001 - reported, and kept out of the supervisor
                path.unlink()
                self.results["skipped"][m["name"]] = f"its manifest does not load: {e}"

    def load_spec(self, name: str):
        from supervisor import manifest as manifests
        return manifests.load(self.mdir / f"{name}.yaml", state_root=str(self.state))

    def start_daemon(self) -> None:
        from supervisor.client import Client
        logf = os.open(self.tmp / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        argv = [sys.executable, "-m", "supervisor", "--socket", self.sock, "serve",
                "--manifests", str(self.mdir), "--state-root", str(self.state)]
        self.daemon_pid = os.posix_spawn(sys.executable, argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, logf, 1),
            (os.POSIX_SPAWN_DUP2, logf, 2)])
        os.close(logf)
        self.client = Client(self.sock)
        deadline = time.monotonic() + 15
        while True:
            try:
                self.client.ping()
                break
            except (OSError, TimeoutError):
                if time.monotonic() > deadline or os.waitpid(self.daemon_pid, os.WNOHANG)[0]:
                    raise SystemExit("bench: the supervisor did not start:\n"
                                     + (self.tmp / "supervisor.log").read_text()[-3000:])
                time.sleep(0.02)
        self.results["supervisor_rss_kib_fresh"] = _rss_kib(self.daemon_pid)

    def stop_daemon(self) -> None:
        if self.daemon_pid:
            try:
                os.kill(self.daemon_pid, signal.SIGTERM)
                os.waitpid(self.daemon_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.daemon_pid = 0

    # ---- the methods: each returns a function running one spawn ----

    def m_floor(self, target: str) -> Callable[[], tuple[int, int | None]]:
        argv = self.targets[target]
        return self._spawn_wait(f"floor {target}", argv[0], argv, ENV)

    def m_forkserver(self, target: str) -> Callable[[], tuple[int, int | None]]:
        client, dn = self.client, self.devnull

        def run() -> tuple[int, int | None]:
            t0 = now_ns()
            child = client.spawn(target, stdin=dn, stdout=dn, stderr=dn)
            t1 = now_ns()
            rc = child.wait(30)
            t2 = now_ns()
            child.close()
            if rc != 0:
                raise RuntimeError(f"fork-server {target}: exit {child.exited}")
            return t2 - t0, t1 - t0
        return run

    def _spawn_wait(self, label: str, program: str, argv: list[str], env: dict[str, str]
                    ) -> Callable[[], tuple[int, int | None]]:
        fa = self.fa_null

        def run() -> tuple[int, int | None]:
            t0 = now_ns()
            pid = os.posix_spawn(program, argv, env, file_actions=fa)
            _, status = os.waitpid(pid, 0)
            t1 = now_ns()
            if status != 0:
                raise RuntimeError(f"{label}: {argv[:3]}...: exit status {os.waitstatus_to_exitcode(status)}")
            return t1 - t0, None
        return run

    def m_landlock_exec(self, target: str) -> Callable[[], tuple[int, int | None]]:
        """The seed's model: a re-exec wrapper given the spec in its environment."""
        from landlock.gocompat import ENV_NATIVE_SPEC
        spec = self.load_spec(target).spec
        wrapper = Path(sys.executable).parent / "landlock-exec"
        if wrapper.exists():
            program, prefix = str(wrapper), [str(wrapper)]
        else:
            program, prefix = sys.executable, [sys.executable, "-m", "landlock"]
        env = dict(ENV, PYTHONPATH=str(REPO), **{ENV_NATIVE_SPEC: spec.to_json()})
        return self._spawn_wait("landlock-exec", program, [*prefix, "--", *self.targets[target]], env)

    def m_preexec(self, target: str) -> Callable[[], tuple[int, int | None]]:
        import subprocess

        import landlock
        spec = self.load_spec(target).spec
        argv, dn = self.targets[target], self.devnull

        def confine() -> None:
            landlock.apply(spec)

        def run() -> tuple[int, int | None]:
            t0 = now_ns()
            p = subprocess.Popen(argv, env=ENV, stdin=dn, stdout=dn, stderr=dn, cwd=str(self.rw),
                                 preexec_fn=confine, start_new_session=True)
            rc = p.wait()
            t1 = now_ns()
            if rc != 0:
                raise RuntimeError(f"preexec_fn {target}: exit {rc}")
            return t1 - t0, None
        return run

    def bwrap_argv(self) -> list[str] | str:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            return "not installed (apt-get install bubblewrap)"
        pw = __import__("pwd").getpwnam(NOBODY)
        as_nobody = ["--uid", str(pw.pw_uid), "--gid", str(pw.pw_gid), "--cap-drop", "ALL"] if AS_ROOT else []
        argv = [bwrap, "--ro-bind", "/", "/", "--bind", str(self.rw), str(self.rw), "--dev", "/dev",
                "--unshare-all", "--die-with-parent", "--new-session", *as_nobody, "--"]
        import subprocess
        r = subprocess.run([*argv, TRUE], env=ENV, capture_output=True, timeout=30)
        if r.returncode != 0:
            return f"fails here: {argv} exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
        return argv

    def m_bwrap(self, target: str, prefix: list[str]) -> Callable[[], tuple[int, int | None]]:
        return self._spawn_wait("bwrap", prefix[0], [*prefix, *self.targets[target]], ENV)

    def pypi_wrapper(self) -> tuple[str, Path] | str:
        python = Path(self.args.pypi_venv) / "bin" / "python"
        if not python.exists():
            return (f"no venv at {self.args.pypi_venv} (python3 -m venv {self.args.pypi_venv} && "
                    f"{self.args.pypi_venv}/bin/pip install landlock)")
        import subprocess
        r = subprocess.run([str(python), "-c", "import landlock, sys; landlock.Ruleset; "
                            "print(getattr(landlock, '__version__', '?'))"],
                           cwd="/", capture_output=True, env=ENV, timeout=30)
        if r.returncode != 0:
            return f"the PyPI landlock package is not importable in {python}: {r.stderr.decode()[-300:]}"
        self.results["pypi_landlock_version"] = r.stdout.decode().strip()
        script = self.tmp / "pypi_landlock_wrap.py"
        script.write_text(PYPI_WRAPPER)
        return str(python), script

    def m_pypi(self, target: str, wrapper: tuple[str, Path]) -> Callable[[], tuple[int, int | None]]:
        spec = self.load_spec(target).spec
        python, script = wrapper
        pw = __import__("pwd").getpwnam(NOBODY) if AS_ROOT else __import__("pwd").getpwuid(os.getuid())
        rules = {"rx": [*spec.read_only], "r": [*spec.read_only_noexec],
                 "rwx": [*spec.read_write], "rw": [*spec.read_write_noexec],
                 "rlimits": [[r.resource, r.soft, r.hard] for r in spec.rlimits],
                 "uid": pw.pw_uid, "gid": pw.pw_gid}
        env = dict(ENV, BENCH_LANDLOCK_RULES=json.dumps(rules))
        return self._spawn_wait("pypi landlock", python, [python, str(script), *self.targets[target]], env)


PYPI_WRAPPER = r'''
"""A wrapper a proxy author might write with the PyPI `landlock` package:
the same path rules as the manifest, rlimits, the uid drop, then exec.
(That package handles filesystem rights only: no network rules, no scopes.)"""
import json, os, resource, sys
from landlock import FSAccess, Ruleset

rules = json.loads(os.environ.pop("BENCH_LANDLOCK_RULES"))
R = FSAccess.READ_FILE | FSAccess.READ_DIR
RX = R | FSAccess.EXECUTE
RW = FSAccess.all() & ~FSAccess.EXECUTE
RWX = FSAccess.all()
FILE = FSAccess.all_file()
rs = Ruleset()
for key, access in (("rx", RX), ("r", R), ("rwx", RWX), ("rw", RW)):
    for path in rules[key]:
        if not os.path.exists(path):
            continue
        rs.allow(path, rules=access if os.path.isdir(path) else access & FILE)
for res, soft, hard in rules["rlimits"]:
    resource.setrlimit(res, (soft, hard))
os.setsid()
if os.geteuid() == 0:
    os.setgroups([])
os.setresgid(rules["gid"], rules["gid"], rules["gid"])
os.setresuid(rules["uid"], rules["uid"], rules["uid"])
rs.apply()
os.execve(sys.argv[1], sys.argv[1:], os.environ)
'''


# ---- running methods, interleaved -------------------------------------------

class Method:
    def __init__(self, key: str, label: str, run: Callable[[], tuple[int, int | None]],
                 n: int, budget_s: float) -> None:
        self.key, self.label, self.run = key, label, run
        self.n, self.budget_s = n, budget_s
        self.total: list[int] = []
        self.to_pid: list[int] = []
        self.spent = 0.0
        self.cpu = [0.0, 0.0, 0.0, 0.0]  # seconds: this client, its reaped children, supervisor, its children

    def cpu_per_spawn(self) -> dict[str, float]:
        n = max(1, len(self.total))
        names = ("client", "client_children", "supervisor", "supervisor_children")
        out = {k: 1000 * v / n for k, v in zip(names, self.cpu)}
        out["total"] = sum(out.values())
        return out


def _proc_cpu(pid: int | str) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _cpu_sample(server_pid: int) -> list[float]:
    """CPU seconds so far: ours, our reaped children's, the supervisor's and its reaped children's.
    The supervisor's live Python children (a helper process such as a forking
    zygote, never a confined child: those exec) count as the supervisor."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = [me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, 0.0, 0.0]
    if server_pid:
        out[2], out[3] = _proc_cpu(server_pid)
        try:
            with open(f"/proc/{server_pid}/task/{server_pid}/children") as f:
                helpers = f.read().split()
        except OSError:
            helpers = []
        for pid in helpers:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if not f.read().startswith("python"):
                        continue
            except OSError:
                continue
            own, reaped = _proc_cpu(pid)
            out[2] += own
            out[3] += reaped
    return out


def run_interleaved(methods: list[Method], rounds: int, warmup: int, server_pid: int = 0) -> None:
    """Each round runs a slice of every method in turn, so that drift in the
    machine's state (other work on a shared machine) spreads over all of them
    alike. CPU time is counted per method too: it is far less sensitive to
    the machine's load than the latency is."""
    for m in methods:
        for _ in range(min(warmup, max(2, m.n // 20))):
            m.run()
    for r in range(rounds):
        for m in methods:
            want = (m.n * (r + 1)) // rounds - len(m.total)
            budget = m.budget_s * (r + 1) / rounds
            c0 = _cpu_sample(server_pid)
            t0 = time.monotonic()
            for _ in range(want):
                if m.spent + (time.monotonic() - t0) > budget and len(m.total) >= 20:
                    break
                total, to_pid = m.run()
                m.total.append(total)
                if to_pid is not None:
                    m.to_pid.append(to_pid)
            m.spent += time.monotonic() - t0
            c1 = _cpu_sample(server_pid)
            m.cpu = [a + (y - x) for a, x, y in zip(m.cpu, c0, c1)]


# ---- the big client ---------------------------------------------------------

class BigHeap:
    """~1 GiB of small objects, every page touched, and a few threads that
    wake up often to do a little work, as a proxy's I/O threads do."""

    def __init__(self, mib: int, threads: int, busy: int) -> None:
        import threading
        self.threading = threading
        self.objects: list[Any] = []
        self.base_kib = _rss_kib()
        self.grow(mib)
        self.stop = False
        self.threads = []
        for i in range(threads):
            interval = (0.001, 0.005, 0.02, 0.1)[i % 4]
            t = threading.Thread(target=self._sleeper, args=(interval,), daemon=True)
            t.start()
            self.threads.append(t)
        for _ in range(busy):
            t = threading.Thread(target=self._busy, daemon=True)
            t.start()
            self.threads.append(t)
        self.thread_count = len(os.listdir("/proc/self/task"))

    def grow(self, mib: int) -> None:
        """Until this process holds mib MiB more than it did at the start."""
        target_kib = self.base_kib + mib * 1024
        chunk = 16384
        while _rss_kib() < target_kib:
            # bytes of ~1 KiB (malloc'd, 4 KiB pages: THP is madvise-only here)
            # and a dict every 16 objects, as a proxy's request state would be.
            block = [bytes(1000) for _ in range(chunk)]
            block += [{"id": i, "name": f"r{i}"} for i in range(chunk // 16)]
            self.objects.append(block)
        self.rss_kib = _rss_kib()

    def _sleeper(self, interval: float) -> None:
        state: dict[int, int] = {}
        i = 0
        while not self.stop:
            time.sleep(interval)
            i += 1
            state[i % 64] = i

    def _busy(self) -> None:
        x = 0
        while not self.stop:
            x += 1

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join()
        self.objects.clear()


# ---- throughput workers -----------------------------------------------------

def worker_main(args: argparse.Namespace) -> int:
    """A client process: spawn and wait in a loop between two instants."""
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    if args.worker == "forkserver":
        from supervisor.client import Client
        client = Client(args.socket)

        def once() -> None:
            child = client.spawn(args.manifest, stdin=devnull, stdout=devnull, stderr=devnull)
            if child.wait(30) != 0:
                raise RuntimeError(f"exit {child.exited}")
            child.close()
    else:
        fa = [(os.POSIX_SPAWN_DUP2, devnull, i) for i in range(3)]

        def once() -> None:
            pid = os.posix_spawn(TRUE, [TRUE], ENV, file_actions=fa)
            if os.waitpid(pid, 0)[1] != 0:
                raise RuntimeError("floor: /bin/true failed")
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


def throughput(bench: Bench, kind: str, clients: int, duration: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = []
    for _ in range(clients):
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        pid = os.posix_spawn(sys.executable, [sys.executable, str(Path(__file__).resolve()), "--worker", kind,
                                              "--socket", bench.sock, "--manifest", "true"], env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1),
                                           (os.POSIX_SPAWN_CLOSE, w_in), (os.POSIX_SPAWN_CLOSE, r_out)])
        os.close(r_in)
        os.close(w_out)
        procs.append((pid, os.fdopen(w_in, "w"), os.fdopen(r_out, "r")))
    for _, _, out in procs:
        if out.readline().strip() != "ready":
            raise RuntimeError(f"throughput worker ({kind}) failed to start")
    c0 = _cpu_sample(bench.daemon_pid)
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
    c1 = _cpu_sample(bench.daemon_pid)
    total = sum(r["count"] for r in reports)
    p50s = sorted(r.get("p50_ms", 0) for r in reports)
    return {"clients": clients, "duration_s": duration, "spawns": total,
            "spawns_per_s": total / duration, "per_client_p50_ms_median": p50s[len(p50s) // 2],
            "supervisor_cpu_ms_per_spawn": 1000 * (c1[2] - c0[2]) / max(1, total) if kind == "forkserver" else None}


# ---- MCP start-up -----------------------------------------------------------

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                   "clientInfo": {"name": "bench_spawn", "version": "1"}}}

ECHO_SERVER = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "serverInfo": {"name": "echo", "version": "0"}}}), flush=True)
'''


def _mcp_servers(bench: Bench) -> list[dict[str, Any]]:
    servers_dir = Path(bench.args.servers_dir)
    out = []
    time_bin = servers_dir / "venv" / "bin" / "mcp-server-time"
    node = shutil.which("node")
    fs_js = servers_dir / "node" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
    base = {"cwd": str(bench.rw), **USER, "umask": "077"}
    if time_bin.exists():
        out.append({"name": "mcp-time", "label": "mcp-server-time (Python)", "real": True, "manifest": {
            **base, "name": "mcp-time", "command": str(time_bin), "args": ["--local-timezone", "UTC"],
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            "sandbox": {"profiles": ["system", "python"], "read_write_noexec": [str(bench.rw)],
                        "rlimits": {"NOFILE": 1024, "CORE": 0}}}})
    if node and fs_js.exists():
        out.append({"name": "mcp-fs", "label": "server-filesystem (Node)", "real": True, "manifest": {
            **base, "name": "mcp-fs", "command": node, "args": [str(fs_js), str(bench.rw)],
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            "sandbox": {"profiles": ["system", "node"], "read_only_noexec": [str(servers_dir / "node")],
                        "read_write_noexec": [str(bench.rw)], "rlimits": {"NOFILE": 1024, "CORE": 0}}}})
    if not out:
        script = bench.tmp / "echo_server.py"
        script.write_text(ECHO_SERVER)
        os.chmod(script, 0o644)
        out.append({"name": "mcp-echo", "label": "tiny Python echo server (no real server installed)",
                    "real": False, "manifest": {
                        **base, "name": "mcp-echo", "command": "/usr/bin/python3", "args": ["-I", str(script)],
                        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                        "sandbox": {"profiles": ["system"], "read_only": ["/usr/lib/python3.11"],
                                    "read_only_noexec": [str(script)], "read_write_noexec": [str(bench.rw)]}}})
    return out


def _read_reply(fd: int, timeout: float) -> dict[str, Any]:
    import select
    buf = b""
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == 1:
                return msg
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no initialize reply")
        data = os.read(fd, 65536)
        if not data:
            raise EOFError("the server closed its stdout before replying")
        buf += data


def mcp_once(bench: Bench, server: dict[str, Any], confined: bool) -> float:
    m = bench.load_spec(server["name"])
    r_in, w_in = os.pipe2(os.O_CLOEXEC)
    r_out, w_out = os.pipe2(os.O_CLOEXEC)
    request = (json.dumps(INIT) + "\n").encode()
    child = pid = None
    try:
        t0 = now_ns()
        if confined:
            child = bench.client.spawn(server["name"], stdin=r_in, stdout=w_out, stderr=bench.devnull)
        else:
            # Unconfined, but as the same user, with the same argv, env and cwd.
            pw = __import__("pwd").getpwnam(NOBODY) if AS_ROOT else __import__("pwd").getpwuid(os.getuid())
            pid = _spawn_as(m.command, [m.command, *m.args], m.environment(os.environ), m.cwd, r_in, w_out,
                            bench.devnull, pw.pw_uid, pw.pw_gid)
        os.close(r_in)
        os.close(w_out)
        r_in = w_out = -1
        os.write(w_in, request)
        reply = _read_reply(r_out, 30)
        t1 = now_ns()
        if "result" not in reply:
            raise RuntimeError(f"{server['name']}: initialize failed: {reply}")
        return (t1 - t0) / 1e6
    finally:
        for fd in (r_in, w_out, w_in):
            if fd >= 0:
                os.close(fd)
        if child is not None:
            try:
                child.wait(5)
            except TimeoutError:
                child.kill()
            child.close()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        os.close(r_out)


def _spawn_as(program: str, argv: list[str], env: dict[str, str], cwd: str, stdin: int, stdout: int,
              stderr: int, uid: int, gid: int) -> int:
    """Unconfined reference launch as the manifest's user: a tiny fork+exec
    (the launch method costs nothing next to a server's start-up)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.geteuid() != 0:
                uid, gid = os.getuid(), os.getgid()
            for target, fd in enumerate((stdin, stdout, stderr)):
                os.dup2(fd, target)
            os.chdir(cwd)
            if os.geteuid() == 0:
                os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(program, argv, env)
        finally:
            os._exit(127)
    return pid


# ---- the report -------------------------------------------------------------

def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def build_report(bench: Bench, methods_by_phase: dict[str, list[Method]]) -> None:
    lat = bench.results["latency"]
    for phase, methods in methods_by_phase.items():
        for m in methods:
            entry = {"label": m.label, "phase": phase, **summarize(m.total), "cpu_ms_per_spawn": m.cpu_per_spawn()}
            if m.to_pid:
                entry["to_pid"] = summarize(m.to_pid)
            lat[m.key] = entry
    for key, entry in lat.items():
        target = key.split(":")[-1]
        floor = lat.get(f"floor:{target}") or lat.get(f"floor_big:{target}")
        if floor and entry.get("n") and floor.get("n"):
            entry["x_floor"] = {q: entry[f"{q}_ms"] / floor[f"{q}_ms"] for q in ("p50", "p99", "mean")}
            entry["p99_x_floor_p50"] = entry["p99_ms"] / floor["p50_ms"]
            if "to_pid" in entry:
                entry["to_pid"]["x_floor"] = {q: entry["to_pid"][f"{q}_ms"] / floor[f"{q}_ms"]
                                              for q in ("p50", "p99", "mean")}


def print_table(bench: Bench) -> None:
    res = bench.results
    lat = res["latency"]
    out = []
    w = out.append
    w("")
    mach = res["machine"]
    w(f"Spawn latency: request -> exit status known, ms  ({mach['cpus']} CPUs, "
      f"Linux {mach['kernel']}, Landlock ABI {mach.get('landlock_abi')}, Python {mach['python']}, "
      f"{'--quick' if bench.quick else 'full'} run, {mach.get('sched')}, nice {mach.get('nice')}, load average "
      f"{' '.join(mach.get('loadavg_start', []))} at the start, {' '.join(mach.get('loadavg_end', []))} at the end; "
      f"benchmark manifests with pool: {bench.args.pool})")
    if float(mach.get("loadavg_end", ["0"])[0]) > 0.5 * (mach["cpus"] or 1):
        w("  note: the machine was busy with other work" + (
            " (this run was SCHED_FIFO, ahead of it, but it still shares caches and memory bandwidth)"
            if mach.get("sched", "").startswith("SCHED_FIFO") else
            ": absolute times are inflated; the ratios, from interleaved rounds, hold better, and CPU per "
            "spawn best (or use --rt)"))
    w(f"{'':2}{'method':<52}{'n':>6}{'p50':>8}{'p99':>8}{'mean':>8}   x floor p50/p99/mean   CPU ms/spawn")
    order = ["floor", "forkserver", "forkserver_big", "floor_big", "preexec_big", "landlock_exec",
             "bwrap", "pypi_landlock", "landrun", "nsjail"]
    for target in ("true", "cat"):
        w(f"  target: {' '.join(bench.targets[target]).replace(str(bench.tmp), '$TMP')}")
        for base in order:
            key = f"{base}:{target}"
            e = lat.get(key)
            if e is None:
                reason = res["skipped"].get(base)
                if reason:
                    w(f"    {base:<50}  skipped: {reason}")
                continue
            xs = e.get("x_floor", {})
            c = e["cpu_ms_per_spawn"]
            w(f"    {e['label']:<50}{e['n']:>6}{e['p50_ms']:>8.3f}{e['p99_ms']:>8.3f}{e['mean_ms']:>8.3f}   "
              f"{fmt(xs.get('p50')):>5} / {fmt(xs.get('p99')):>5} / {fmt(xs.get('mean')):>5}   "
              f"{c['total']:.2f} (supervisor {c['supervisor']:.2f})")
            if "to_pid" in e:
                p, px = e["to_pid"], e["to_pid"].get("x_floor", {})
                w(f"      {'request -> pid (Client.spawn returns)':<48}{p['n']:>6}{p['p50_ms']:>8.3f}"
                  f"{p['p99_ms']:>8.3f}{p['mean_ms']:>8.3f}   {fmt(px.get('p50')):>5} / {fmt(px.get('p99')):>5} / "
                  f"{fmt(px.get('mean')):>5}")
    if res.get("big_client"):
        b = res["big_client"]
        w(f"  big client: RSS {b['rss_kib'] / 1024:.0f} MiB, {b['threads']} threads "
          f"({b['sleeping_threads']} sleeping, {b['busy_threads']} busy)")
    for base, reason in res["skipped"].items():
        if not any(k.startswith(base + ":") for k in lat) and base not in order:
            w(f"  {base}: skipped: {reason}")
    if res.get("heap_sweep"):
        w("")
        w("Cost against the client's heap (/bin/true, p50 ms; the client has its threads throughout)")
        w(f"  {'client RSS':<12}{'floor':>10}{'fork-server':>14}{'preexec_fn':>14}")
        for pnt in res["heap_sweep"]:
            w(f"  {pnt['rss_kib'] // 1024:>6} MiB  {pnt['floor']['p50_ms']:>10.3f}{pnt['forkserver']['p50_ms']:>14.3f}"
              f"{pnt['preexec']['p50_ms']:>14.3f}")
    if res.get("throughput"):
        w("")
        w("Throughput: spawns/s of /bin/true, N client processes each spawning and waiting in a loop")
        w(f"  {'clients':<10}{'floor (posix_spawn)':>22}{'fork-server':>14}{'fork-server p50 ms':>22}"
          f"{'supervisor CPU ms/spawn':>26}")
        for n in sorted({t["clients"] for t in res["throughput"].values()}):
            f = res["throughput"].get(f"floor:{n}", {})
            s = res["throughput"].get(f"forkserver:{n}", {})
            w(f"  {n:<10}{fmt(f.get('spawns_per_s'), 0):>22}{fmt(s.get('spawns_per_s'), 0):>14}"
              f"{fmt(s.get('per_client_p50_ms_median'), 3):>22}{fmt(s.get('supervisor_cpu_ms_per_spawn'), 3):>26}")
    if res.get("rss"):
        r = res["rss"]
        w("")
        w(f"Supervisor RSS: fresh {r['fresh_kib'] / 1024:.1f} MiB, after warm-up {r['before_kib'] / 1024:.1f} MiB, "
          f"after {r['spawns']} more spawns {r['after_kib'] / 1024:.1f} MiB "
          f"(growth {r['growth_kib']:+d} KiB), {r['settle_s']:.0f} s later {r['settled_kib'] / 1024:.1f} MiB; "
          f"at the end of the run {r.get('end_kib', 0) / 1024:.1f} MiB; "
          f"samples every {r['every']}: {', '.join(str(x) for x in r['samples_kib'])} KiB")
    if res.get("mcp"):
        w("")
        w("MCP server start-up: spawn -> initialize reply, ms (median of runs; min)")
        for name, e in res["mcp"].items():
            if "error" in e:
                w(f"  {e['label']:<44} failed: {e['error']}")
                continue
            w(f"  {e['label']:<44} unconfined {e['unconfined_p50_ms']:.1f} ({e['unconfined_min_ms']:.1f})"
              f"   via supervisor {e['confined_p50_ms']:.1f} ({e['confined_min_ms']:.1f})"
              f"   added {e['added_p50_ms']:+.1f} ms ({e['added_pct']:+.1f}%), {e['runs']} runs each")
    if res.get("targets"):
        w("")
        w("Issue 5 targets")
        for t in res["targets"]:
            w(f"  [{t['verdict']:>4}] {t['name']:<58} {t['value']}")
    for note in res["notes"]:
        w(f"  note: {note}")
    print("\n".join(out), flush=True)


def check_targets(bench: Bench) -> None:
    lat = bench.results["latency"]
    out = []

    def add(name: str, value: float | None, limit: float, fmt_: str, better: str = "le") -> None:
        if value is None:
            out.append({"name": name, "verdict": "n/a", "value": "not measured", "limit": limit})
            return
        ok = value <= limit if better == "le" else value >= limit
        out.append({"name": name, "verdict": "PASS" if ok else "MISS", "value": fmt_.format(value),
                    "measured": value, "limit": limit})

    def get(key: str, *path: str) -> float | None:
        e: Any = lat.get(key)
        for p in path:
            if not isinstance(e, dict) or p not in e:
                return None
            e = e[p]
        return e

    for t in ("true", "cat"):
        add(f"{t}: fork-server p50 <= 2.5x floor (aim 2.0x)", get(f"forkserver:{t}", "x_floor", "p50"), 2.5,
            "{:.2f}x")
        add(f"{t}: fork-server p99 <= 4x floor p99", get(f"forkserver:{t}", "x_floor", "p99"), 4, "{:.2f}x")
        add(f"{t}: fork-server p99 <= 4x floor p50", get(f"forkserver:{t}", "p99_x_floor_p50"), 4, "{:.2f}x")
        add(f"{t}: request -> pid p50 <= 1.5x floor", get(f"forkserver:{t}", "to_pid", "x_floor", "p50"), 1.5,
            "{:.2f}x")
        fs = get(f"forkserver:{t}", "p50_ms")
        for peer, limit in (("bwrap", 2.5), ("landlock_exec", 6)):
            other = get(f"{peer}:{t}", "p50_ms")
            add(f"{t}: >= {limit}x faster than {peer} (p50)", other / fs if other and fs else None, limit,
                "{:.1f}x", "ge")
        big = get(f"forkserver_big:{t}", "p50_ms")
        add(f"{t}: 1 GiB threaded client no more than 10% slower (p50)", big / fs - 1 if big and fs else None,
            0.10, "{:+.1%}")
        # The phases run one after the other: each against its own floor too
        # (posix_spawn does not care about the client's heap), for the reader.
        fl, fl_big = get(f"floor:{t}", "p50_ms"), get(f"floor_big:{t}", "p50_ms")
        if big and fs and fl and fl_big:
            bench.results["latency"][f"forkserver_big:{t}"]["vs_small_each_over_its_floor"] = \
                (big / fl_big) / (fs / fl) - 1
        pre = get(f"preexec_big:{t}", "p50_ms")
        add(f"{t}: >= 15x faster than preexec_fn from the 1 GiB client", pre / big if pre and big else None, 15,
            "{:.1f}x", "ge")
    tp = bench.results.get("throughput", {}).get("forkserver:4", {}).get("spawns_per_s")
    add(">= 1000 spawns/s with 4 clients", tp, 1000, "{:.0f}/s", "ge")
    rss = bench.results.get("rss")
    add("supervisor RSS < 25 MiB", rss and max(rss["after_kib"], rss.get("end_kib", 0)) / 1024, 25, "{:.1f} MiB")
    add(f"no RSS growth after {rss['spawns'] if rss else '?'} spawns (<= 256 KiB once settled)",
        rss and rss["settled_kib"] - rss["before_kib"], 256, "{:+d} KiB")
    bench.results["targets"] = out


# ---- main -------------------------------------------------------------------

def counts(quick: bool, fast: bool, slow_budget: float) -> tuple[int, float]:
    if fast:
        return (300, 20.0) if quick else (5000, 120.0)
    return (100, min(slow_budget, 3.0)) if quick else (2000, slow_budget)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="about one minute: a few hundred spawns each")
    p.add_argument("--json", metavar="FILE", help="write every figure here")
    p.add_argument("--spawns", type=int, help="spawns per fast method (default 5000, --quick 300)")
    p.add_argument("--rss-spawns", type=int, help="spawns between the RSS readings (default 10000, --quick 2000)")
    p.add_argument("--heap-mib", type=int, default=1024)
    p.add_argument("--threads", type=int, default=4, help="sleeping threads in the big client")
    p.add_argument("--busy-threads", type=int, default=0, help="busy-looping threads in the big client")
    p.add_argument("--sections", default="latency,big,throughput,rss,mcp",
                   help="comma-separated subset of latency,big,throughput,rss,mcp")
    p.add_argument("--pypi-venv", default=PYPI_VENV, help="a venv with the PyPI landlock package")
    p.add_argument("--servers-dir", default=str(REPO / ".servers"), help="scripts/install-servers' directory")
    p.add_argument("--pool", type=int, default=4, help="the benchmark manifests' pool: children the zygote "
                   "keeps forked and confined (0: each spawn forks)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--no-peers", action="store_true", help="skip landlock-exec, bubblewrap and the PyPI wrapper")
    p.add_argument("--rt", action="store_true", help="run everything (supervisor, children, peers) as SCHED_FIFO "
                   "priority 1 (root): on a machine shared with other work, as if it were idle; recorded")
    p.add_argument("--nice", type=int, help="run at this nice value (as root, -20 shields the run a little "
                   "from other work on a shared machine; recorded in the output)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--manifest", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args)
    sections = set(args.sections.split(","))
    bench = Bench(args)
    t_start = time.monotonic()
    res = bench.results
    res["machine"] = {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                      "executable": sys.executable, "repo": str(REPO),
                      "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()}
    res["mode"] = "quick" if args.quick else "full"
    if args.nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # inherited by the supervisor and every child
    if args.rt:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # likewise inherited
    res["machine"]["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    res["machine"]["sched"] = "SCHED_FIFO 1" if os.sched_getscheduler(0) == os.SCHED_FIFO else "SCHED_OTHER"
    res["machine"]["loadavg_start"] = Path("/proc/loadavg").read_text().split()[:3]
    try:
        import landlock
        res["machine"]["landlock_abi"] = landlock.abi_version()
        bench.write_manifests()
        spec = bench.load_spec("true").spec
        res["manifest"] = {"path_rules": len(spec.path_rules),
                           "read_only": len(spec.read_only) + len(spec.read_only_noexec),
                           "read_write": len(spec.read_write) + len(spec.read_write_noexec),
                           "rlimits": [r.name for r in spec.rlimits], "scopes": list(spec.scopes),
                           "connect_tcp": list(spec.connect_tcp), "user": spec.user, "profiles": ["system"]}
        log(f"manifests in {bench.mdir}; starting the supervisor on {bench.sock}")
        bench.start_daemon()
        n_fast, budget_fast = counts(args.quick, True, 0)
        if args.spawns:
            n_fast = args.spawns
        rounds = 5 if args.quick else 10
        phases: dict[str, list[Method]] = {}

        def floor_and_forkserver(t: str, suffix: str, floor_label: str, forkserver_label: str) -> list[Method]:
            """The two fast methods every phase compares, for target t."""
            return [Method(f"floor{suffix}:{t}", floor_label, bench.m_floor(t), n_fast, budget_fast),
                    Method(f"forkserver{suffix}:{t}", forkserver_label, bench.m_forkserver(t), n_fast, budget_fast)]

        if "latency" in sections:
            methods = []
            for t in ("true", "cat"):
                methods += floor_and_forkserver(t, "", "1 floor: posix_spawn + waitpid, unconfined",
                                                "2 fork-server: Client.spawn + wait, confined")
                if not args.no_peers:
                    n, b = counts(args.quick, False, 40.0)
                    methods.append(Method(f"landlock_exec:{t}", "5 re-exec wrapper: landlock-exec, same spec",
                                          bench.m_landlock_exec(t), n, b))
            bw = bench.bwrap_argv() if not args.no_peers else "not run (--no-peers)"
            if isinstance(bw, str):
                res["skipped"]["bwrap"] = bw
            else:
                res["bwrap_argv"] = bw
                for t in ("true", "cat"):
                    n, b = counts(args.quick, False, 30.0)
                    methods.append(Method(f"bwrap:{t}", "6 bubblewrap --ro-bind / / --unshare-all ...",
                                          bench.m_bwrap(t, bw), n, b))
            pw = bench.pypi_wrapper() if not args.no_peers else "not run (--no-peers)"
            if isinstance(pw, str):
                res["skipped"]["pypi_landlock"] = pw
            else:
                for t in ("true", "cat"):
                    n, b = counts(args.quick, False, 40.0)
                    methods.append(Method(f"pypi_landlock:{t}",
                                          f"6 PyPI landlock {res['pypi_landlock_version']} in a wrapper",
                                          bench.m_pypi(t, pw), n, b))
            for peer, why in (("landrun", "not on PATH: a Go program, packaged by neither Debian 12 "
                               "nor PyPI nor npm (the registries this machine reaches)"),
                              ("nsjail", "not on PATH: not packaged by Debian 12")):
                if shutil.which(peer):
                    res["skipped"][peer] = f"installed at {shutil.which(peer)} but not wired into this benchmark"
                else:
                    res["skipped"][peer] = why
            log(f"latency, small client: {len(methods)} methods, {rounds} interleaved rounds")
            run_interleaved(methods, rounds, warmup=50, server_pid=bench.daemon_pid)
            phases["small"] = methods

        if "rss" in sections:
            n_rss = args.rss_spawns or (2000 if args.quick else 10000)
            log(f"supervisor RSS over {n_rss} spawns")
            run = bench.m_forkserver("true")
            for _ in range(200):
                run()
            before = _rss_kib(bench.daemon_pid)
            every = max(1, n_rss // 10)
            samples = [before]
            for i in range(1, n_rss + 1):
                run()
                if i % every == 0:
                    samples.append(_rss_kib(bench.daemon_pid))
            after = _rss_kib(bench.daemon_pid)
            stats_after = bench.client.stats()
            settle = 6.0  # the supervisor's 5 s timers (request deadline, KILL after TERM) run out
            time.sleep(settle)
            bench.client.ping()  # one turn of its loop, so expired timers are popped
            time.sleep(0.1)
            settled = _rss_kib(bench.daemon_pid)
            res["rss"] = {"fresh_kib": res["supervisor_rss_kib_fresh"], "before_kib": before,
                          "after_kib": after, "spawns": n_rss, "growth_kib": after - before,
                          "settle_s": settle, "settled_kib": settled, "every": every, "samples_kib": samples,
                          "stats_after": stats_after}

        if "throughput" in sections:
            res["throughput"] = {}
            duration = 2.0 if args.quick else 5.0
            for n in (1, 4, 16):
                for kind in ("floor", "forkserver"):
                    log(f"throughput: {kind}, {n} client(s), {duration} s")
                    res["throughput"][f"{kind}:{n}"] = throughput(bench, kind, n, duration)

        if "mcp" in sections:
            res["mcp"] = {}
            runs = 5 if args.quick else 15
            for server in bench.mcp:
                log(f"MCP start-up: {server['label']}, {runs} runs each way")
                entry: dict[str, Any] = {"label": server["label"], "real_server": server["real"], "runs": runs}
                try:
                    mcp_once(bench, server, True)  # warm the page cache and the ruleset cache
                    mcp_once(bench, server, False)
                    un, co = [], []
                    for _ in range(runs):
                        un.append(mcp_once(bench, server, False))
                        co.append(mcp_once(bench, server, True))
                    un.sort()
                    co.sort()
                    entry.update(unconfined_ms=un, confined_ms=co, unconfined_p50_ms=un[len(un) // 2],
                                 confined_p50_ms=co[len(co) // 2], unconfined_min_ms=un[0], confined_min_ms=co[0])
                    entry["added_p50_ms"] = entry["confined_p50_ms"] - entry["unconfined_p50_ms"]
                    entry["added_pct"] = 100 * entry["added_p50_ms"] / entry["unconfined_p50_ms"]
                except Exception as e:  # noqa: BLE001 - reported, never faked
                    entry["error"] = f"{type(e).__name__}: {e}"
                res["mcp"][server["name"]] = entry
                if not server["real"]:
                    res["notes"].append("MCP start-up measured with a tiny echo server: no real server "
                                        f"installed in {args.servers_dir} (scripts/install-servers)")

        if "big" in sections:
            # How the cost grows with the client's heap: a few sizes on the way up.
            big = BigHeap(0, args.threads, args.busy_threads)
            sweep = []
            for mib in [m for m in (64, 256, 512) if m < args.heap_mib] + [args.heap_mib]:
                big.grow(mib)
                log(f"client heap {big.rss_kib // 1024} MiB: preexec_fn and fork-server spawns")
                point: dict[str, Any] = {"heap_mib": mib, "rss_kib": big.rss_kib}
                for key, run, n in (("preexec", bench.m_preexec("true"), 15 if args.quick else 40),
                                    ("forkserver", bench.m_forkserver("true"), 100 if args.quick else 400),
                                    ("floor", bench.m_floor("true"), 100 if args.quick else 400)):
                    run()
                    point[key] = summarize([run()[0] for _ in range(n)])
                sweep.append(point)
            res["heap_sweep"] = sweep
            res["big_client"] = {"rss_kib": big.rss_kib, "threads": big.thread_count,
                                 "sleeping_threads": args.threads, "busy_threads": args.busy_threads}
            methods = []
            for t in ("true", "cat"):
                methods += floor_and_forkserver(t, "_big", "1 floor, from the 1 GiB client",
                                                "3 fork-server, from the 1 GiB client")
                n, b = counts(args.quick, False, 30.0)
                methods.append(Method(f"preexec_big:{t}", "4 Popen(preexec_fn=landlock.apply), 1 GiB client",
                                      bench.m_preexec(t), min(n, 1000), b))
            log(f"latency, big client: {len(methods)} methods")
            run_interleaved(methods, rounds, warmup=20, server_pid=bench.daemon_pid)
            phases["big"] = methods
            big.close()

        if res.get("rss"):
            res["rss"]["end_kib"] = _rss_kib(bench.daemon_pid)
        res["supervisor_stats_end"] = bench.client.stats()
        build_report(bench, phases)
        check_targets(bench)
        res["elapsed_s"] = time.monotonic() - t_start
        res["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    finally:
        bench.stop_daemon()
        if not args.keep:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    print_table(bench)
    print(f"\n({res['elapsed_s']:.0f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
