"""The zygote: the supervisor's forking half, a small process that only forks.

The supervisor never forks: a fork write-protects every page of the forking
process, and the supervisor's Python work after each fork then takes a
copy-on-write fault on every page it writes (~400 a spawn, ~2 us each).
Here the forking process is a fresh interpreter holding only what the child
needs (C modules, prctl and landlock.enter), so each fork copies few page
tables, each child has little to tear down at exec, and the supervisor's
pages stay its own.

Children are made by clone(CLONE_PARENT): they are the supervisor's, exactly
as if it had forked them. It reaps them, it is their PDEATHSIG parent, and
their orphans come back to it as subreaper. The zygote has no children.

A pool of pre-forked children per manifest takes the fork off the request
path: each one confines itself (privileges, PDEATHSIG, no_new_privs, the
Landlock domain), says it is ready, and waits, signals blocked, for its
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
(under SCHED_OTHER), so the wake does not preempt the exec. No helper when the child has an
NPROC limit: it would count against it.

The channel is fd 3, a SOCK_SEQPACKET socket to the supervisor, which
starts this module with `-I -S` and its import paths as arguments (see
spawn.Zygote). Messages are marshal'd tuples:
  ("spawn", launch, gid, size) + [stdin, stdout, stderr, request(, ruleset)]
      -> ("forked", pid) + [error pipe] | ("fork_failed", errno, message)
  ("pool", name, generation, gids, launch) + [(ruleset)]: keep forking
      children for it, one per entry of gids (none: stop); each one, once ready,
      -> ("pooled", name, generation, pid, helper pid or 0, gid) + [hand-over socket]
      or, if it died first, ("pool_failed", name, generation, pid, helper, why, gid)
  ("refill", name, generation, gid): one was used, fork another.
  -> ("unused", gids): gids given for children that will never be forked
      (the pool was replaced or stopped, or a fork failed).
A gid is the child's session gid (a root supervisor gives each child its
own: it replaces the gid of the credentials, or makes an allow_root child
uid 0 with that gid), or None: the credentials as they are.
A fresh child reads its (argv, env) itself, after the fork, from `request`
(a memfd of `size` bytes, marshal'd): a client's secrets never pass through
the zygote's memory, which every later child is a copy of.
The supervisor hands a pooled child its request itself (spawn.Zygote.take):
(argv, env) marshal'd + [stdin, stdout, stderr, error pipe] on the hand-over
socket. Before that, the child reports on a pipe to us: "helper PID\n" when
it made one, then "ready\n", or why it failed, then EOF.
launch: (program, argv, env, cwd, umask, entry); argv and env are None (a
fresh child reads them, a pooled one is handed them). EOF: the zygote exits.
"""
import array
import ctypes
import errno
import marshal
import os
import select
import _signal
import _socket as socket  # not socket.py: its enums cost every fork ~130 pages

import prctl
import resource

from landlock import enter

CHANNEL_FD = 3
MAX_MESSAGE = 256 * 1024        # a launch: argv and environment, the supervisor checks
# What a waiting child takes (argv, environment): below malloc's mmap threshold,
# so receiving it costs no mmap/munmap; a larger request gets a fresh child.
HANDOVER_MAX = 64 * 1024
_FDS_SPACE = socket.CMSG_SPACE(8 * 4)
ALL_SIGNALS = _signal.valid_signals()

# clone(CLONE_PARENT | CLONE_CHILD_CLEARTID | SIGCHLD, no new stack): the
# child_tid argument is the 4th on x86_64, the 5th on the others here
# (CLONE_BACKWARDS); the rest are zeros.
_CLONE_NR = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "ppc64le": 120, "armv7l": 120, "i686": 120}
_CLONE_VM = 0x00000100
_CLONE_PARENT = 0x00008000
_CLONE_CHILD_CLEARTID = 0x00200000
_SIGCHLD = 17
_RT_SIGACTION_NR = {"x86_64": 13, "aarch64": 134, "riscv64": 134, "ppc64le": 173, "armv7l": 174, "i686": 174}
_MACHINE = os.uname().machine
# PyDLL: the call keeps the GIL, so the child comes back holding it, as after os.fork.
_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
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
_CLONE_ARGS = [ctypes.c_long(_CLONE_NR[_MACHINE]),
               ctypes.c_ulong(_CLONE_PARENT | _CLONE_CHILD_CLEARTID | _SIGCHLD), None, None, None, None]
_CLONE_ARGS[4 if _MACHINE == "x86_64" else 5] = ctypes.c_void_p(ctypes.addressof(_mutex))
# Woken by the exec, the helper must not preempt it: SCHED_BATCH does that
# for SCHED_OTHER, which every child of a normal or real-time zygote has
# (SCHED_RESET_ON_FORK, see _reset_scheduling). A BATCH or IDLE zygote's
# children keep its policy; a BATCH helper would not help there. Set by main().
_HELPER_BATCH = True
# Compared in a pooled child without a session gid of its own (another
# process with its uid and gid may prlimit it while it waits).
_RLIMITS = tuple(range(16))


def _fork_for_parent() -> int:
    """fork(), the child being our parent's, its clear-tid word the helper's
    lock. No Python at-fork hooks run: the zygote is single-threaded and
    imports nothing that registers one."""
    pid = _syscall(*_CLONE_ARGS)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def _lock_helper_mutex() -> None:
    """Process-shared: a shared futex is what the kernel's clear-tid wakes.
    Locked with no owner: pthread_mutex_lock() sleeps until the word is 0."""
    attr = ctypes.create_string_buffer(64)
    for call, *args in ((_libc.pthread_mutexattr_init, attr), (_libc.pthread_mutexattr_setpshared, attr, 1),
                        (_libc.pthread_mutex_init, _mutex, attr)):
        if call(*args) != 0:
            raise OSError(0, f"{call.__name__} failed")
    ctypes.c_int.from_buffer(_mutex).value = 1


def _helper() -> int:
    """Clone the helper (see the module's doc); its pid, or 0 if it could not
    be made (the exec then tears down as usual)."""
    pid = _clone(_HELPER_RUNS, _STACK_TOP, _CLONE_VM | _CLONE_PARENT | _SIGCHLD, ctypes.addressof(_mutex))
    return max(pid, 0)


def _default_internal_signals() -> None:
    """glibc's posix_spawn (how the supervisor starts us) leaves its internal
    signals SIGCANCEL and SIGSETXID (32, 33) ignored in the new program, and
    an ignored signal stays ignored across exec: every child would inherit
    it. glibc's sigaction refuses those two: the raw system call."""
    default = (ctypes.c_ulong * 4)()  # struct sigaction with sa_handler = SIG_DFL
    for sig in (32, 33):
        if _syscall(ctypes.c_long(_RT_SIGACTION_NR[_MACHINE]), ctypes.c_long(sig),
                    ctypes.byref(default), None, ctypes.c_size_t(8)) < 0:
            raise OSError(ctypes.get_errno(), f"rt_sigaction({sig})")


def _reset_scheduling() -> None:
    """No child starts real-time, deadline or with a negative nice
    (SCHED_RESET_ON_FORK on ourselves, our own policy kept: the flag can be
    set unprivileged), nor with a real-time I/O class (ours made
    best-effort: children inherit it). Then whether helpers help: see
    _HELPER_BATCH."""
    global _HELPER_BATCH
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    try:
        os.sched_setscheduler(0, policy | os.SCHED_RESET_ON_FORK, os.sched_getparam(0))
    except OSError as e:  # a deadline task cannot be set this way: it says so
        os.write(2, f"landlock-supervisor zygote: cannot set SCHED_RESET_ON_FORK: {e}\n".encode())
    _HELPER_BATCH = policy not in (os.SCHED_BATCH, os.SCHED_IDLE)
    try:
        enter.reset_io_priority()
    except OSError as e:
        os.write(2, f"landlock-supervisor zygote: cannot leave the real-time I/O class: {e}\n".encode())


def _received_fds(ancillary: list, flags: int) -> list[int]:
    """protocol.received_fds, without importing protocol (and json) here."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[:len(data) - len(data) % 4]))
    if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        for fd in fds:
            os.close(fd)
        raise OSError(0, "a truncated message")
    return fds


def _launch(message: tuple) -> tuple:
    """A launch as received, its entry made an Entry here: not in each child,
    where every object made costs copy-on-write faults."""
    *rest, entry = message
    return (*rest, enter.Entry(*entry))


def _child(launch: tuple, stdio: list[int] | None, ruleset_fd: int, err_w: int, handover: int, helper: bool,
           supervisor: int, reset: list[int], gid: int | None, request: int, request_size: int) -> None:
    """Confine, (if pooled: say so on err_w, then wait for the request and
    its error pipe,) exec. Leaves by exec or os._exit; a failure goes back as
    "stage:errno:message" on err_w."""
    program, argv, env, cwd, umask, entry = launch
    stage = "signals"
    limits_set = False
    try:
        for sig in reset:
            _signal.signal(sig, _signal.SIG_DFL)
        if request >= 0:
            stage = "request"
            argv, env = marshal.loads(os.pread(request, request_size, 0))
        if stdio is not None:
            stage = "stdio"
            # Received fds are > 2 (fds 0-2 are always open here): no clobbering.
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
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
            pid = _helper()
            if pid:
                os.write(err_w, b"helper %d\n" % pid)
                if _HELPER_BATCH:
                    os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
        stage = "setsid"
        os.setsid()
        stage = "keyring"  # before the switch: charged to the supervisor's key quota
        enter.join_session_keyring()
        stage = "privileges"
        if gid is not None:
            # A gid no other process has: prlimit(2) needs the caller's uid
            # AND gid to match the target's.
            uid, _, groups = entry.credentials or (0, 0, ())
            entry = entry._replace(credentials=(uid, gid, groups))
        enter.drop_privileges(entry)
        stage = "chdir"  # as the server's user: a directory it could not enter is an error
        os.chdir(cwd)
        os.umask(umask)
        stage = "pdeathsig"
        # Armed after the uid change, which clears it; then re-check that the
        # supervisor did not die before it was armed.
        prctl.set_pdeathsig(_signal.SIGKILL)
        if os.getppid() != supervisor:
            os._exit(1)
        stage = "confine"
        enter.restrict(entry, ruleset_fd)
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
            data, ancillary, flags, _ = socket.socket(fileno=handover).recvmsg(
                HANDOVER_MAX, _FDS_SPACE, socket.MSG_CMSG_CLOEXEC)
            if not data:
                os._exit(0)  # drained unused
            fds = _received_fds(ancillary, flags)
            if len(fds) != 4:
                raise OSError(0, f"expected stdio and an error pipe, got {len(fds)} fds")
            *stdio, err_w = fds
            if limits is not None:
                # The supervisor serves the request with a fresh child
                # instead: stdio not touched yet.
                stage = "tampered"
                if tuple(map(resource.getrlimit, _RLIMITS)) != limits:
                    raise OSError(errno.EPERM, "its resource limits were changed while it waited")
                enter.set_rlimits(entry)
                limits_set = True
            argv, env = marshal.loads(data)
            stage = "stdio"
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
        if not limits_set:
            stage = "rlimits"
            enter.set_rlimits(entry)
        stage = "exec"
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        os.execve(program, argv, env)
    except OSError as e:
        message = f"{stage}:{e.errno or 0}:{e.strerror or e}"
    except BaseException as e:  # never let the zygote's loop run on in a child
        message = f"{stage}:0:{type(e).__name__}: {e}"
    try:
        os.write(err_w, message.encode(errors="replace")[:4096])
    finally:
        os._exit(127)


class Pool:
    def __init__(self, generation: int, gids: list[int | None], launch: tuple, ruleset_fd: int) -> None:
        self.generation, self.launch, self.ruleset_fd = generation, launch, ruleset_fd
        self.gids = gids     # one a child still to fork for it (see the module's doc)
        # A helper would count against an NPROC limit (see the module's doc).
        self.helper = not any(res == resource.RLIMIT_NPROC for res, _, _ in launch[-1].rlimits)

    def close(self) -> None:
        if self.ruleset_fd >= 0:
            os.close(self.ruleset_fd)


class Zygote:
    def __init__(self, channel: socket.socket, supervisor: int, reset: list[int]) -> None:
        self.channel = channel
        self.supervisor = supervisor
        self.reset = reset
        self.stat_fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.pools: dict[str, Pool] = {}
        # pooled children not ready yet: their pipe -> (pool, generation, pid, hand-over, what they said, gid)
        self.starting: dict[int, tuple[str, int, int, socket.socket, bytearray, int | None]] = {}

    def serve(self) -> None:
        self._send(("ready", os.getpid()))
        while True:
            for ready in select.select([self.channel, *self.starting], [], [])[0]:
                if ready is self.channel:
                    self._handle()
                else:
                    self._started(ready)
            # Pre-fork between requests, a request first whenever one waits.
            for name, pool in list(self.pools.items()):
                while pool.gids and not select.select([self.channel], [], [], 0)[0]:
                    self._prefork(name, pool, pool.gids.pop())

    def _handle(self) -> None:
        try:
            data, ancillary, flags, _ = self.channel.recvmsg(MAX_MESSAGE, _FDS_SPACE, socket.MSG_CMSG_CLOEXEC)
        except ConnectionError:
            data = b""
        if not data:
            os._exit(0)  # the supervisor is gone or done with us
        fds = _received_fds(ancillary, flags)
        message = marshal.loads(data)
        if message[0] == "spawn":
            self._spawn(_launch(message[1]), message[2], message[3], fds)
        elif message[0] == "pool":
            _, name, generation, gids, launch = message
            old = self.pools.pop(name, None)
            if old is not None:
                self._unused(old.gids)
                old.close()
            if gids:
                self.pools[name] = Pool(generation, list(gids), _launch(launch), fds[0] if fds else -1)
            else:
                for fd in fds:
                    os.close(fd)
        elif message[0] == "refill":
            pool = self.pools.get(message[1])
            if pool is not None and pool.generation == message[2]:
                pool.gids.append(message[3])
            else:
                self._unused([message[3]])

    def _unused(self, gids: list[int | None]) -> None:
        gids = [gid for gid in gids if gid is not None]
        if gids:
            self._send(("unused", tuple(gids)))

    def _spawn(self, launch: tuple, gid: int | None, size: int, fds: list[int]) -> None:
        try:
            if len(fds) < 4:
                raise OSError(0, f"a spawn takes stdio and its request, got {len(fds)} fds")
            pid, errpipe = self._fork(launch, fds[:3], fds[4] if len(fds) > 4 else -1, -1, False, gid,
                                      fds[3], size)
        except OSError as e:
            self._send(("fork_failed", e.errno or 0, e.strerror or str(e)))
        else:
            self._send(("forked", pid), [errpipe])
            os.close(errpipe)
        finally:
            for fd in fds:
                os.close(fd)

    def _prefork(self, name: str, pool: Pool, gid: int | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            pid, errpipe = self._fork(pool.launch, None, pool.ruleset_fd, theirs.fileno(), pool.helper, gid)
        except OSError as e:
            os.write(2, f"landlock-supervisor zygote: pre-fork for {name!r} failed: {e}\n".encode(errors="replace"))
            self._unused([gid, *pool.gids])  # the next refill tries again
            pool.gids = []
            ours.close()
            return
        finally:
            theirs.close()
        self.starting[errpipe] = (name, pool.generation, pid, ours, bytearray(), gid)

    def _started(self, pipe: int) -> None:
        """A pooled child spoke: a helper made, ready, or why it failed (EOF)."""
        name, generation, pid, ours, said, gid = self.starting[pipe]
        data = os.read(pipe, 4096)   # its writes are whole records (< PIPE_BUF)
        said += data
        helper, rest = 0, bytes(said)
        if rest.startswith(b"helper "):
            line, _, rest = rest.partition(b"\n")
            helper = int(line[7:])
        if data and rest != b"ready\n":
            return  # more to come: an error is followed by EOF
        del self.starting[pipe]
        os.close(pipe)
        try:
            if data:
                self._send(("pooled", name, generation, pid, helper, gid), [ours.fileno()])
            else:
                why = rest.decode(errors="replace") or "it exited"
                os.write(2, f"landlock-supervisor zygote: a pooled child for {name!r} failed: {why}\n"
                         .encode(errors="replace"))
                self._send(("pool_failed", name, generation, pid, helper, why, gid))
        finally:
            ours.close()

    def _fork(self, launch: tuple, stdio: list[int] | None, ruleset_fd: int, handover: int,
              helper: bool, gid: int | None, request: int = -1, request_size: int = 0) -> tuple[int, int]:
        if enter.thread_count(self.stat_fd) != 1:
            raise OSError(0, "the zygote has more than one thread: refusing to fork")
        r, w = os.pipe2(os.O_CLOEXEC)
        # Blocked across fork: no handler runs in the child, which unblocks
        # them only at exec, after resetting the ones we changed.
        old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, ALL_SIGNALS)
        try:
            pid = _fork_for_parent()
        except BaseException:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
            os.close(r)
            os.close(w)
            raise
        if pid == 0:
            _child(launch, stdio, ruleset_fd, w, handover, helper, self.supervisor, self.reset, gid, request,
                   request_size)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)
        os.close(w)
        return pid, r

    def _send(self, message: tuple, fds: list[int] = ()) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.channel.sendmsg([marshal.dumps(message)], ancillary)
        except ConnectionError:
            os._exit(0)  # the supervisor is gone


def main() -> None:
    supervisor = os.getppid()
    prctl.set_pdeathsig(_signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)
    _default_internal_signals()
    _reset_scheduling()
    _lock_helper_mutex()
    # It ends at EOF from the supervisor, or with it (PDEATHSIG): a stop
    # signal meant for the supervisor's children is not for the zygote.
    for sig in (_signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM):
        _signal.signal(sig, _signal.SIG_IGN)
    # What a child must put back to the default: what was set here, and
    # what Python ignores (SIGPIPE, SIGXFSZ).
    reset = [sig for sig in sorted(ALL_SIGNALS) if _signal.getsignal(sig) not in (_signal.SIG_DFL, None)]
    Zygote(socket.socket(fileno=CHANNEL_FD), supervisor, reset).serve()
