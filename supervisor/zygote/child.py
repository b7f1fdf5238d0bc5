"""A child of the zygote, from fork to exec: its steps in order; a failure goes back as "stage:errno:message".

Children are made by clone(CLONE_PARENT): they are the supervisor's,
exactly as if it had forked them. It reaps them, it is their PDEATHSIG
parent, and their orphans come back to it as subreaper.

Everything a child needs was prepared before the fork (by the supervisor,
or by the zygote once per message): every object made between fork and
exec costs each spawn copy-on-write faults. Each path of a child is one
straight sequence of (stage, step) at the end of this module (FRESH,
POOLED, POOLED_SHARED_GID), walked by _walk; the shared steps and their
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

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    Steps = tuple[tuple[str, Callable[["_Child"], None]], ...]

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
    domain with its own `canary` (canary.make). Returns its pid; the child
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
    # What the child's steps share, made here: the child only walks.
    c = _Child(zygote, target, entry, gid, err_w, ruleset_fd, stdio, request, size, handover, helper)
    sequence = _sequence(request, gid)
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
        _walk(c, sequence)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
    return pid


class _Child:
    """What one child's steps share: made once, before the fork; the steps
    themselves are module-level functions in module-level tables, so the
    child makes no list, dict or closure per step."""
    __slots__ = ("zygote", "target", "entry", "gid", "err_w", "ruleset_fd", "stdio", "request", "size",
                 "handover", "helper", "argv", "env", "limits")
    argv: list[str]                       # set by "request" (fresh) or "wait" (pooled)
    env: dict[str, str]

    def __init__(self, zygote: Zygote, target: messages.Spawn | messages.Pool, entry: enter.Entry, gid: int | None,
                 err_w: int, ruleset_fd: int, stdio: list[int] | None, request: int, size: int, handover: int,
                 helper: bool) -> None:
        self.zygote, self.target, self.entry, self.gid = zygote, target, entry, gid
        self.err_w, self.ruleset_fd, self.stdio, self.request, self.size = err_w, ruleset_fd, stdio, request, size
        self.handover, self.helper = handover, helper
        self.limits: tuple[tuple[int, int], ...] = ()


def _sequence(request: int, gid: int | None) -> Steps:
    """Which path: a fresh child has its request (a memfd); a pooled one waits
    for it, comparing its limits at hand-over unless it has a session gid."""
    return FRESH if request >= 0 else POOLED if gid is not None else POOLED_SHARED_GID


def _walk(c: _Child, sequence: Steps) -> None:
    """The child, from fork to exec; never returns. Each step in order; the
    first that fails is reported with its stage on the error pipe
    (ChildFailure), as _posixsubprocess's child_exec does."""
    stage = sequence[0][0]
    try:
        for stage, step in sequence:
            step(c)
    except OSError as e:
        failure = ChildFailure(stage, e.errno or 0, e.strerror or str(e))
    except BaseException as e:  # never let the zygote's loop run on in a child
        failure = ChildFailure(stage, 0, f"{type(e).__name__}: {e}")
    try:
        os.write(c.err_w, failure.encode())
    finally:
        os._exit(127)


# ---- the steps ---------------------------------------------------------------------------

def _reset_signals(c: _Child) -> None:
    for sig in c.zygote.reset:
        _signal.signal(sig, _signal.SIG_DFL)


def _read_request(c: _Child) -> None:
    """A fresh child's argv and environment: from the supervisor's memfd, never through the zygote."""
    c.argv, c.env = messages.decode(os.pread(c.request, c.size, 0))


def _take_stdio(c: _Child) -> None:
    # Received fds are > 2 (fds 0-2 are always open here): no clobbering.
    for fd, kept in enumerate(c.stdio or ()):
        os.dup2(kept, fd)


def _close_fds(c: _Child) -> None:
    """All but the error pipe, the ruleset and the hand-over socket."""
    low = 3
    for fd in sorted(fd for fd in (c.err_w, c.ruleset_fd, c.handover) if fd >= 0):
        if fd > low:   # (none between two kept fds: no call)
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 0x7FFFFFFF)


def _start_helper(c: _Child) -> None:
    """A pooled child's exec helper, when its pool has one (see main). Here:
    after the fd sweep (it holds nothing of ours), before the new session (it
    is not in the group killed when the target exits), the user change and
    the Landlock domain (the target can neither signal nor trace it)."""
    if not c.helper:
        return
    pid = max(_clone(_HELPER_RUNS, _STACK_TOP, _CLONE_VM | _CLONE_PARENT | _SIGCHLD, ctypes.addressof(_mutex)), 0)
    if pid:  # else the exec tears down as usual
        os.write(c.err_w, b"helper %d\n" % pid)
        if c.zygote.helper_batch:
            os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))


def _setsid(c: _Child) -> None:
    os.setsid()


def _chdir(c: _Child) -> None:
    """As the target user: a directory it could not enter is an error. A
    session gid is handed out again once its session is gone: what this
    child makes must never be open to that later session by group, whatever
    the manifest's umask says."""
    os.chdir(c.target.cwd)
    os.umask(c.target.umask if c.gid is None else c.target.umask | SESSION_GID_UMASK)


def _pdeathsig(c: _Child) -> None:
    """Armed after the uid change, which clears it; then re-check that the
    supervisor did not die before it was armed."""
    prctl.set_pdeathsig(_signal.SIGKILL)
    if os.getppid() != c.zygote.supervisor:
        os._exit(1)


def _wait(c: _Child) -> None:
    """A pooled child: says "ready", then waits for its request, stdio and error pipe."""
    if c.ruleset_fd >= 0:
        os.close(c.ruleset_fd)
        c.ruleset_fd = -1
    if c.gid is None:
        # Without a gid of its own, a process of its uid and gid may lower
        # its limits while it waits: compared at hand-over ("tampered").
        c.limits = tuple(map(resource.getrlimit, _RLIMITS))
    os.write(c.err_w, b"ready\n")
    os.close(c.err_w)
    c.err_w = -1
    handed, fds = messages.receive(socket.socket(fileno=c.handover), messages.HANDOVER_MAX)
    if handed is None:
        os._exit(0)  # drained unused
    if len(fds) != 4:
        raise OSError(0, f"expected stdio and an error pipe, got {len(fds)} fds")
    c.argv, c.env = handed
    *c.stdio, c.err_w = fds


def _untampered(c: _Child) -> None:
    """A pooled child without a session gid: its limits as it left them, then
    set. The supervisor serves the request with a fresh child instead: stdio
    not touched yet. The rlimits are set under this stage too: a hard limit
    lowered between the check and the set fails the same way."""
    if tuple(map(resource.getrlimit, _RLIMITS)) != c.limits:
        raise OSError(errno.EPERM, "its resource limits were changed while it waited")
    for _, step in enter.LAST:
        step(c.entry, c.ruleset_fd)


def _exec(c: _Child) -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    os.execve(c.target.program, c.argv, c.env)


def _entering(step: Callable[[enter.Entry, int], None]) -> Callable[[_Child], None]:
    """One of landlock.enter's steps (shared with landlock-exec) as the child
    takes it; made once, at import."""
    def child_step(c: _Child) -> None:
        step(c.entry, c.ruleset_fd)
    return child_step


CONFINE = tuple((stage, _entering(step)) for stage, step in enter.CONFINE)   # keyring, privileges, confine
LAST = tuple((stage, _entering(step)) for stage, step in enter.LAST)         # rlimits


# ---- the sequences: each path of a child, one straight line ----------------------------------
#
# The order is the security: every fd not its own closed before the helper
# and the new session, the new session before the user change, the user change before the Landlock
# domain (CONFINE), pdeathsig after the user change (which clears it),
# rlimits last (a memory or NOFILE limit can break the Python still
# running). A warm server (supervisor/daemon/warm.py) is FRESH: its request is its
# manifest's own, its stdio pipes the supervisor holds, so it walks exactly
# what a fresh spawn of that manifest walks. A new path is one more
# sequence here, chosen in _sequence.

FRESH: Steps = (
    ("signals", _reset_signals),
    ("request", _read_request),
    ("stdio", _take_stdio),
    ("close_fds", _close_fds),
    ("setsid", _setsid),
    *CONFINE,
    ("chdir", _chdir),
    ("pdeathsig", _pdeathsig),
    *LAST,
    ("exec", _exec),
)

_POOLED_START: Steps = (
    ("signals", _reset_signals),
    ("close_fds", _close_fds),
    ("helper", _start_helper),
    ("setsid", _setsid),
    *CONFINE,
    ("chdir", _chdir),
    ("pdeathsig", _pdeathsig),
    ("wait", _wait),
)

# A pooled child with a session gid of its own: nobody else can change its limits.
POOLED: Steps = (
    *_POOLED_START,
    ("stdio", _take_stdio),
    *LAST,
    ("exec", _exec),
)

# Without one: its limits compared at hand-over, and set under that stage.
POOLED_SHARED_GID: Steps = (
    *_POOLED_START,
    ("tampered", _untampered),
    ("stdio", _take_stdio),
    ("exec", _exec),
)

SEQUENCES = (FRESH, POOLED, POOLED_SHARED_GID)


def _stages(sequences: tuple[Steps, ...]) -> tuple[str, ...]:
    """Every stage a child can fail at, in its order: the first sequence's,
    each stage of the others inserted after the one it follows there (a
    pooled child takes "stdio" after "tampered": it keeps the fresh one's
    place). docs/protocol.md lists them (tests/unit/test_errors.py)."""
    stages: list[str] = []
    for sequence in sequences:
        after = -1
        for stage, _ in sequence:
            if stage not in stages:
                stages.insert(after + 1, stage)
            after = stages.index(stage)
    return tuple(stages)


STAGES = _stages(SEQUENCES)
