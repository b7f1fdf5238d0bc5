"""A child of the zygote, from fork to exec: its steps in order; a failure goes back as "stage:errno:message".

Children are made by clone(CLONE_PARENT): they are the supervisor's,
exactly as if it had forked them. It reaps them, it is their PDEATHSIG
parent, and their orphans come back to it as subreaper.

Everything a child needs was prepared before the fork (by the supervisor,
or by the zygote once per message): every object made between fork and
exec costs each spawn copy-on-write faults. The shared steps and their
order are landlock.enter.CONFINE and LAST, which landlock-exec takes too.
"""
from __future__ import annotations

import collections
import ctypes
import errno
import os
import resource
import _signal
import _socket as socket

import prctl

from landlock import enter

from . import messages
from .messages import ChildFailure

# Every stage a child can fail at, in its order (a pooled child takes
# "stdio" after "tampered" instead); docs/protocol.md lists them.
STAGES = ("signals", "request", "stdio", "close_fds", "helper", "setsid", *(stage for stage, _ in enter.CONFINE),
          "chdir", "pdeathsig", "wait", "tampered", *(stage for stage, _ in enter.LAST), "exec")

ALL_SIGNALS = _signal.valid_signals()
# Compared in a pooled child without a session gid of its own (another
# process with its uid and gid may prlimit it while it waits).
_RLIMITS = tuple(range(16))

# The zygote's own, the same for every child: its parent (the supervisor),
# the signals a child puts back to their defaults, its /proc/self/stat (to
# count its threads), whether helpers run SCHED_BATCH (see main).
Zygote = collections.namedtuple("Zygote", "supervisor reset stat_fd helper_batch")

# clone(CLONE_PARENT | CLONE_CHILD_CLEARTID | SIGCHLD, no new stack): the
# child_tid argument is the 4th on x86_64, the 5th on the others here
# (CLONE_BACKWARDS); the rest are zeros.
_CLONE_NR = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "ppc64le": 120, "armv7l": 120, "i686": 120}
_CLONE_VM = 0x00000100
_CLONE_PARENT = 0x00008000
_CLONE_CHILD_CLEARTID = 0x00200000
_SIGCHLD = 17
MACHINE = os.uname().machine
# PyDLL: the call keeps the GIL, so the child comes back holding it, as after os.fork.
syscall = ctypes.PyDLL(None, use_errno=True).syscall
syscall.restype = ctypes.c_long
_libc = ctypes.CDLL(None, use_errno=True)
_clone = _libc.clone
_clone.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
# The helper's: a mutex (>= sizeof(pthread_mutex_t) everywhere) and a stack,
# made here once; each child has its own copy of both.
_mutex = ctypes.create_string_buffer(64)
_stack = ctypes.create_string_buffer(16384)
_STACK_TOP = (ctypes.addressof(_stack) + len(_stack)) & ~15
_HELPER_RUNS = ctypes.cast(_libc.pthread_mutex_lock, ctypes.c_void_p)
# The same for every fork: built once.
_CLONE_ARGS: list[object] = [ctypes.c_long(_CLONE_NR[MACHINE]),
               ctypes.c_ulong(_CLONE_PARENT | _CLONE_CHILD_CLEARTID | _SIGCHLD), None, None, None, None]
_CLONE_ARGS[4 if MACHINE == "x86_64" else 5] = ctypes.c_void_p(ctypes.addressof(_mutex))


SESSION_GID_UMASK = 0o070   # the bits a child with a session gid always masks


def make_canary(root: str | None) -> str | None:
    """One child's canary (landlock.enter.mark_domain): an empty file in the
    supervisor's canary root with a random name nobody else can learn (the
    root is root's, 0711: not listable), writable by any uid (0666: DAC
    decides before Landlock, and must let the write through to be denied by
    the domain). None without a root (denials not read) or when it cannot
    be made: that child's denials are then not attributed, and the zygote
    says why."""
    if root is None:
        return None
    path = f"{root}/{os.urandom(16).hex()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)   # whatever our umask
        finally:
            os.close(fd)
    except OSError as e:
        os.write(2, f"landlock-supervisor zygote: no canary for a child: {e}\n".encode(errors="replace"))
        return None
    return path


def remove_canary(canary: str | None) -> None:
    """A child that never ran: its canary goes (the supervisor removes the
    others once their record came)."""
    if canary is not None:
        try:
            os.unlink(canary)
        except OSError:
            pass


def lock_helper_mutex() -> None:
    """Once, before the first fork. Process-shared: a shared futex is what
    the kernel's clear-tid wakes. Locked with no owner: pthread_mutex_lock()
    sleeps until the word is 0."""
    attr = ctypes.create_string_buffer(64)
    for call, *args in ((_libc.pthread_mutexattr_init, attr), (_libc.pthread_mutexattr_setpshared, attr, 1),
                        (_libc.pthread_mutex_init, _mutex, attr)):
        if call(*args) != 0:
            raise OSError(errno.EINVAL, f"{call.__name__} failed")
    ctypes.c_int.from_buffer(_mutex).value = 1


def fork(zygote: Zygote, target: messages.Spawn | messages.Pool, gid: int | None, err_w: int, ruleset_fd: int, *,
         stdio: list[int] | None = None, request: int = -1, size: int = 0,
         handover: int = -1, helper: bool = False, canary: str | None = None) -> int:
    """Fork a child that becomes target (a messages.Spawn or Pool): a fresh
    one (stdio, and its Request in the memfd `request`) or a pooled one
    (its hand-over socket; with an exec helper if `helper`), marking its
    domain with its own `canary` (make_canary). Returns its pid; the child
    leaves by exec or os._exit."""
    if enter.thread_count(zygote.stat_fd) != 1:
        raise OSError(errno.EDEADLK, "the zygote has more than one thread: refusing to fork")
    entry = target.entry if target.entry.canary == canary else target.entry._replace(canary=canary)
    if gid is not None:
        # A gid no other process has: prlimit(2) needs the caller's uid AND
        # gid to match the target's. Made here, not in the child, where
        # every object made costs copy-on-write faults.
        uid, _, groups = entry.credentials or (0, 0, ())
        entry = entry._replace(credentials=(uid, gid, groups))
    # Blocked across fork: no handler runs in the child, which unblocks
    # them only at exec, after resetting the ones we changed.
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, ALL_SIGNALS)
    try:
        # No Python at-fork hooks run: the zygote is single-threaded and
        # imports nothing that registers one.
        pid = syscall(*_CLONE_ARGS)
        if pid < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except BaseException:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
        raise
    if pid == 0:
        _run(zygote, target, entry, gid, err_w, ruleset_fd, stdio, request, size, handover, helper)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
    return pid


def _run(zygote: Zygote, target: messages.Spawn | messages.Pool, entry: enter.Entry, gid: int | None, err_w: int,
         ruleset_fd: int, stdio: list[int] | None, request: int, size: int, handover: int, helper: bool) -> None:
    """The child: (a pooled one says "ready" on err_w, then waits for its
    request and the supervisor's error pipe), exec. Never returns."""
    stage = "signals"
    limits_set = False
    try:
        for sig in zygote.reset:
            _signal.signal(sig, _signal.SIG_DFL)
        if request >= 0:
            stage = "request"
            argv, env = messages.decode(os.pread(request, size, 0))
        if stdio is not None:
            stage = "stdio"
            # Received fds are > 2 (fds 0-2 are always open here): no clobbering.
            for fd, kept in enumerate(stdio):
                os.dup2(kept, fd)
        stage = "close_fds"
        low = 3
        for fd in sorted(fd for fd in (err_w, ruleset_fd, handover) if fd >= 0):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 0x7FFFFFFF)
        if helper:
            # Here: after the fd sweep (it holds nothing of ours), before the
            # new session (it is not in the group killed when the target
            # exits), the user change and the Landlock domain (the target
            # can neither signal nor trace it).
            stage = "helper"
            pid = max(_clone(_HELPER_RUNS, _STACK_TOP, _CLONE_VM | _CLONE_PARENT | _SIGCHLD,
                             ctypes.addressof(_mutex)), 0)
            if pid:  # else the exec tears down as usual
                os.write(err_w, b"helper %d\n" % pid)
                if zygote.helper_batch:
                    os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
        stage = "setsid"
        os.setsid()
        for stage, step in enter.CONFINE:
            step(entry, ruleset_fd)
        stage = "chdir"  # as the target user: a directory it could not enter is an error
        os.chdir(target.cwd)
        # A session gid is handed out again once its session is gone: what
        # this child makes must never be open to that later session by
        # group, whatever the manifest's umask says.
        os.umask(target.umask if gid is None else target.umask | SESSION_GID_UMASK)
        stage = "pdeathsig"
        # Armed after the uid change, which clears it; then re-check that the
        # supervisor did not die before it was armed.
        prctl.set_pdeathsig(_signal.SIGKILL)
        if os.getppid() != zygote.supervisor:
            os._exit(1)
        if handover >= 0:
            if ruleset_fd >= 0:
                os.close(ruleset_fd)
            # Without a gid of its own, a process of its uid and gid may
            # lower its limits while it waits: compared at hand-over.
            limits = None if gid is not None else tuple(map(resource.getrlimit, _RLIMITS))
            os.write(err_w, b"ready\n")
            os.close(err_w)
            err_w = -1
            stage = "wait"
            handed, fds = messages.receive(socket.socket(fileno=handover), messages.HANDOVER_MAX)
            if handed is None:
                os._exit(0)  # drained unused
            if len(fds) != 4:
                raise OSError(0, f"expected stdio and an error pipe, got {len(fds)} fds")
            argv, env = handed
            *stdio, err_w = fds
            if limits is not None:
                # The supervisor serves the request with a fresh child
                # instead: stdio not touched yet. The rlimits are set under
                # this stage too: a hard limit lowered between the check
                # and the set fails the same way.
                stage = "tampered"
                if tuple(map(resource.getrlimit, _RLIMITS)) != limits:
                    raise OSError(errno.EPERM, "its resource limits were changed while it waited")
                for _, step in enter.LAST:
                    step(entry, -1)
                limits_set = True
            stage = "stdio"
            for fd, kept in enumerate(stdio):
                os.dup2(kept, fd)
        if not limits_set:
            for stage, step in enter.LAST:
                step(entry, ruleset_fd)
        stage = "exec"
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        os.execve(target.program, argv, env)
    except OSError as e:
        failure = ChildFailure(stage, e.errno or 0, e.strerror or str(e))
    except BaseException as e:  # never let the zygote's loop run on in a child
        failure = ChildFailure(stage, 0, f"{type(e).__name__}: {e}")
    try:
        os.write(err_w, failure.encode())
    finally:
        os._exit(127)
