"""Helpers for the supervisor tests: /proc inspection, pipes, the raw protocol."""
from __future__ import annotations

import array
import json
import os
import selectors
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon import procfs
from supervisor.client import Child, Client
from supervisor.daemon.procfs import alive, children_of, stat_fields, state

__all__ = ["alive", "children_of", "stat_fields", "state"]  # the tests import them from here

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
GRACE = 1.0   # the supervisors' --grace, seconds


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def zombies_of(pid: int) -> list[int]:
    return [p for p in children_of(pid) if state(p) == "Z"]


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for p, fields in procfs.stats():
        parents.setdefault(int(fields[1]), []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def processes_with_tag(tag: str) -> list[int]:
    """Live processes whose environment holds LLS_TEST_TAG=tag."""
    return procfs.with_environment(f"LLS_TEST_TAG={tag}")


def proc_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def read_all(*fds: int, timeout: float = 10) -> list[bytes]:
    """Read each fd to EOF (all at once, so no pipe fills up); closes them."""
    data = {fd: b"" for fd in fds}
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no EOF within {timeout} s; so far {data}")
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    data[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
        for fd in fds:
            os.close(fd)
    return [data[fd] for fd in fds]


def read_line(fd: int, timeout: float = 10) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while not out.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no line within {timeout} s; so far {out!r}")
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        ready = sel.select(remaining)
        sel.close()
        if not ready:
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            break
        out += chunk
    return out


class Run:
    """A finished child: its status and output."""

    def __init__(self, child: Child, code: int, out: bytes, err: bytes) -> None:
        self.child, self.code, self.out, self.err = child, code, out, err

    @property
    def text(self) -> str:
        return self.out.decode()

    def __repr__(self) -> str:
        return f"Run(code={self.code}, out={self.out!r}, err={self.err!r})"


def run(client: Client, name: str, args: Sequence[str] = (), *, stdin: bytes | None = None,
        timeout: float = 10, **kwargs: Any) -> Run:
    """Spawn with fresh pipes, feed stdin, read stdout/stderr to EOF, wait."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = client.spawn(name, args, stdin=in_r, stdout=out_w, stderr=err_w, **kwargs)
    except BaseException:
        for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
            os.close(fd)
        raise
    os.close(in_r)
    os.close(out_w)
    os.close(err_w)
    with child:
        if stdin:
            os.write(in_w, stdin)
        os.close(in_w)
        out, err = read_all(out_r, err_r, timeout=timeout)
        code = child.wait(timeout)
        child.settle()   # where denials are seen: their final counts (no wait where none is to come)
    return Run(child, code, out, err)


def counted(child: Child, client: Client) -> dict[str, Any]:
    """A child's denials in all, once `settled` came. Where the kernel's
    count did not come and no record was reported lost (the `denials`
    reply), audit was switched off under the test (by another program:
    auditd stopping, `auditctl -e 0`; the tests' manifests never grant the
    canary): the test skips, quoting the supervisor's own report of why."""
    counts = child.settle()
    assert counts is not None, f"denials not seen: {child.denials}"
    why = (child.settled or {}).get("why")
    if counts["kernel"] is None:
        assert why, child.settled
        if "audit is off" in why or not lost_any(reported_lost(client)):
            pytest.skip(f"machine setting changed under the test: {why}")
    return counts


def lost_any(lost: dict[str, int]) -> bool:
    """The `denials` reply's `lost` says records were lost (or cannot say)."""
    return lost.get("kernel", 0) != 0 or lost.get("reader_overflows", 0) > 0


def reported_lost(client: Client) -> dict[str, int]:
    """The `denials` reply's `lost`, the kernel's counter read anew: the
    supervisor reads it only once no record came since its last reading
    (supervisor/daemon/audit.py, Reader.status: asking during a flood can stall
    its loop), which its own check brings within a second or two. Waits
    up to 3 s for a loss reported; else the last reply's."""
    lost: dict[str, int] = {}

    def reported() -> bool:
        nonlocal lost
        lost = client.denials()["lost"]
        return lost_any(lost)
    wait_until(reported, 3, interval=0.2)
    return lost


def accounted(counts: dict[str, Any], client: Client) -> bool:
    """Every denial the kernel counted was received, or what was not is
    reported lost (the `denials` reply's `lost`): never an exact count the
    kernel may drop under load. Whether everything was received."""
    if counts["kernel"] is not None and counts["received"] == counts["kernel"]:
        return True
    assert counts["kernel"] is None or counts["received"] <= counts["kernel"], counts
    lost = reported_lost(client)
    reported = lost_any(lost)
    if counts["kernel"] is None:   # the `deallocated` record itself lost
        assert reported, (counts, lost)
        return False
    if not reported:
        # The kernel logs nothing, and counts nothing lost, while audit
        # is off: switched off and on again under the test.
        pytest.skip(f"machine setting changed under the test: the kernel counted {counts['kernel']} "
                    f"denial(s), {counts['received']} record(s) came and none was lost ({lost}): audit "
                    "was switched off meanwhile")
    return False


def sh(client: Client, script: str, **kwargs: Any) -> Run:
    return run(client, "sh", [script], **kwargs)


class Pipes:
    """stdin (/dev/null), stdout and stderr pipes for a long-running child."""

    def __init__(self) -> None:
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()

    @property
    def fds(self) -> dict[str, int]:
        return {"stdin": self.null, "stdout": self.out_w, "stderr": self.err_w}

    def spawned(self) -> None:
        """Drop our copies of the child's ends."""
        for fd in (self.null, self.out_w, self.err_w):
            os.close(fd)
        self.null = self.out_w = self.err_w = -1

    def line(self, timeout: float = 10) -> str:
        return read_line(self.out_r, timeout).decode().strip()

    def close(self) -> None:
        for fd in (self.null, self.out_r, self.out_w, self.err_r, self.err_w):
            if fd >= 0:
                os.close(fd)


def spawn_bg(client: Client, name: str, args: Sequence[str] = (), **kwargs: Any) -> tuple[Child, Pipes]:
    pipes = Pipes()
    try:
        child = client.spawn(name, args, **pipes.fds, **kwargs)
    except BaseException:
        pipes.close()
        raise
    pipes.spawned()
    return child, pipes


# ---- the raw protocol -------------------------------------------------------

def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    s.connect(path)
    s.settimeout(10)
    return s


def send_raw(s: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg([data], anc)


def send(s: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    send_raw(s, json.dumps({"v": 1, **message}).encode(), fds)


# Events the supervisor sends unasked where the host's audit is on: a client
# reads on past them to what it waits for (docs/protocol.md).
UNASKED = frozenset({"denied", "settled"})


def recv(s: socket.socket, unasked: bool = False) -> dict[str, Any] | None:
    """One message (None at EOF), past the `denied` and `settled` events
    unless unasked; any fds that came are closed."""
    while True:
        data, anc, _, _ = s.recvmsg(1 << 17, socket.CMSG_SPACE(64 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[:len(payload) - len(payload) % 4])
                for fd in arr:
                    os.close(fd)
        message = json.loads(data) if data else None
        if unasked or message is None or message.get("event") not in UNASKED:
            return message


def request(path: str, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any] | None:
    """One request on a fresh connection; its first reply."""
    with connect(path) as s:
        send(s, message, fds)
        return recv(s)


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def unix_socket_paths(inodes: set[str]) -> list[str]:
    """Bound paths (or @abstract names) of these Unix socket inodes."""
    out = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[6] in inodes:
                out.append(parts[7])
    return out
