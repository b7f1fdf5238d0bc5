"""The world of one benchmark run: its temporary tree, the manifests, the supervisor daemon, the machine."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .measure import rss_kib

if TYPE_CHECKING:
    from supervisor.client import Client
    from supervisor.manifests.manifest import Manifest

REPO = Path(__file__).resolve().parent.parent.parent
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
TRUE = "/bin/true"
CAT = "/bin/cat"
NOBODY = "nobody"
AS_ROOT = os.geteuid() == 0
# As root every confined target runs as nobody (a root supervisor wants a
# user); otherwise as whoever runs the benchmark.
USER = {"user": NOBODY} if AS_ROOT else {}
PYPI_VENV = "/tmp/bench-venv"


class Bench:
    """The run's temporary tree, its manifests and the supervisor daemon;
    results gathers every figure (the --json output)."""

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
        self.client: Client
        self.mcp: list[dict[str, Any]] = []
        self.results: dict[str, Any] = {"latency": {}, "skipped": {}, "notes": []}
        self.targets = {"true": [TRUE], "cat": [CAT, str(self.data)]}

    def shown_targets(self) -> dict[str, str]:
        """Each target's command line as the table prints it."""
        return {t: " ".join(argv).replace(str(self.tmp), "$TMP") for t, argv in self.targets.items()}

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

    def write_manifests(self, mcp_servers: list[dict[str, Any]]) -> None:
        """The targets' manifests, then the MCP servers' that load (the others are skipped)."""
        for name, argv in self.targets.items():
            manifest = {"name": name, "command": argv[0], "args": argv[1:], "cwd": str(self.rw),
                        "env": ENV, **USER, "umask": "077", "pool": self.args.pool, "sandbox": self.sandbox()}
            # JSON is YAML.
            (self.mdir / f"{name}.yaml").write_text(json.dumps(manifest, indent=1))
            if name == "true":   # and as a user writes it: no pool setting (pool: auto)
                del manifest["pool"]
                manifest["name"] = "true-auto"
                (self.mdir / "true-auto.yaml").write_text(json.dumps(manifest, indent=1))
        for m in mcp_servers:
            path = self.mdir / f"{m['name']}.yaml"
            path.write_text(json.dumps(m["manifest"], indent=1))
            try:
                self.load_spec(m["name"])
                self.mcp.append(m)
            except Exception as e:  # noqa: BLE001 - reported, and kept out of the supervisor
                path.unlink()
                self.results["skipped"][m["name"]] = f"its manifest does not load: {e}"

    def load_spec(self, name: str) -> Manifest:
        from supervisor.manifests import manifest as manifests
        return manifests.load(self.mdir / f"{name}.yaml", state_root=str(self.state))

    def manifest_summary(self) -> dict[str, Any]:
        spec = self.load_spec("true").spec
        return {"path_rules": len(spec.path_rules),
                "read_only": len(spec.read_only) + len(spec.read_only_noexec),
                "read_write": len(spec.read_write) + len(spec.read_write_noexec),
                "rlimits": [r.name for r in spec.rlimits], "scopes": list(spec.scopes),
                "connect_tcp": list(spec.connect_tcp), "user": spec.user, "profiles": ["system"]}

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
        self.results["supervisor_rss_kib_fresh"] = rss_kib(self.daemon_pid)

    def close(self) -> None:
        """Stop the daemon; remove the tree unless --keep."""
        if self.daemon_pid:
            try:
                os.kill(self.daemon_pid, signal.SIGTERM)
                os.waitpid(self.daemon_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.daemon_pid = 0
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "executable": sys.executable, "repo": str(REPO),
            "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()}


def schedule(args: argparse.Namespace, mach: dict[str, Any]) -> None:
    """Apply --nice and --rt to this process (inherited by the supervisor and
    every child) and record the scheduling the run had."""
    if args.nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    if args.rt:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    mach["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    mach["sched"] = "SCHED_FIFO 1" if os.sched_getscheduler(0) == os.SCHED_FIFO else "SCHED_OTHER"
    mach["loadavg_start"] = loadavg()


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def user_ids() -> tuple[int, int]:
    """The (uid, gid) the confined targets run as."""
    import pwd
    pw = pwd.getpwnam(NOBODY) if AS_ROOT else pwd.getpwuid(os.getuid())
    return pw.pw_uid, pw.pw_gid
