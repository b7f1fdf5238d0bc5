"""The zygote: the supervisor's forking half, a small process that forks its children, fresh or ahead for pools.

The supervisor never forks: a fork write-protects every page of the forking
process, and the supervisor's Python work after each fork then takes a
copy-on-write fault on every page it writes (~400 a spawn, ~2 us each).
Here the forking process is a fresh interpreter holding only what the child
needs (C modules, prctl, landlock.enter and this package's small modules),
so each fork copies few page tables, each child has little to tear down at
exec, and the supervisor's pages stay its own. The supervisor starts it
with `-I -S` and its import paths as arguments (zygote.process), with the
two channels of zygote.messages on fds 3 and 4. The zygote has no children:
its forks are the supervisor's (zygote.child).

A pool of pre-forked children per manifest takes the fork off the request
path: each one confines itself (privileges, no_new_privs, the Landlock
domain, PDEATHSIG), says it is ready, and waits, signals blocked, for its
argv, environment, stdio and error pipe; then rlimits and exec. Each is used
once. EOF instead: it exits.

An exec spends ~0.4 ms tearing down the forked interpreter's address space
before it closes the error pipe. A pooled child hands that to a helper: a
process sharing its memory (CLONE_VM), asleep in glibc's
pthread_mutex_lock() on a process-shared mutex whose lock word is the
child's clear-tid word (CLONE_CHILD_CLEARTID). At the child's exec, or its
exit, the kernel clears that word and wakes the helper, which returns and
exits, dropping the old address space last. It runs no Python, holds none of
the request's fds (it is cloned before they arrive), is cloned before the
child's new session, user change and Landlock domain (the target neither
shares its process group nor can signal or trace it), and is SCHED_BATCH
(under SCHED_OTHER), so the wake does not preempt the exec. No helper when
the child has an NPROC limit: it would count against it.

A pooled child reports to the zygote on a pipe of its own: "helper PID\\n"
when it made one, then "ready\\n", or why it failed, then EOF.
"""
from __future__ import annotations

import ctypes
import os
import resource
import select
import _signal
import _socket as socket  # not socket.py: its enums cost every fork ~130 pages
from collections.abc import Callable

import prctl

from landlock import enter, syscalls

from . import canary as canary_file, child, messages
from .messages import Drain, Forked, ForkFailed, Pool, Pooled, PoolFailed, Ready, Refill, Spawn, Unused

_RT_SIGACTION_NR = {"x86_64": 13, "aarch64": 134, "riscv64": 134, "ppc64le": 173, "armv7l": 174, "i686": 174}


class _Pool:
    def __init__(self, message: Pool, ruleset_fd: int) -> None:
        self.target, self.generation, self.ruleset_fd = message, message.generation, ruleset_fd
        self.gids = list(message.gids)   # one a child still to fork for it
        # A helper would count against an NPROC limit (see the module's doc).
        self.helper = not any(res == resource.RLIMIT_NPROC for res, _, _ in message.entry.rlimits)

    def close(self) -> None:
        if self.ruleset_fd >= 0:
            os.close(self.ruleset_fd)


class _Starting:
    """A pooled child not ready yet."""
    def __init__(self, name: str, generation: int, pid: int, handover: socket.socket, gid: int | None,
                 canary: str | None) -> None:
        self.name, self.generation, self.pid, self.handover, self.gid = name, generation, pid, handover, gid
        self.canary = canary
        self.said = bytearray()


class ZygoteLoop:
    def __init__(self, zygote: child.Zygote) -> None:
        self.zygote = zygote
        self.requests = socket.socket(fileno=messages.REQUESTS_FD)
        self.events = socket.socket(fileno=messages.EVENTS_FD)
        self.pools: dict[str, _Pool] = {}
        self.starting: dict[int, _Starting] = {}   # by the pipe it reports on
        self.handlers: dict[type, Callable[..., None]] = {Spawn: self._spawn, Pool: self._pool, Refill: self._refill, Drain: self._drain}

    def serve(self) -> None:
        self._answer(Ready(os.getpid()))
        while True:
            readable: list[socket.socket | int] = [self.requests, *self.starting]
            for ready in select.select(readable, [], [])[0]:
                if isinstance(ready, int):
                    self._started(ready)
                else:
                    self._handle()
            # Pre-fork between requests, a request first whenever one waits.
            for name, pool in list(self.pools.items()):
                while pool.gids and not select.select([self.requests], [], [], 0)[0]:
                    self._prefork(name, pool, pool.gids.pop())

    def _handle(self) -> None:
        try:
            message, fds = messages.receive(self.requests, messages.MAX_MESSAGE)
        except ConnectionError:
            message = None
        if message is None:
            os._exit(0)  # the supervisor is gone or done with us
        self.handlers[type(message)](message, fds)

    def _spawn(self, message: Spawn, fds: list[int]) -> None:
        canary = None
        try:
            try:
                if len(fds) < 5:
                    raise OSError(0, f"a spawn takes stdio, its request and error pipe, got {len(fds)} fds")
                canary = canary_file.make(message.entry.canary)
                pid = child.fork(self.zygote, message, message.gid, fds[4], fds[5] if len(fds) > 5 else -1,
                                 stdio=fds[:3], request=fds[3], size=message.size, canary=canary)
            finally:
                # Before the answer: once the supervisor has it, no process
                # but the child holds the child's stdio (a warm server's
                # pipes: only the supervisor holds their other ends).
                messages.close(fds)
        except OSError as e:
            canary_file.remove(canary)
            self._answer(ForkFailed(e.errno or 0, e.strerror or str(e)))
        else:
            self._answer(Forked(pid, canary))

    def _pool(self, message: Pool, fds: list[int]) -> None:
        self._drain(Drain(message.name), [])
        self.pools[message.name] = _Pool(message, fds[0] if fds else -1)

    def _drain(self, message: Drain, fds: list[int]) -> None:
        old = self.pools.pop(message.name, None)
        if old is not None:
            self._unused(old.gids)
            old.close()

    def _refill(self, message: Refill, fds: list[int]) -> None:
        pool = self.pools.get(message.name)
        if pool is not None and pool.generation == message.generation:
            pool.gids.append(message.gid)
        else:
            self._unused([message.gid])

    def _unused(self, gids: list[int | None]) -> None:
        gids = [gid for gid in gids if gid is not None]
        if gids:
            self._announce(Unused(tuple(gids)))

    def _prefork(self, name: str, pool: _Pool, gid: int | None) -> None:
        r = w = -1
        canary = canary_file.make(pool.target.entry.canary)
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                r, w = os.pipe2(os.O_CLOEXEC)
                pid = child.fork(self.zygote, pool.target, gid, w, pool.ruleset_fd, handover=theirs.fileno(),
                                 helper=pool.helper, canary=canary)
            except OSError:
                ours.close()
                raise
            finally:
                theirs.close()
        except OSError as e:
            os.write(2, f"landlock-supervisor zygote: pre-fork for {name!r} failed: {e}\n".encode(errors="replace"))
            canary_file.remove(canary)
            self._unused([gid, *pool.gids])  # the next refill tries again
            pool.gids = []
            if r >= 0:
                os.close(r)
            return
        finally:
            if w >= 0:
                os.close(w)
        self.starting[r] = _Starting(name, pool.generation, pid, ours, gid, canary)

    def _started(self, pipe: int) -> None:
        """A pooled child spoke: a helper made, ready, or why it failed (EOF)."""
        starting = self.starting[pipe]
        data = os.read(pipe, 4096)   # its writes are whole records (< PIPE_BUF)
        starting.said += data
        helper, rest = 0, bytes(starting.said)
        if rest.startswith(b"helper "):
            line, _, rest = rest.partition(b"\n")
            helper = int(line[7:])
        if data and rest != b"ready\n":
            return  # more to come: an error is followed by EOF
        del self.starting[pipe]
        os.close(pipe)
        name, generation, pid, gid = starting.name, starting.generation, starting.pid, starting.gid
        try:
            if data:
                self._announce(Pooled(name, generation, pid, helper, gid, starting.canary),
                               [starting.handover.fileno()])
            else:
                canary_file.remove(starting.canary)
                why = rest.decode(errors="replace") or "it exited"
                os.write(2, f"landlock-supervisor zygote: a pooled child for {name!r} failed: {why}\n"
                         .encode(errors="replace"))
                self._announce(PoolFailed(name, generation, pid, helper, why, gid))
        finally:
            starting.handover.close()

    def _answer(self, message: tuple) -> None:
        self._send(self.requests, message)

    def _announce(self, message: tuple, fds: list[int] | None = None) -> None:
        self._send(self.events, message, fds or [])

    def _send(self, channel: socket.socket, message: tuple, fds: list[int] | None = None) -> None:
        try:
            messages.send(channel, message, fds or [])
        except ConnectionError:
            os._exit(0)  # the supervisor is gone


def _default_internal_signals() -> None:
    """glibc's posix_spawn (how the supervisor starts us) leaves its internal
    signals SIGCANCEL and SIGSETXID (32, 33) ignored in the new program, and
    an ignored signal stays ignored across exec: every child would inherit
    it. glibc's sigaction refuses those two: the raw system call."""
    default = (ctypes.c_ulong * 4)()  # struct sigaction with sa_handler = SIG_DFL
    for sig in (32, 33):
        if child.syscall(ctypes.c_long(_RT_SIGACTION_NR[child.MACHINE]), ctypes.c_long(sig),
                         ctypes.byref(default), None, ctypes.c_size_t(8)) < 0:
            raise OSError(ctypes.get_errno(), f"rt_sigaction({sig})")


def _reset_scheduling() -> bool:
    """No child starts real-time, deadline or with a negative nice
    (SCHED_RESET_ON_FORK on ourselves, our own policy kept: the flag can be
    set unprivileged), nor with a real-time I/O class (ours made
    best-effort: children inherit it). A fair zygote also drops a time
    slice of its own, which its children lose at fork: what it shows is
    then theirs (tamper.as_forked). Returns whether helpers help:
    woken by the exec, a helper must not preempt it; SCHED_BATCH does that
    for SCHED_OTHER, which every child of a normal or real-time zygote has.
    A BATCH or IDLE zygote's children keep its policy: a BATCH helper would
    not help there."""
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    try:
        if policy in syscalls.FAIR_POLICIES:
            syscalls.sched_setattr(policy, syscalls.SCHED_FLAG_RESET_ON_FORK, os.getpriority(os.PRIO_PROCESS, 0))
        else:
            os.sched_setscheduler(0, policy | os.SCHED_RESET_ON_FORK, os.sched_getparam(0))
    except OSError as e:  # a deadline task cannot be set this way: it says so
        os.write(2, f"landlock-supervisor zygote: cannot set SCHED_RESET_ON_FORK: {e}\n".encode())
    try:
        enter.reset_io_priority()
    except OSError as e:
        os.write(2, f"landlock-supervisor zygote: cannot leave the real-time I/O class: {e}\n".encode())
    return policy not in (os.SCHED_BATCH, os.SCHED_IDLE)


def main() -> None:
    supervisor = os.getppid()
    prctl.set_pdeathsig(_signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)
    _default_internal_signals()
    helper_batch = _reset_scheduling()
    child.lock_helper_mutex()
    # It ends at EOF from the supervisor, or with it (PDEATHSIG): a stop
    # signal meant for the supervisor's children is not for the zygote, nor
    # are a broken pipe's and a file size's (which Python ignores). Held
    # blocked for good at their defaults rather than ignored: a child, whose
    # mask is emptied at its exec, then has none of them to put back (six
    # sigaction calls a spawn fewer; its pending set starts empty).
    held = (_signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM, _signal.SIGPIPE, _signal.SIGXFSZ)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, held)
    for sig in held:
        _signal.signal(sig, _signal.SIG_DFL)
    # What a child must put back to the default: what is not (none, unless
    # the interpreter set one).
    reset = tuple(sig for sig in sorted(child.ALL_SIGNALS) if _signal.getsignal(sig) not in (_signal.SIG_DFL, None))
    stat_fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    ZygoteLoop(child.Zygote(supervisor, reset, stat_fd, helper_batch)).serve()
