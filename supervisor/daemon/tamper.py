"""Whether a process that waited is still as it was forked: its state, its limits and its scheduling, what another process of its uid could have changed meanwhile (a warm server before its hand-over).

Pure where it can be (`as_forked`, `limits_tampered`, `parse_limits`:
tests/unit/test_warm_rules.py); `Forked.tampered` looks at a live process,
and any failure to look is a reason.
"""
from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import astuple, dataclass

from landlock import enter

from . import procfs
from ..zygote.pools import proc_limits

_SCHED_RESET_ON_FORK = 0x40000000
_KEPT_POLICIES = (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE)
# procfs.parse_stat's indexes of nice and policy (proc_pid_stat(5)'s fields 19
# and 41; the policy without SCHED_RESET_ON_FORK, which a fork clears)
_NICE, _POLICY = 16, 38


@dataclass(frozen=True)
class Scheduling:
    """What another process of the server's uid could change while it waits."""
    policy: int
    nice: int
    affinity: frozenset[int]
    ioprio: int = -1   # (ioprio_set checks uids only, as renice does)


def as_forked(policy: int, nice: int, affinity: frozenset[int], ioprio: int = -1) -> Scheduling:
    """A child's scheduling, forked by a zygote with these: its
    SCHED_RESET_ON_FORK makes a real-time or deadline policy SCHED_OTHER
    and a negative nice 0 (zygote.main._reset_scheduling); the child's
    own steps make a real-time I/O class best-effort (enter.reset_io_priority)."""
    ioprio = enter.io_priority_after_reset(ioprio) if ioprio >= 0 else ioprio
    if not policy & _SCHED_RESET_ON_FORK:
        return Scheduling(policy, nice, affinity, ioprio)
    policy &= ~_SCHED_RESET_ON_FORK
    return Scheduling(policy if policy in _KEPT_POLICIES else os.SCHED_OTHER, max(nice, 0), affinity, ioprio)


def scheduling_of(pid: int) -> Scheduling:
    return Scheduling(os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid),
                      frozenset(os.sched_getaffinity(pid)), enter.io_priority_of(pid))


def _below(soft: int, floor: int) -> bool:
    """soft < floor, RLIM_INFINITY above every number."""
    return soft != resource.RLIM_INFINITY and (floor == resource.RLIM_INFINITY or soft < floor)


def limits_tampered(now: Mapping[int, tuple[int, int]], forked: Mapping[int, tuple[int, int]]) -> str | None:
    """A hard limit changed, or a soft one below what it was forked with
    (raising a soft limit, as node does with NOFILE, is not tampering)."""
    for res, (soft, hard) in forked.items():
        got_soft, got_hard = now.get(res, (soft, hard))
        if got_hard != hard:
            return f"its hard limit {res} is {got_hard}, not {hard}"
        if _below(got_soft, soft):
            return f"its soft limit {res} is {got_soft}, below {soft}"
    return None


def parse_limits(text: bytes) -> dict[int, tuple[int, int]]:
    """/proc/PID/limits (readable by anyone, where prlimit(2) of another uid
    and gid needs CAP_SYS_RESOURCE): resource -> (soft, hard), its lines in
    the resources' order, each "%-25s %-20s %-20s %-10s"."""
    return {res: (_limit(line[26:46]), _limit(line[47:67])) for res, line in enumerate(text.splitlines()[1:])}


def _limit(field: bytes) -> int:
    return resource.RLIM_INFINITY if field.strip() == b"unlimited" else int(field)


def limits_of(pid: int) -> dict[int, tuple[int, int]]:
    text = proc_limits(pid)
    if text is None:
        raise OSError(0, f"/proc/{pid}/limits cannot be read")
    return parse_limits(text)


class Forked:
    """A waiting process and what it was forked with. Its /proc/PID/stat and
    limits are opened once, at its fork, and read again (pread) when asked:
    a hand-over waits for tampered() and walks no path; the files stay that
    process's, whatever takes its pid later (a read then fails: ESRCH)."""

    def __init__(self, pid: int, limits: Mapping[int, tuple[int, int]], scheduling: Scheduling) -> None:
        self.pid, self.limits, self.scheduling = pid, limits, scheduling
        self.as_tuple = astuple(scheduling)   # compared as one at hand-over: no Scheduling made on its path
        self.fds: list[int] = []
        for name in ("stat", "limits"):
            self.fds.append(os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def tampered(self) -> str | None:
        """Why it is not as it was forked, or None; any failure to look is
        a reason. Its state, nice and policy from /proc/PID/stat."""
        try:
            fields = procfs.parse_stat(os.pread(self.fds[0], 4096, 0))
        except (OSError, IndexError, ValueError):
            fields = []
        state = fields[0] if fields else None
        if state in (None, "T", "t", "Z", "X"):
            return f"it is in state {state or 'gone'} (stopped, traced or dead)"
        try:
            why = limits_tampered(parse_limits(os.pread(self.fds[1], 8192, 0)), self.limits)
            now = (int(fields[_POLICY]), int(fields[_NICE]), frozenset(os.sched_getaffinity(self.pid)),
                   enter.io_priority_of(self.pid))
        except (OSError, IndexError, ValueError) as e:
            return f"it cannot be looked at: {e}"
        if why is None and now != self.as_tuple:
            why = f"its scheduling is {Scheduling(*now)}, not {self.scheduling} as forked"
        return why
