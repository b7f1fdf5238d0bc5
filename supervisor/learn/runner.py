"""One confined run of a manifest through a private supervisor, its MCP session driven, and what it did.

The same code path as `run --manifests`: the server gets the argv,
environment, cwd, uid and state directory the supervisor will give it.
What a run saw comes from its strace files; what it was denied comes from a
`DenialSource`: strace's EACCES, and where the supervisor reads them the
kernel's own audit records (the validation manifests ask for every denial
with `log: [new_exec_on]`, which under the default `count` mode is detail
for that manifest alone: no host setting is changed).
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client.sync import SupervisorError
from ..errors import Code
from ..client.private import PrivateStartFailed, start
from .session import Outcome, drive
from .trace import BIND_TCP, CONNECT_TCP, CREATE, EXEC, LIST, READ, REMOVE, STRACE, WRITE, Access, read_tasks

MAX_TRACE_BYTES = 512 << 20   # all of a run's trace files: a server could write there too
_STDERR_TAIL = 2000


class RunFailed(RuntimeError):
    """The supervisor could not start or spawn (unavailable: Landlock is missing)."""

    def __init__(self, message: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


@dataclass
class Run:
    outcomes: list[Outcome]
    status: int | None
    stderr: str
    trace_dir: str
    cwd: str
    seconds: float
    uid: int
    gids: tuple[int, ...] = field(default=())
    denied: list[dict[str, Any]] = field(default_factory=list)   # the supervisor's `denied` events
    tracer: int = 0        # the spawned pid: strace itself, whose own accesses are not the server's


DenialSource = Callable[[Run], list[Access]]


def run(manifest: str, name: str, state_root: str, plan: Sequence[dict[str, Any]], *, timeout: float,
        start_timeout: float, trace_dir: str, cwd: str, stderr_path: str, uid: int, gids: tuple[int, ...],
        dynamic_uids_of: str | None = None) -> Run:
    started = time.monotonic()
    log = os.path.join(os.path.dirname(stderr_path), "supervisor.log")
    saved, quiet = os.dup(2), os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(quiet, 2)   # its log (state handed over to the uid...) is the scratch's business, not the user's
    try:
        client = start([manifest], state_root=state_root, only=name,
                       extra_args=["--dynamic-uids-of", dynamic_uids_of] if dynamic_uids_of else [])
    except PrivateStartFailed as e:
        raise RunFailed(f"the private supervisor did not start: {e}: {_tail(log).strip()}") from None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)
    try:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            child = client.spawn(name, stdin=in_r, stdout=out_w, stderr=err)
        except SupervisorError as e:
            raise RunFailed(str(e), unavailable=e.code == Code.CONFINEMENT_UNAVAILABLE) from None
        except (OSError, TimeoutError) as e:
            raise RunFailed(f"spawn: {e}") from None
        finally:
            for fd in (in_r, out_w, err):
                os.close(fd)
        with child:
            try:
                outcomes = drive(in_w, out_r, plan, timeout, start_timeout)
            finally:
                os.close(in_w)
            status = _finish(child)
            child.settle()   # denials whose records came after its `exited`
        os.close(out_r)
    finally:
        client.close()
    return Run(outcomes, status, _tail(stderr_path), trace_dir, cwd, time.monotonic() - started, uid, gids,
               list(child.denied), child.pid)


def _finish(child: Any) -> int | None:
    """Its stdin closed: the exit it makes of its own, else TERM (strace
    detaches and writes what it holds), else KILL."""
    for sig, wait in ((None, 3.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            try:
                child.signal(sig)
            except (OSError, SupervisorError, TimeoutError):
                pass
        try:
            return int(child.wait(wait))
        except TimeoutError:
            continue
        except (OSError, SupervisorError):
            return None
    return None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _STDERR_TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def trace_files(trace_dir: str) -> Iterator[tuple[str, list[str]]]:
    """Each task's lines. Opened without following links nor blocking (a
    FIFO), regular files only, bounded in size: the server shares the
    directory with strace and could plant any of them. What it could forge
    there it could also have done."""
    budget = MAX_TRACE_BYTES
    try:
        names = sorted(os.listdir(trace_dir))
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(trace_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = f.read(budget)
        budget -= len(data)
        yield name, data.decode(errors="surrogateescape").splitlines()
        if budget <= 0:
            return


def accesses(r: Run) -> list[Access]:
    """Everything the traced run did that Landlock checks, less the denials
    the file modes alone explain (Landlock comes after DAC, and a trace
    cannot tell the two apart: a PATH search through /root, say)."""
    files = ((name.rpartition(".")[2], lines) for name, lines in trace_files(r.trace_dir))
    return [a for a in read_tasks(files, r.cwd) if not (a.denied and a.path and dac_denies(a, r.uid, r.gids))]


def strace_denials(r: Run) -> list[Access]:
    """The DenialSource of a traced run: EACCES and EXDEV on checked calls."""
    return [a for a in accesses(r) if a.denied]


# A denied right -> the access it stands for (a record names the directory
# for the make_* and remove_* rights, as a CREATE or REMOVE does).
_KIND_OF_RIGHT = {"fs.execute": EXEC, "fs.read_file": READ, "fs.read_dir": LIST, "fs.write_file": WRITE,
                  "fs.truncate": WRITE, "fs.remove_dir": REMOVE, "fs.remove_file": REMOVE}


def audit_denials(r: Run) -> list[Access]:
    """The DenialSource of the kernel's own word: the `denied` events the
    supervisor read from the audit log while this run was confined
    (where it reads them). It sees what a trace cannot: the kernel's
    execute checks inside execve, io_uring. The tracer's own (strace reads
    /proc/sys/kernel/pid_max and its tracees' /proc files) are not the
    server's: left out."""
    out = []
    for event in r.denied:
        rights, obj = event.get("rights") or [], str(event.get("object") or "")
        process = event.get("process") or {}
        if process.get("pid") == r.tracer and process.get("exe") == STRACE:
            continue
        evidence, program = "an audit record", str(process.get("comm") or "")
        if event.get("kind") == "tcp":
            address, _, port = obj.rpartition(":")
            kind = CONNECT_TCP if "net.connect_tcp" in rights else BIND_TCP
            out.append(Access(kind, port=int(port) if port.isdigit() else 0, denied=True, evidence=evidence,
                              program=program, address=address.strip("[]")))
            continue
        if event.get("kind") != "path":
            continue
        kinds = {_KIND_OF_RIGHT.get(right, CREATE if right.startswith("fs.make_") else "") for right in rights}
        out += [Access(kind, obj, denied=True, evidence=evidence, program=program) for kind in sorted(kinds - {""})]
    return out


def dac_denies(a: Access, uid: int, gids: tuple[int, ...]) -> bool:
    """The mode bits alone deny this access to uid (ACLs not read)."""
    if uid == 0:
        return False
    path = a.path
    want = {READ: 4, EXEC: 1, WRITE: 2, CREATE: 3, REMOVE: 3}.get(a.kind, 4)
    ancestors = []
    d = os.path.dirname(path)
    while d != "/":
        ancestors.append(d)
        d = os.path.dirname(d)
    try:
        for d in ancestors:
            if not _allows(os.stat(d), uid, gids, 1):
                return True
        return not _allows(os.stat(path), uid, gids, want)
    except OSError:
        return False


def _allows(st: os.stat_result, uid: int, gids: tuple[int, ...], want: int) -> bool:
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
    return (st.st_mode >> shift) & want == want


def strace_libraries() -> list[str]:
    """The shared libraries strace loads (ldd's list), resolved."""
    try:
        out = subprocess.run(["ldd", STRACE], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({os.path.realpath(w) for line in out.splitlines() for w in line.split() if w.startswith("/")})
