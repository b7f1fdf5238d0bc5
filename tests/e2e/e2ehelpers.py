"""Plumbing for the end-to-end tests: a world of files, one real supervisor,
real MCP servers spawned through it and talked to with examples/mcp_session.py.

The world (one per test session, under pytest's tmp dir):

    projects/          MCP_PROJECTS: what the filesystem servers are granted
    secret/            granted to nobody (the filesystem server is told otherwise)
    outside/           granted to nobody: where writes are attempted
    repo/              MCP_REPO, a git repository with one commit
    repo/nested/       a repository whose .git/config includes secret/shared.gitconfig
    state/             the supervisor's --state-root, npm and uv caches seeded
                       (on /dev/shm when it can be: see state_root_for)
    supervisor.log     its stderr

The supervisor: `python -m supervisor --socket S serve --manifests examples
--manifests tests/e2e/manifests --state-root state --grace 1`, with an
environment that holds a marker no server may see (SUPERVISOR_SECRET).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SERVERS = REPO / ".servers"
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
SECRET_MARKER = "e2e-marker-the-servers-must-not-see-this"
TIMEOUT = 30.0      # seconds for one MCP request (npx under load is slow)

sys.path.insert(0, str(EXAMPLES))
from mcp_session import McpSession, tool_text  # noqa: E402

from supervisor.client import Child, Client  # noqa: E402

# The example manifests and the tool call that shows each one working.
NODE = ("filesystem", "memory", "everything")
PYTHON_SERVERS = ("time", "git")
ALL = tuple(n for base in (*NODE, *PYTHON_SERVERS)
            for n in (base, f"{base}-npx" if base in NODE else f"{base}-uvx"))
NPX_PACKAGES = {f"{n}-npx": f"@modelcontextprotocol/server-{n}" for n in NODE}
UVX = ("time-uvx", "git-uvx")


# A tiny Python "server" for what no MCP server has a tool for. The client
# appends operations (read:PATH, write:PATH, connect:PORT, env); it tries
# each and prints the outcome ("ok" or the errno's name) as one JSON line.
# Written into the world at start: its granted port is only known then.
PROBE_MANIFEST = """\
command: /usr/bin/python3
args:
  - -I
  - -c
  - |
    import errno, json, os, socket, sys
    out = {}
    for op in sys.argv[1:]:
        kind, _, arg = op.partition(":")
        try:
            if kind == "read":
                open(arg).read()
            elif kind == "write":
                open(arg, "w").write("probe")
            elif kind == "connect":
                socket.create_connection(("127.0.0.1", int(arg)), timeout=5).close()
            elif kind == "env":
                out[op] = sorted(os.environ)
                continue
            out[op] = "ok"
        except OSError as e:
            out[op] = errno.errorcode.get(e.errno, str(e))
    print(json.dumps(out), flush=True)
client_args: true
env: {PROBE: "1"}
state_dir: true
user: dynamic
sandbox:
  profiles: [system, python]
  read_only_noexec: ["${MCP_PROJECTS}"]
  network: {connect_tcp: [@PORT@]}
"""


def servers_problem() -> str | None:
    """Why the installed servers cannot be used, or None."""
    needed = [SERVERS / "servers.env", SERVERS / "node" / "node_modules" / "@modelcontextprotocol",
              SERVERS / "venv" / "bin" / "mcp-server-time", SERVERS / "venv" / "bin" / "mcp-server-git",
              SERVERS / "venv" / "bin" / "uvx", SERVERS / "npm-cache" / "_npx", SERVERS / "uv-cache",
              SERVERS / "venv-mcp1" / "bin" / "mcp-server-sqlite",   # the learn tests' (test_learn.py)
              SERVERS / "node" / "node_modules" / "@itseasy21" / "mcp-knowledge-graph"]
    missing = [str(p) for p in needed if not p.exists()] if SERVERS.is_dir() else [f"{SERVERS} itself"]
    if missing:
        return (f"the real MCP servers are not installed ({', '.join(missing)} missing): "
                f"run scripts/install-servers (scripts/test does) before tests/e2e")
    return None


def servers_env() -> dict[str, str]:
    """scripts/install-servers' servers.env: the versions it installed (FS_VER=...)."""
    lines = (SERVERS / "servers.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


# ---- offline caches ----------------------------------------------------------

def npx_dir_for(package: str) -> Path:
    """The _npx/<hash> directory npx -y PACKAGE@VER reuses (the installer filled it)."""
    for pj in sorted((SERVERS / "npm-cache" / "_npx").glob("*/package.json")):
        if package in json.loads(pj.read_text()).get("dependencies", {}):
            return pj.parent
    raise AssertionError(f"{SERVERS}/npm-cache/_npx has no install of {package}: run scripts/install-servers")


def seed_caches(state_root: Path, npx: Mapping[str, str] = NPX_PACKAGES, uvx: Sequence[str] = UVX) -> None:
    """Give each npx server (name -> its package) and uvx server a copy of
    the installer's caches, where its profile puts them:
    <state_root>/servers/<name>/{npm-cache,uv-cache} (root's: the
    supervisor hands them to the server's dynamic uid).

    npx offline needs `_cacache` (the packument of the spec is read even when
    `_npx/<hash>` already holds the package: without it ENOTCACHED) and that
    `_npx/<hash>`; the other servers' installs are left out. uvx offline needs
    `simple-v28` (index pages), `wheels-v8` and `archive-v0` (the unpacked
    wheels): the whole uv cache is copied. UV_TOOL_DIR need not be seeded
    (the supervisor creates it empty). Copies, never links: each server
    writes its own cache, and must not reach the installer's."""
    jobs = []
    for name, package in npx.items():
        cache = state_root / "servers" / name / "npm-cache"
        (cache / "_npx").mkdir(parents=True)
        jobs.append(["cp", "-a", str(SERVERS / "npm-cache" / "_cacache"), str(cache)])
        jobs.append(["cp", "-a", str(npx_dir_for(package)), str(cache / "_npx")])
    for name in uvx:
        server = state_root / "servers" / name
        server.mkdir(parents=True)
        jobs.append(["cp", "-a", str(SERVERS / "uv-cache"), str(server / "uv-cache")])
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE) for argv in jobs]
    for argv, p in zip(jobs, procs):
        _, err = p.communicate()
        assert p.returncode == 0, f"{' '.join(argv)}: {err.decode(errors='replace')}"


# ---- the world ---------------------------------------------------------------

def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
                        "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@localhost",
                        "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@localhost"})


def state_root_for(root: Path) -> Path:
    """The supervisor's state root: on /dev/shm when it is a roomy tmpfs that
    allows exec (npx and uvx run what their caches hold), else under root.
    The seeded caches are ~30,000 files: on a busy disk copying and removing
    them took 30 s, in memory 2 s."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 2 << 30 and not st.f_flag & os.ST_NOEXEC:
            return Path(tempfile.mkdtemp(prefix="landlock-e2e-state-", dir="/dev/shm"))
    except OSError:
        pass
    return root / "state"


class World:
    def __init__(self, root: Path) -> None:
        self.dir = root
        self.projects = root / "projects"
        self.secret = root / "secret"
        self.outside = root / "outside"
        self.repo = root / "repo"
        self.state = state_root_for(root)
        self.socket = root / "run" / "supervisor.sock"   # serve makes its directory 0700
        self.log = root / "supervisor.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        self.spawned = 0
        self._servers: dict[str, Server] = {}

    def build(self) -> None:
        for d in (self.projects / "sub", self.secret, self.outside, self.repo):
            d.mkdir(parents=True)
        (self.projects / "sub" / "inner.txt").write_text("inside the narrowed grant\n")
        seed_world(self.projects, self.secret, self.repo)
        if os.geteuid() == 0:
            subprocess.run(["chmod", "-R", "a+rwX", str(self.projects), str(self.repo), str(self.outside)],
                           check=True)
        seed_caches(self.state)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("npm_config_", "UV_"))}
        env.update(MCP_SERVERS=str(SERVERS), MCP_PROJECTS=str(self.projects), MCP_REPO=str(self.repo),
                   E2E_OUTSIDE=str(self.outside), E2E_SECRET=str(self.secret),
                   npm_config_offline="true", UV_OFFLINE="1", SUPERVISOR_SECRET=SECRET_MARKER)
        env.update(extra)
        return env

    # ---- the supervisor ----

    def start(self, probe_port: int) -> None:
        probe = self.dir / "probe.yaml"
        probe.write_text(PROBE_MANIFEST.replace("@PORT@", str(probe_port)))
        argv = [PYTHON, "-m", "supervisor", "--socket", str(self.socket), "serve",
                "--manifests", str(EXAMPLES), "--manifests", str(HERE / "manifests"), "--manifests", str(probe),
                "--state-root", str(self.state), "--grace", "1"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        self.client = Client(str(self.socket))
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the supervisor exited {self.proc.returncode} at start:\n{self.log_text()}")
            try:
                self.client.ping()
                return
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the supervisor does not answer:\n{self.log_text()}") from None
                time.sleep(0.05)

    def stop(self) -> int | None:
        for server in self._servers.values():
            server.close()
        return stop_supervisor(self.proc)

    def log_text(self) -> str:
        return tail(self.log)

    # ---- servers ----

    def server(self, name: str, args: Sequence[str] = ()) -> "Server":
        """An initialized session with NAME, shared by every test of the session."""
        key = f"{name} {' '.join(args)}"
        if key not in self._servers:
            self._servers[key] = self.spawn(name, args)
            self._servers[key].initialize()
        return self._servers[key]

    def spawn(self, name: str, args: Sequence[str] = (), *,
              narrow: Mapping[str, Any] | None = None) -> "Server":
        """A fresh, uninitialized server; use as a context manager."""
        self.spawned += 1
        return Server(self, name, args, narrow, self.dir / f"{name}-{self.spawned}.stderr")

    def run(self, name: str, args: Sequence[str] = (), timeout: float = TIMEOUT) -> tuple[int, str]:
        """Spawn NAME with no input, wait; its exit status and stdout."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            child = self.client.spawn(name, list(args), stdin=null, stdout=out_w, stderr=out_w)
        finally:
            os.close(out_w)
            os.close(null)
        with child, os.fdopen(out_r, "rb") as out:
            status = child.wait(timeout)
            return status, out.read().decode(errors="replace")

    def state_dir(self, name: str) -> Path:
        return self.state / "servers" / name / "state"


class Server:
    """A child of the supervisor with an MCP session on its stdio."""

    def __init__(self, world: World, name: str, args: Sequence[str], narrow: Mapping[str, Any] | None,
                 log: Path) -> None:
        self.name, self.log = name, log
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self.child: Child = world.client.spawn(name, list(args), stdin=in_r, stdout=out_w, stderr=err,
                                                   narrow=narrow)
        except BaseException:
            os.close(in_w)
            os.close(out_r)
            raise
        finally:
            for fd in (in_r, out_w, err):
                os.close(fd)
        self._out = out_r
        self.session = McpSession(in_w, out_r, timeout=TIMEOUT)
        self.info: dict[str, Any] = {}
        self.closed = False

    def initialize(self) -> dict[str, Any]:
        try:
            self.info = self.session.initialize()
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"{self.name}: {e}\n{self.stderr()}") from None
        return self.info

    def tools(self) -> list[str]:
        return [t["name"] for t in self.session.list_tools()]

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> tuple[bool, str]:
        """(isError, text) of a tools/call."""
        try:
            result = self.session.call_tool(tool, arguments or {})
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"{self.name}: {e}\n{self.stderr()}") from None
        return bool(result.get("isError")), tool_text(result)

    def stderr(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-3000:]
        except OSError:
            text = ""
        return f"--- {self.name} stderr ({self.log}):\n{text}"

    def close(self) -> None:
        """EOF on its stdin, as an MCP client ends a session; then kill if need be."""
        if self.closed:
            return
        self.closed = True
        self.session.close()
        try:
            self.child.wait(5)
        except TimeoutError:
            self.child.kill()
            self.child.wait(5)
        finally:
            self.child.close()
            os.close(self._out)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- a listener to connect to ------------------------------------------------

class Listener:
    """127.0.0.1:<free port>, counting connections and answering HTTP 200."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nhi\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


def free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_world(projects: Path, secret: Path, repo: Path) -> None:
    """What the example servers are given and denied: a project, a secret
    beside it, a repository with one commit, and inside it a repository
    whose configuration includes a file of the secret directory: the
    server's own check (the path is inside --repository) lets it through,
    the kernel does not."""
    (projects / "notes.txt").write_text("hello from an allowed project\n")
    (secret / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY----- (not really)\n")
    (repo / "README").write_text("a repository the git server may use\n")
    git("init", "-q", "-b", "main", ".", cwd=repo)
    git("add", "README", cwd=repo)
    git("commit", "-q", "-m", "first", cwd=repo)
    nested = repo / "nested"
    git("init", "-q", "-b", "main", str(nested), cwd=repo.parent)
    (secret / "shared.gitconfig").write_text("[core]\n\tautocrlf = false\n")
    with open(nested / ".git" / "config", "a") as f:
        f.write(f"[include]\n\tpath = {secret / 'shared.gitconfig'}\n")
    # The servers run as dynamic uids (one per manifest) under a root
    # supervisor: what two of them share must be writable by both, and
    # stay so for what git creates there.
    git("config", "core.sharedRepository", "0666", cwd=repo)


def stop_supervisor(proc: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM, its status; KILL to its group if it is not gone in 15 s."""
    if proc is None:
        return None
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def tail(path: Path, size: int = 4000) -> str:
    """The end of a log, for an assertion's message."""
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""
