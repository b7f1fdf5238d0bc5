"""Plumbing for the supervisor tests: real fork-servers, real sockets.

`lab` gives a world-traversable scratch directory, a manifest writer, and
start(): `python -m supervisor --socket S serve --manifests DIR
--state-root DIR --grace 1` as a subprocess, ready once `ping` answers.
Every supervisor is stopped at teardown with SIGTERM, and must exit 0,
remove its socket and leave no process behind. Every manifest written here
carries LLS_TEST_TAG in its env, so whatever a child started (grandchildren
that escaped the process group included) is found in /proc afterwards.

`sv` is a started supervisor with a few stock manifests (sh, cat, true,
false, sleep); `shared_sv` is one for a whole module, for tests that leave
it as they found it. Plain helpers live in svhelpers.py (a conftest is not
reliably importable).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import landlock
from supervisor.client import Client

sys.path.insert(0, os.path.dirname(__file__))  # for svhelpers, any import mode
from svhelpers import GRACE, PYTHON, REPO, alive, descendants, processes_with_tag, wait_until  # noqa: E402

KERNEL_ABI = landlock.abi_version()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if KERNEL_ABI:
        return
    # Manifests fail closed: without Landlock no spawn succeeds here.
    skip = pytest.mark.skip(reason="this kernel has no Landlock")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here + os.sep):
            item.add_marker(skip)


def netlink_sockets(pid: int) -> set[str]:
    """`socket:[INODE]` of the netlink sockets in pid's network namespace."""
    with open(f"/proc/{pid}/net/netlink") as f:
        next(f)
        return {f"socket:[{line.split()[-1]}]" for line in f if line.split()}


class Supervisor:
    """One `serve` subprocess."""

    def __init__(self, lab: "Lab", *, manifests: list[Path], state_root: Path, socket_path: Path,
                 env: dict[str, str], extra: list[str]) -> None:
        self.lab = lab
        self.manifests = manifests
        self.state_root = state_root
        self.socket_path = socket_path
        self.env = env
        self.extra = extra
        self.log_path = lab.dir / f"supervisor-{len(lab.supervisors)}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False
        self.allow_root = True      # --allow-root-servers: the lab's manifests run as root unless they name a user
        self.prefix: list[str] = []   # a command that execs the supervisor (what it runs under)

    @property
    def argv(self) -> list[str]:
        argv = [*self.prefix, PYTHON, "-m", "supervisor", "--socket", str(self.socket_path), "serve"]
        for m in self.manifests:
            argv += ["--manifests", str(m)]
        return argv + ["--state-root", str(self.state_root), "--grace", str(GRACE),
                       *(["--allow-root-servers"] if self.allow_root else []), *self.extra]

    def start(self, timeout: float = 10) -> "Supervisor":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited {self.proc.returncode} at start:\n{self.log()}")
            try:
                self.client.ping()
                return self
            except (ConnectionError, OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"supervisor did not answer ping:\n{self.log()}") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def client(self) -> Client:
        return Client(str(self.socket_path))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def fds(self) -> dict[int, str]:
        out = {}
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                out[int(fd)] = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except OSError:
                pass
        return out

    def idle_fds(self, timeout: float = 5) -> dict[int, str]:
        """Its fds once no connection is open (three Unix sockets: the
        listener and the zygote's two channels; no peer pidfd; where the
        host's audit is on, its audit reader's netlink socket besides).
        Fails if it does not get there in time."""
        def idle() -> bool:
            targets = list(self.fds().values())
            netlink = netlink_sockets(self.pid)
            return (sum(t.startswith("socket:") and t not in netlink for t in targets) == 3
                    and not any("pidfd" in t for t in targets))
        assert wait_until(idle, timeout), f"never idle: {self.fds()}"
        return self.fds()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = GRACE + 8) -> int:
        """SIGTERM; it must exit 0, remove its socket, leave nothing behind."""
        assert self.proc is not None
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        family = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"supervisor did not exit within {timeout} s of SIGTERM:\n{self.log()}")
        assert rc == 0, f"supervisor exited {rc}:\n{self.log()}"
        assert not self.socket_path.exists(), "the socket file outlived the supervisor"
        # The processes it had started are gone (zombies reparented to init aside).
        assert wait_until(lambda: not [p for p in family if alive(p)], 3), \
            f"processes of the supervisor outlived it: {[p for p in family if alive(p)]}"
        assert wait_until(lambda: not processes_with_tag(self.lab.tag), 3), \
            f"tagged processes outlived the supervisor: {processes_with_tag(self.lab.tag)}"
        return rc

    def kill_hard(self) -> None:
        """Cleanup after a failed test: no assertions."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait()


class Lab:
    def __init__(self, base: Path) -> None:
        self.dir = base
        self.tag = uuid.uuid4().hex
        self.manifest_dir = base / "manifests"
        self.manifest_dir.mkdir()
        self.state_root = base / "state"
        self.supervisors: list[Supervisor] = []

    def manifest(self, name: str, *, command: str, directory: Path | None = None,
                 raw: str | None = None, **fields: Any) -> Path:
        """Write NAME.yaml; tag its env; allow_root unless a user is given;
        sandbox defaults to the system profile; `pool: 0` unless a pool is
        given (pool=None: no pool key, the adaptive default, which the
        tests counting a supervisor's fds and children would see come and
        go: tests/supervisor/test_pool.py tests it)."""
        directory = directory or self.manifest_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.yaml"
        if raw is not None:
            path.write_text(raw)
            return path
        data: dict[str, Any] = {"command": command, "pool": 0, **fields}
        if data["pool"] is None:
            del data["pool"]
        data["env"] = {"LLS_TEST_TAG": self.tag, **(data.get("env") or {})}
        if "user" not in data:
            data.setdefault("allow_root", True)
        data.setdefault("sandbox", {"profiles": ["system"]})
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def stock(self, directory: Path | None = None) -> None:
        """sh (sh -c SCRIPT, /usr/bin and /proc readable), cat, true, false, sleep."""
        self.manifest("sh", command="/bin/sh", args=["-c"], client_args=True, directory=directory,
                      sandbox={"profiles": ["system"], "read_only": ["/usr/bin"],
                               "read_only_noexec": ["/proc"]})
        for name in ("cat", "true", "false", "sleep"):
            self.manifest(name, command=name, client_args=name == "sleep", directory=directory,
                          env={"PATH": "/usr/bin:/bin"})

    def supervisor(self, *, manifests: list[Path] | None = None, env: dict[str, str] | None = None,
                   extra: list[str] = (), socket_path: Path | None = None,
                   state_root: Path | None = None) -> Supervisor:
        """An unstarted supervisor (see Supervisor.start), stopped at teardown."""
        full_env = dict(os.environ)
        full_env.pop("LANDLOCK_SUPERVISOR_SOCKET", None)
        full_env.update(env or {})
        sv = Supervisor(self, manifests=manifests or [self.manifest_dir],
                        state_root=state_root or self.state_root,
                        socket_path=socket_path or self.dir / "run" / "socket",
                        env=full_env, extra=list(extra))
        self.supervisors.append(sv)
        return sv

    def start(self, **kwargs: Any) -> Supervisor:
        return self.supervisor(**kwargs).start()


@contextlib.contextmanager
def _lab_context() -> Iterator[Lab]:
    # Short (socket paths hold 108 bytes) and world-traversable (uid-drop tests).
    base = Path(tempfile.mkdtemp(prefix="llsv-", dir="/tmp"))
    os.chmod(base, 0o755)
    the_lab = Lab(base)
    try:
        yield the_lab
    finally:
        errors = []
        for sv in the_lab.supervisors:
            if sv.proc is None or sv.stopped:
                continue
            try:
                sv.stop()
            except AssertionError as e:
                errors.append(str(e))
            finally:
                sv.kill_hard()
        leftover = processes_with_tag(the_lab.tag)
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(base, ignore_errors=True)
        if errors:
            pytest.fail("\n".join(errors), pytrace=False)
        if leftover:
            pytest.fail(f"processes left behind: {leftover}", pytrace=False)


@pytest.fixture
def lab() -> Iterator[Lab]:
    with _lab_context() as the_lab:
        yield the_lab


@pytest.fixture
def sv(lab: Lab) -> Supervisor:
    """A fresh supervisor with the stock manifests, for this test alone."""
    lab.stock()
    return lab.start()


@pytest.fixture(scope="module")
def module_lab() -> Iterator[Lab]:
    with _lab_context() as the_lab:
        yield the_lab


@pytest.fixture(scope="module")
def shared_sv(module_lab: Lab) -> Supervisor:
    """One supervisor with the stock manifests for a whole module: for tests
    that leave it as they found it (no child, no open connection)."""
    module_lab.stock()
    return module_lab.start()
