"""Plumbing of the client tests. Real MCP clients (scripts/install-clients:
the official Python SDK in .clients/py, the TypeScript SDK and the Inspector
in .clients/node) start `landlock-supervisor run NAME` as their stdio
server, as users configure them.

Two identities, each with its own world of files (projects, secret, repo) and
its own daemon:

- root: the daemon is `serve --socket ROOT/run/sock` (never the host's
  /run/landlock-supervisor), the servers run as dynamic uids; private mode
  gets `--state-root` (never /var/lib/landlock-supervisor).
- user: a uid of 64700-64999 that nothing uses (no account, no process, no
  /run/user/UID). It gets /run/user/UID (0700, as logind makes it) and a
  home; its daemon is `serve` with no --socket, so that both `serve` and
  `run` find the socket there with no XDG_RUNTIME_DIR (clients drop it);
  private mode uses the default state root under its HOME.
- user-noruntime: another such uid without /run/user/UID (su -, ssh
  without logind, containers, CI): `serve` and `run` meet in the fallback,
  /tmp/landlock-supervisor-UID/socket, with the same client configs.
- root-warm: root again, its daemon serving the examples with `warm: 1`
  each: the clients' sessions are warm servers handed over and relayed by
  `run` (but where the client passes arguments of its own: fresh).

Every client runs with only HOME, LOGNAME, PATH, SHELL, TERM, USER (what the
SDKs pass on) plus the config's `env`. The npm and uv caches are seeded into
each state root, as tests/e2e does, so that npx and uvx start offline.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # e2ehelpers, any import mode
from e2ehelpers import EXAMPLES, REPO, SERVERS, seed_caches, seed_world, stop_supervisor, tail  # noqa: E402

from supervisor.manifests import ids  # noqa: E402

CLIENTS = REPO / ".clients"
SUPERVISOR = REPO / ".venv" / "bin" / "landlock-supervisor"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT = 30.0


def clients_problem() -> str | None:
    env = CLIENTS / "clients.env"
    if not env.exists():
        return f"the MCP clients are not installed ({env} missing): run scripts/install-clients (scripts/test does)"
    return None


def clients_env() -> dict[str, str]:
    out = {}
    for line in (CLIENTS / "clients.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


# ---- an unused uid ----------------------------------------------------------------

def _uids_in_use() -> set[int]:
    uids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        uids.update(int(x) for x in line.split()[1:])
                        break
            except OSError:
                pass
    return uids


# The suite's fixed uids lie below (64050-64199: tests/security's dedicated
# ones, which it checks no process has when it starts, and others): a uid
# drawn among them, whose daemon lives for the session, would be one of theirs.
FREE_UIDS = range(64700, 65000)


def free_uid() -> int:
    """A uid of FREE_UIDS that no account, no group, no process and no
    /run/user directory uses."""
    import grp
    import pwd
    busy = _uids_in_use()
    candidates = list(FREE_UIDS)
    random.shuffle(candidates)
    for uid in candidates:
        if uid in busy or os.path.lexists(f"/run/user/{uid}"):
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            pass
        return uid
    raise AssertionError(f"no free uid in {FREE_UIDS.start}-{FREE_UIDS.stop - 1}")


# ---- one identity's world ---------------------------------------------------------

class Identity:
    """Files, a daemon and the client environment of root or of a plain uid."""

    def __init__(self, kind: str, root: Path, uid: int, runtime: bool = True, warm: bool = False) -> None:
        """runtime=False: a plain uid without /run/user/UID (su -, ssh without
        logind, containers, CI): its daemon's socket is the fallback in /tmp.
        warm: its daemon's manifests are the examples with `warm: 1`."""
        self.kind, self.dir, self.uid = kind, root, uid
        self.manifests = root / "warm-manifests" if warm else EXAMPLES
        self.home = root / "home" if uid else Path("/root")
        self.projects = root / "projects"
        self.secret = root / "secret"
        self.repo = root / "repo"
        self.daemon_state = root / "daemon-state"
        # Private mode: root gets --state-root; the user its default, under HOME.
        self.private_state = (root / "private-state" if uid == 0
                              else self.home / ".local" / "state" / "landlock-supervisor")
        self.runtime = Path(f"/run/user/{uid}") if uid and runtime else None
        self.socket = (root / "run" / "sock" if uid == 0
                       else self.runtime / "landlock-supervisor" / "socket" if self.runtime
                       else Path(f"/tmp/landlock-supervisor-{uid}/socket"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "daemon.log"

    # -- set-up --

    def build(self) -> None:
        for d in (self.projects, self.secret, self.repo, self.dir / "run"):
            d.mkdir(parents=True)
        seed_world(self.projects, self.secret, self.repo)
        self.private_state.mkdir(parents=True)
        seed_caches(self.daemon_state)
        seed_caches(self.private_state)
        if self.manifests != EXAMPLES:
            self.manifests.mkdir()
            # None replaced for its age while a test compares the warm servers before and after its sessions.
            for path in EXAMPLES.glob("*.yaml"):
                (self.manifests / path.name).write_text(path.read_text() + "\nwarm: 1\nwarm_max_age: 86400\n")
        if self.uid == 0:
            # The servers run as dynamic uids: what they write must be theirs to write.
            subprocess.run(["chmod", "-R", "a+rwX", str(self.projects), str(self.repo)], check=True)
        else:
            self.home.chmod(0o700)
            for p in (self.home, self.projects, self.repo, self.daemon_state):
                subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", str(p)], check=True)
            if self.runtime is not None:
                self.runtime.mkdir(mode=0o700)
                os.chown(self.runtime, self.uid, self.uid)

    def client_env(self, path: str = PATH) -> dict[str, str]:
        """What an MCP client gives its servers (besides the config's env); and
        the suite's table of dynamic uids (tests/conftest.py), else a root
        supervisor here takes uids in the host's table, for good."""
        user = "root" if self.uid == 0 else f"llsv-client-{self.uid}"
        return {"HOME": str(self.home), "LOGNAME": user, "PATH": path, "SHELL": "/bin/sh",
                "TERM": "xterm-256color", "USER": user, ids.TABLE_ENV: os.environ[ids.TABLE_ENV]}

    def server_env(self) -> dict[str, str]:
        """The variables the example manifests read at load time (the daemon's
        environment; in private mode the client config's env)."""
        return {"MCP_SERVERS": str(SERVERS), "MCP_PROJECTS": str(self.projects), "MCP_REPO": str(self.repo),
                "npm_config_offline": "true", "UV_OFFLINE": "1"}

    def popen_kwargs(self) -> dict[str, Any]:
        if self.uid == 0:
            return {}
        return {"user": self.uid, "group": self.uid, "extra_groups": [], "umask": 0o077}

    # -- the daemon --

    def start_daemon(self, allow_uid: int | None = None) -> None:
        argv = [str(SUPERVISOR)]
        if self.uid == 0:
            argv += ["--socket", str(self.socket)]
        argv += ["serve", "--manifests", str(self.manifests), "--state-root", str(self.daemon_state), "--grace", "1"]
        if allow_uid is not None:
            argv += ["--allow-uid", str(allow_uid)]
        env = {**self.client_env(), **self.server_env()}
        if self.manifests != EXAMPLES:
            env["LANDLOCK_SUPERVISOR_POOL_IDLE"] = "3600"   # none drained between the tests that use them
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True, **self.popen_kwargs())
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.kind}'s supervisor did not start:\n{self.log_text()}")
            time.sleep(0.05)

    def supervisor(self, *args: str) -> dict[str, Any]:
        """A `landlock-supervisor` command against the daemon, as this identity."""
        argv = [str(SUPERVISOR), "--socket", str(self.socket), *args]
        p = subprocess.run(argv, env=self.client_env(), capture_output=True, timeout=20, **self.popen_kwargs())
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        return json.loads(p.stdout)

    def daemon_children(self, wait: float = 5.0) -> list[Any]:
        """The daemon's running children but its warm servers, once they have had `wait` s to go."""
        deadline = time.monotonic() + wait
        while True:
            children = [c for c in self.supervisor("list")["children"] if not c.get("warm")]
            if not children or time.monotonic() > deadline:
                return children
            time.sleep(0.1)

    def warm_servers(self, names: Sequence[str], timeout: float = 180.0) -> dict[str, int]:
        """Each name's warm server, once every one of them has one ready."""
        deadline = time.monotonic() + timeout
        while True:
            warm = self.supervisor("stats")["warm"]
            if all(warm.get(n) for n in names):
                return {n: warm[n][0] for n in names}
            if time.monotonic() > deadline:
                raise AssertionError(f"no warm server ready in {timeout:g} s: {warm}\n{self.log_text()}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        return stop_supervisor(self.proc)

    def log_text(self) -> str:
        return tail(self.log, 3000)

    # -- the configs a user writes --

    def config(self, mode: str, name: str, client_args: Sequence[str] = ()) -> dict[str, Any]:
        """The client config entry ({command, args, env}) for NAME in MODE."""
        if mode == "daemon":
            args = ["run", "--socket", str(self.socket)] if self.uid == 0 else ["run"]
            return {"command": str(SUPERVISOR), "args": [*args, name, *client_args], "env": {}}
        args = ["run", "--manifests", str(EXAMPLES)]
        if self.uid == 0:
            args += ["--state-root", str(self.private_state)]
        return {"command": str(SUPERVISOR), "args": [*args, name, *client_args], "env": self.server_env()}

    def leftovers(self) -> list[str]:
        """Processes of this identity's world still alive: any whose command
        line names one of its directories (the daemon and its warm servers,
        each leading a session of its own, aside)."""
        needle = str(self.dir).encode()
        out = []
        daemon = self.proc.pid if self.proc else -1
        warm = {c["pid"] for c in self.supervisor("list")["children"] if c.get("warm")}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == daemon:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
                sid = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[3])
            except (OSError, IndexError, ValueError):
                continue
            if sid in warm:
                continue
            if needle in cmdline or needle in environ:
                line = cmdline.replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{entry.name}: {line}")
        return out

    def remove(self) -> None:
        if self.uid:
            shutil.rmtree(self.socket.parent if self.runtime is None else self.runtime, ignore_errors=True)
        if not os.environ.get("LLSV_KEEP_E2E"):
            shutil.rmtree(self.dir, ignore_errors=True)


def run_client(ident: Identity, argv: Sequence[str], env: Mapping[str, str], timeout: float,
               stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """A client process as this identity, in its home, with exactly `env`."""
    return subprocess.run(list(argv), env=dict(env), cwd=str(ident.home), capture_output=True, input=stdin,
                          timeout=timeout, **ident.popen_kwargs())


def start_client(ident: Identity, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """run_client's process, started (stdin /dev/null): its output for communicate()."""
    return subprocess.Popen(list(argv), env=dict(env), cwd=str(ident.home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **ident.popen_kwargs())
