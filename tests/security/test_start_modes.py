"""The catalogue's attacks on the supervisor itself, with the supervisor
started the other ways users start it: socket-activated as the systemd units
do (LISTEN_FDS, the socket bound by someone else), and in private mode (a
proxy's own supervisor over a socketpair, `supervisor.start`). The arena's
supervisor (test_escapes.py) is the README's `serve`.

Each attack is a case of the catalogue, checked again here against each
start mode: what the child can reach of the supervisor does not depend on
how it was started.
"""
from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import supervisor
from sechelpers import CHILD_UID, KERNEL_ABI, Arena, Identity, attack, svconf
from svhelpers import PYTHON

pytestmark = pytest.mark.enforcement

# What systemd does for a socket unit: bind and listen, then exec the
# service with the socket as fd 3 and LISTEN_PID/LISTEN_FDS naming it.
_ACTIVATE = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o666); s.listen(128)
os.dup2(s.fileno(), 3) if s.fileno() != 3 else os.set_inheritable(3, True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="landlock-supervisor.socket")
os.execv(sys.argv[2], sys.argv[2:])
"""


class SocketActivated(svconf.Supervisor):
    """`serve` as landlock-supervisor.service runs it under its .socket unit."""

    @property
    def argv(self) -> list[str]:
        serve = super().argv
        at = serve.index("--socket")
        del serve[at:at + 2]   # the unit gives no --socket: the socket comes from systemd
        return [PYTHON, "-c", _ACTIVATE, str(self.socket_path), *serve]

    def stop(self, timeout: float = 10) -> int:
        # systemd, not the supervisor, owns the socket file.
        self.socket_path.parent.mkdir(exist_ok=True)
        rc = self.proc.returncode if self.stopped else None
        if not self.stopped:
            self.socket_path.unlink(missing_ok=True)
            self.stopped = True
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout)
        assert rc == 0, f"socket-activated supervisor exited {rc}:\n{self.log()}"
        return rc


@dataclass
class Started:
    mode: str
    client: Any
    pid: int
    socket_path: str | None


@pytest.fixture(scope="module", params=["socket-activated", "private"])
def started(request: pytest.FixtureRequest, arena: Arena) -> Iterator[Started]:
    lab = arena.sv.lab
    state_root = lab.dir / f"state-{request.param}"
    env = {"LLSV_SUPERVISOR_SECRET": arena.canary}
    if request.param == "socket-activated":
        path = lab.dir / "run-sa" / "socket"
        # As a unit that lets another uid in (--allow-uid) sets it up, so
        # that the refusal below is the supervisor's, not DAC's.
        path.parent.mkdir()
        path.parent.chmod(0o711)
        sv = SocketActivated(lab, manifests=[lab.manifest_dir], state_root=state_root, socket_path=path,
                             env={**os.environ, **env}, extra=["--allow-uid", str(CHILD_UID)])
        lab.supervisors.append(sv)
        sv.start()
        yield Started(request.param, sv.client, sv.pid, str(path))
        sv.stop()
        return
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)   # a private supervisor has its proxy's environment
    try:
        client = supervisor.start([str(lab.manifest_dir)], state_root=str(state_root),
                                  extra_args=["--allow-root-servers"])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield Started(request.param, client, client.server_pid, None)
    finally:
        assert client.close() == 0


def _attack(started: Started, ident: Identity, ops: list[list[Any]]) -> Any:
    return attack(started.client, ident.manifest, ops)


@pytest.mark.timeout(60)
def test_signal_and_ptrace_the_supervisor(started: Started, arena: Arena, ident: Identity) -> None:
    """`signal-outside`, `ptrace-supervisor`: the supervisor, however it was
    started, is outside the child's domain."""
    pid = started.pid
    o = _attack(started, ident, [["kill", pid, signal.SIGTERM], ["ptrace_attach", pid],
                                 ["read", f"/proc/{pid}/environ"], ["proc_mem", pid]])
    assert [o.errname(i) for i in range(4)] == ["EPERM", "EPERM", "EACCES", "EACCES"], o
    assert started.client.ping()["pid"] == pid


@pytest.mark.timeout(60)
def test_prlimit_the_supervisor(started: Started, arena: Arena, ident: Identity) -> None:
    """`prlimit-supervisor`: a private supervisor runs as its proxy's user,
    a socket-activated one as the unit's; as root here, each child has a
    session gid of its own, so prlimit(2) on the supervisor is EPERM."""
    before = open(f"/proc/{started.pid}/limits").read()
    o = _attack(started, ident, [["prlimit", started.pid, "NOFILE", 3, 3], ["prlimit", started.pid, "CPU", 1, 1]])
    assert [o.errname(0), o.errname(1)] == ["EPERM", "EPERM"], o
    assert open(f"/proc/{started.pid}/limits").read() == before
    assert started.client.ping()["pid"] == started.pid


@pytest.mark.timeout(60)
def test_environment_and_fds(started: Started, arena: Arena, ident: Identity) -> None:
    """`supervisor-environment`, `inherited-fds`: a private supervisor runs
    with its proxy's environment (a secret in it) and a socket-activated one
    holds systemd's socket: neither reaches the child."""
    o = _attack(started, ident, [["environ"], ["fds"]])
    assert arena.canary not in json.dumps(o[0]["value"]), o
    assert [fd for fd, _ in o[1]["value"]] == [0, 1, 2], o


@pytest.mark.timeout(60)
def test_obtain_a_spawn(started: Started, arena: Arena, ident: Identity) -> None:
    """`supervisor-spawn`: a socket-activated supervisor refuses its
    descendants like any other; a private one has no socket to name (its
    socketpair is the proxy's alone)."""
    if started.socket_path is None:
        o = _attack(started, ident, [["fds"]])
        sockets = [target for _, target in o[0]["value"] if target.startswith("socket:")]
        assert sockets == [], o
        return
    o = _attack(started, ident, [["supervisor_spawn", started.socket_path, ident.manifest]])
    if o[0]["ok"]:
        assert o[0]["value"]["code"] == "refused_peer", o
    else:   # FS_RESOLVE_UNIX (ABI 9) stops the connect itself
        assert KERNEL_ABI >= 9 and o.errname(0) == "EACCES", o
