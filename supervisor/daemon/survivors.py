"""What outlives a session: its members found in /proc, pinned by pidfd and signalled; crash records for the next supervisor.

A session id (like a pgid) is not reused while a process has it, but the
number is free again once the last one is gone: whatever is signalled
here by number is checked first, and once pinned by a pidfd, again.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable

from . import peers, procfs, reap

Owned = Callable[[int], bool]


def killpg(pgid: int, sig: int) -> bool:
    """Whether the group had a process to signal."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def leftovers(sid: int, supervisor: int, owned: Owned, stats: Iterable[tuple[int, list[str]]],
              pidfd_open: Callable[[int], int] = os.pidfd_open,
              fields_of: Callable[[int], list[str]] = procfs.stat_fields,
              descends: Callable[[int, int], bool] = peers.descends_from) -> list[int]:
    """pidfds of the processes still in session sid, a reaped child's. A
    process now leading sid is another's session (nothing of ours is left),
    and a member must still be in sid once pinned, and descend from us (as
    subreaper, the leftovers of our children are ours)."""
    if owned(sid):
        return []
    try:
        fields_of(sid)
        return []   # pid sid is alive: the number was reused, so the session it named is empty
    except OSError:
        pass
    fds = []
    for pid in procfs.session_members(sid, stats):
        try:
            fd = pidfd_open(pid)
        except OSError:
            continue
        try:
            if int(fields_of(pid)[3]) == sid and descends(pid, supervisor):
                fds.append(fd)
                continue
        except (OSError, ValueError, IndexError):
            pass
        os.close(fd)
    return fds


def signal_leftovers(sid: int, sig: int, supervisor: int, owned: Owned) -> int:
    """Signal, by pidfd, what leftovers() finds; how many were signalled."""
    count = 0
    for fd in leftovers(sid, supervisor, owned, procfs.stats()):
        try:
            signal.pidfd_send_signal(fd, sig)  # gone meanwhile: ESRCH; its pid never anyone else's
            count += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return count


def kill_session(sid: int, start: str) -> int:
    """KILL every process of session sid, unless pid sid is a newer process."""
    try:
        if procfs.stat_fields(sid)[19] != start:
            return 0
    except (OSError, IndexError):
        pass  # the leader is gone; its session id cannot be reused while members live
    killed = 0
    for pid in procfs.session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


class Records:
    """One empty file per running session, named SID.STARTTIME, in a
    directory that outlives the supervisor: PDEATHSIG ends direct children
    only, so a crashed supervisor's sessions may still have members, which
    the next one ends at its start. None: no records (private mode, whose
    proxy's lifetime bounds the children)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def end_survivors(self, log: Callable[[str], None]) -> None:
        if self.directory is None:
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        for name in os.listdir(self.directory):
            sid_text, _, start = name.partition(".")
            if sid_text.isdigit():
                killed = kill_session(int(sid_text), start)
                if killed:
                    log(f"ended {killed} process(es) left from session {sid_text} by a previous supervisor")
            os.unlink(os.path.join(self.directory, name))

    def add(self, pid: int) -> str | None:
        if self.directory is None:
            return None
        try:
            path = os.path.join(self.directory, f"{pid}.{procfs.stat_fields(pid)[19]}")
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            return path
        except (OSError, IndexError):
            return None

    @staticmethod
    def remove(path: str | None) -> None:
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def end_descendants(supervisor: int) -> None:
    """At the end: the supervisor's reparented descendants that outlived
    their session's leader; killing one orphans its own children to us in turn."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        left = procfs.children_of(supervisor)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in reap.reap_all():
            pass
        time.sleep(0.01)
