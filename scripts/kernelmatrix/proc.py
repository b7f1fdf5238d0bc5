"""Child processes in their own process groups with their output in a log, progress lines, and the two ways a kernel fails."""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

T0 = time.monotonic()
_print_lock = threading.Lock()
_children: set[int] = set()  # process groups of what runs now, killed on ^C or SIGTERM


class Skip(Exception):
    """The kernel cannot be had (e.g. the archive no longer serves it)."""


class Fail(Exception):
    """Preparing or running the kernel went wrong: the matrix fails."""


def say(msg: str) -> None:
    with _print_lock:
        print(f"[{time.monotonic() - T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> NoReturn:
    """Usage or host setup error: exit 2, not 1 (a kernel failed)."""
    print(f"multikernel: {msg}", file=sys.stderr)
    sys.exit(2)


def spawn(cmd: Sequence[Any], log: Path, timeout: float, **kw: Any) -> int | None:
    """Run cmd in its own process group with its output appended to log;
    return its exit status, None if it timed out (the group is killed:
    runs its guest's processes as host processes, which must go too)."""
    with open(log, "ab") as out:
        out.write(f"\n$ {shlex.join(map(str, cmd))}\n".encode())
        out.flush()
        try:
            p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, **kw)
        except OSError as e:
            raise Fail(f"cannot run {cmd[0]}: {e}")
        _children.add(p.pid)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            try:
                os.killpg(p.pid, 9)  # leftovers, or the whole timed-out group
            except ProcessLookupError:
                pass
            p.wait()
            _children.discard(p.pid)


def kill_children() -> None:
    for pgid in list(_children):
        try:
            os.killpg(pgid, 9)
        except ProcessLookupError:
            pass


def run(cmd: Sequence[Any], log: Path, timeout: float = 600, **kw: Any) -> None:
    """spawn() that raises Fail unless cmd succeeds."""
    rc = spawn(cmd, log, timeout, **kw)
    if rc is None:
        raise Fail(f"{Path(str(cmd[0])).name} timed out after {timeout}s (log: {log})")
    if rc:
        raise Fail(f"`{shlex.join(map(str, cmd[:4]))}...` exited {rc} (log: {log})")


def sha(*parts: bytes | Path) -> str:
    """A short digest of byte strings and files' contents: a cache key."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else Path(part).read_bytes())
    return h.hexdigest()[:16]
