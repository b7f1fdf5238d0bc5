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

from landlock import enter, syscalls

from . import procfs
from ..zygote.pools import proc_limits

_SCHED_RESET_ON_FORK = 0x40000000   # (sched_getscheduler's bit; sched_getattr's SCHED_FLAG_RESET_ON_FORK)
# A child's utilization clamps after a fork that resets them (uclamp_none:
# 0 and SCHED_CAPACITY_SCALE), or what sched_getattr says of every task on a
# kernel without them (no CONFIG_UCLAMP_TASK, whose sysctl this is).
CLAMPS_RESET = (0, 1024) if os.path.exists("/proc/sys/kernel/sched_util_clamp_max") else (0, 0)


@dataclass(frozen=True)
class Scheduling:
    """What another process of the server's uid could change while it waits
    (the scheduler's calls and ioprio_set check uids only)."""
    policy: int
    nice: int
    affinity: frozenset[int]
    ioprio: int = -1
    slice: int = 0                     # a fair task's time slice, ns (0: not compared)
    clamps: tuple[int, int] = (0, 0)   # utilization clamps, min and max


def as_forked(zygote: Scheduling, clamps_reset: tuple[int, int] = CLAMPS_RESET) -> Scheduling:
    """A child's scheduling, forked by a zygote with these. Under the
    zygote's SCHED_RESET_ON_FORK (zygote.main._reset_scheduling) the child
    of a real-time or deadline zygote is SCHED_OTHER with a nice of 0, the
    child of a fair one keeps its policy with a nice of at least 0; both
    get the kernel's default time slice (the zygote's own, as it drops any
    of its own at start; not known under a real-time zygote, so not
    compared) and no utilization clamps. The child's own steps make a
    real-time I/O class best-effort (enter.reset_io_priority)."""
    policy, nice, affinity, ioprio, slice_, clamps = astuple(zygote)
    ioprio = enter.io_priority_after_reset(ioprio) if ioprio >= 0 else ioprio
    if not policy & _SCHED_RESET_ON_FORK:
        return Scheduling(policy, nice, affinity, ioprio, slice_, clamps)
    policy &= ~_SCHED_RESET_ON_FORK
    if policy in syscalls.FAIR_POLICIES:
        return Scheduling(policy, max(nice, 0), affinity, ioprio, slice_, clamps_reset)
    return Scheduling(os.SCHED_OTHER, 0, affinity, ioprio, 0, clamps_reset)


def scheduling_of(pid: int) -> Scheduling:
    attr = syscalls.sched_getattr(pid)
    policy = attr.policy | (_SCHED_RESET_ON_FORK if attr.flags & syscalls.SCHED_FLAG_RESET_ON_FORK else 0)
    nice = os.getpriority(os.PRIO_PROCESS, pid)   # (sched_getattr gives a real-time task's as 0)
    return Scheduling(policy, nice, frozenset(os.sched_getaffinity(pid)), enter.io_priority_of(pid),
                      attr.runtime if attr.policy in syscalls.FAIR_POLICIES else 0, (attr.util_min, attr.util_max))


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
        # /proc/PID/limits as last read and found untampered (note()): the
        # same text again needs no parsing on a hand-over's path.
        self.passed = b""
        try:
            for name in ("stat", "limits"):
                self.fds.append(os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self.close()   # (the caller never gets an object to close: out of fds, the first stays open else)
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def note(self) -> None:
        """Its limits read now, kept if untampered (off a hand-over's path:
        as it becomes ready, and again while it waits, after node, say,
        raised its own soft NOFILE). Never a verdict: tampered() gives that."""
        try:
            text = os.pread(self.fds[1], 8192, 0)
        except (OSError, IndexError):
            return
        if text != self.passed and limits_tampered(parse_limits(text), self.limits) is None:
            self.passed = text

    def tampered(self) -> str | None:
        """Why it is not as it was forked, or None; any failure to look is
        a reason. Its state from /proc/PID/stat, its policy, nice, slice
        and clamps from one sched_getattr (a real-time policy, which would
        show a nice of 0, is no policy it was forked with)."""
        try:
            state: str | None = procfs.state_of(os.pread(self.fds[0], 4096, 0))
        except (OSError, IndexError, ValueError):
            state = None
        if state in (None, "T", "t", "Z", "X"):
            return f"it is in state {state or 'gone'} (stopped, traced or dead)"
        try:
            text = os.pread(self.fds[1], 8192, 0)
            why = None if text == self.passed else limits_tampered(parse_limits(text), self.limits)
            attr = syscalls.sched_getattr(self.pid)
            now = (attr.policy, attr.nice, frozenset(os.sched_getaffinity(self.pid)), enter.io_priority_of(self.pid),
                   attr.runtime if self.scheduling.slice else 0, (attr.util_min, attr.util_max))
        except (OSError, IndexError, ValueError) as e:
            return f"it cannot be looked at: {e}"
        if why is None and now != self.as_tuple:
            why = f"its scheduling is {Scheduling(*now)}, not {self.scheduling} as forked"
        return why
