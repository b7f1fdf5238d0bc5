"""Entering a prepared confinement: the system calls made in the process to
confine, between fork and exec.

An `Entry` is plain data (ints and tuples), built by landlock.prepare() in a
parent, so a process that only forks can receive one (by marshal) and run
these steps without importing the rest of this package: every module a
forking process holds makes each of its forks slower. Hence the imports here
are the C modules and syscalls (ctypes) only.
"""
import collections
import errno
import os
import resource
from collections.abc import Callable

import _prctl
import prctl

from . import syscalls

# credentials: (uid, gid, groups) to switch to, or None to stay;
# drop_capabilities: None, or the capabilities still in the bounding set,
#   all of which go (then ambient, inheritable, permitted and effective);
# lock_securebits: root stays powerless for good (needs CAP_SETPCAP);
# rlimits: ((resource, soft, hard), ...), already clamped;
# restrict_flags: landlock_restrict_self() flags;
# canary: a file of this child's alone (an unpredictable name, made by the
#   supervisor's side for each fork), which the domain denies: opened for
#   writing once after restrict_self, it makes the audit log name the new
#   domain with that file (None: audit not read).
Entry = collections.namedtuple(
    "Entry", "credentials drop_capabilities lock_securebits rlimits restrict_flags canary",
    defaults=(None,))
# (stage, step(entry, ruleset_fd)): the stage names a failure (see STEPS).
Step = tuple[str, Callable[[Entry, int], None]]

# No fixups on uid changes, no caps for uid 0 on exec, and nobody (not even
# this process) may unset that.
SECUREBITS = (_prctl.SECBIT_NOROOT | _prctl.SECBIT_NOROOT_LOCKED
              | _prctl.SECBIT_NO_SETUID_FIXUP | _prctl.SECBIT_NO_SETUID_FIXUP_LOCKED
              | _prctl.SECBIT_KEEP_CAPS_LOCKED)


def thread_count(stat_fd: int | None = None) -> int:
    """Threads of this process. Pass an fd of /proc/self/stat opened before
    restrict_self: afterwards /proc may be out of reach."""
    fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC) if stat_fd is None else stat_fd
    try:
        data = os.pread(fd, 4096, 0)
    finally:
        if stat_fd is None:
            os.close(fd)
    # Fields after the parenthesised comm (which may hold spaces); num_threads is the 20th.
    return int(data[data.rindex(b")") + 2:].split()[17])


def switch_user(uid: int, gid: int, groups: tuple[int, ...]) -> None:
    """setgroups, setgid, setuid; then verified, root's way back included."""
    if os.geteuid() != 0 and (uid, gid) != (os.getuid(), os.getgid()):
        raise PermissionError(errno.EPERM, "changing user needs root")
    os.setgroups(list(groups))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3:
        raise PermissionError(errno.EPERM, "uid/gid change did not take")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PermissionError(errno.EPERM, "uid drop is reversible")


def drop_capabilities(bounding: tuple[int, ...], lock_securebits: bool) -> None:
    """Each bounding-set drop commits new credentials (~5 us in the kernel):
    only the capabilities still there are dropped."""
    for cap in bounding:
        _prctl.prctl(_prctl.PR_CAPBSET_DROP, cap)
    if lock_securebits:
        _prctl.prctl(_prctl.PR_SET_SECUREBITS, SECUREBITS)
    syscalls.clear_ambient_capabilities()
    syscalls.clear_capabilities()


def drop_privileges(entry: Entry) -> None:
    """Switch credentials, then drop capabilities: both for a switch to uid 0,
    which keeps them all (setgroups and setgid need them first)."""
    if entry.credentials is not None:
        switch_user(*entry.credentials)
    if entry.drop_capabilities is not None:
        drop_capabilities(entry.drop_capabilities, entry.lock_securebits)


def restrict(entry: Entry, ruleset_fd: int) -> None:
    """no_new_privs, then the Landlock domain (none when ruleset_fd is -1),
    then the canary."""
    prctl.set_no_new_privs(1)
    if ruleset_fd >= 0:
        syscalls.restrict_self(ruleset_fd, entry.restrict_flags)
        if entry.canary is not None:
            mark_domain(entry.canary)


def mark_domain(canary: str) -> None:
    """One denied open for writing, before exec, so logged whatever the
    flags: its audit record names the domain and the file canary, which
    only this child was told (a manifest reading everything is denied it
    too). Nothing is logged if the domain allows it (a manifest granting
    writes there): the domain then stays unknown to the supervisor."""
    try:
        os.close(os.open(canary, os.O_WRONLY | os.O_CLOEXEC))
    except OSError:
        pass


def set_rlimits(entry: Entry) -> None:
    """Last before exec (STEPS): a memory limit can break the Python that sets it."""
    for res, soft, hard in entry.rlimits:
        resource.setrlimit(res, (soft, hard))


# No keyrings in the kernel (CONFIG_KEYS=n), or a sandbox (gVisor) without them.
NO_KEYRINGS = (errno.ENOSYS, errno.EOPNOTSUPP)


def join_session_keyring() -> None:
    """A new anonymous session keyring: the keys of the caller's session
    (the supervisor's, a login's) out of reach, and none planted for the
    next child. Before the uid switch, so it is charged to root's key quota,
    not the server's. Nothing on a kernel without keyrings
    (support.keyrings_available() says which)."""
    try:
        syscalls.keyctl(syscalls.KEYCTL_JOIN_SESSION_KEYRING, None)
    except OSError as e:
        if e.errno not in NO_KEYRINGS:
            raise


# sched_getscheduler() ORs this into the policy.
_SCHED_RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)
_SCHED_DEADLINE = 6
_REALTIME = {os.SCHED_FIFO, os.SCHED_RR, _SCHED_DEADLINE}
# What ioprio_set/ioprio_get may answer on a kernel without them, or without
# the I/O scheduler's classes.
_NO_IOPRIO = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)
_BEST_EFFORT_DEFAULT = syscalls.IOPRIO_CLASS_BE << syscalls.IOPRIO_CLASS_SHIFT | 4


def reset_scheduling() -> None:
    """A real-time or deadline policy becomes SCHED_OTHER, a negative nice 0,
    a real-time I/O class best-effort: a confined process must not starve
    whatever started it (a real-time supervisor's children are real-time)."""
    if os.sched_getscheduler(0) & ~_SCHED_RESET_ON_FORK in _REALTIME:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    if os.getpriority(os.PRIO_PROCESS, 0) < 0:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    reset_io_priority()


def io_priority_after_reset(ioprio: int) -> int:
    """What reset_io_priority leaves of an I/O priority. Pure."""
    return _BEST_EFFORT_DEFAULT if ioprio >> syscalls.IOPRIO_CLASS_SHIFT == syscalls.IOPRIO_CLASS_RT else ioprio


def io_priority_of(pid: int = 0) -> int:
    """A process's I/O priority; -1 where the kernel has none to give."""
    try:
        return syscalls.ioprio_get(pid)
    except OSError as e:
        if e.errno not in _NO_IOPRIO:
            raise
        return -1


def reset_io_priority() -> None:
    """Only the I/O class: SCHED_RESET_ON_FORK does the rest for a fork-server's
    children, but leaves their I/O priority as it was."""
    ioprio = io_priority_of()
    if ioprio != io_priority_after_reset(ioprio):
        syscalls.ioprio_set(_BEST_EFFORT_DEFAULT)


# The steps that confine a process, in order, for both of its paths: a
# supervisor's child (supervisor/zygote/child.py) and landlock-exec
# (enforce.exec_confined; enforce.apply takes STEPS whole). Each path runs
# CONFINE, its own steps, then LAST, and exec:
#
#   supervisor's child                 landlock-exec
#   (a terminal as stdio: refused by    adoptable_terminals: refused unless
#    the supervisor unless allowed)     --allow-terminal
#   signals, request, stdio, close_fds  reset_scheduling (the zygote's children
#                                       start reset: SCHED_RESET_ON_FORK, once)
#   helper                              - (it hands its exec to nobody)
#   setsid                              detach_terminal (setsid or TIOCNOTTY;
#                                       not with --keep-session)
#   CONFINE: keyring, privileges, confine (a supervisor's child has its
#            session gid put in the Entry's credentials; landlock-exec takes
#            --user's group: it runs one command, no sessions to keep apart)
#   chdir + umask, pdeathsig            - (it runs where it was started, with
#                                       its umask, and has no supervisor to die with)
#   wait (a pooled child)               its report, the thread check, signals
#   LAST: rlimits
#   exec                                exec
#
# keyring before privileges: the new keyring is charged to the caller's key
# quota, not the target user's; rlimits last: a memory or NOFILE limit can
# break the Python still running.
CONFINE: tuple[Step, ...] = (
    ("keyring", lambda entry, ruleset_fd: join_session_keyring()),
    ("privileges", lambda entry, ruleset_fd: drop_privileges(entry)),
    ("confine", lambda entry, ruleset_fd: restrict(entry, ruleset_fd)),
)
LAST: tuple[Step, ...] = (
    ("rlimits", lambda entry, ruleset_fd: set_rlimits(entry)),
)
STEPS = CONFINE + LAST
