"""Spawning, seen from the supervisor: what to launch, and the zygote that forks it.

Everything is computed here, in the supervisor (argv, environment, the
Confinement with its ruleset fd); the zygote (zygote.py) forks, and the
child makes its system calls in a fixed order and leaves by exec or
os._exit. A failure travels back over a close-on-exec pipe as
"stage:errno:message"; EOF on that pipe means exec succeeded.
"""
from __future__ import annotations

import errno
import itertools
import marshal
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass

import _prctl
import prctl

import landlock

from . import protocol, zygote

_BOOT = "import sys; sys.path[:0] = sys.argv[1:]; from supervisor import zygote; zygote.main()"
_ASYNC = ("pooled", "pool_failed", "unused")   # what the zygote sends unasked
_REPLY_TIMEOUT = 3.0  # a fork takes a millisecond; the supervisor waits on nothing else so long


@dataclass
class Launch:
    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    confinement: landlock.Confinement
    pool: tuple[str, int] | None = None   # (manifest, size): a pool of its children may serve this
    session_gid: bool = False             # each child gets a gid of its own (see Gids)

    def message(self) -> tuple:
        """The zygote's form, without argv and env: the child gets those after the fork."""
        return (self.program, None, None, self.cwd, self.umask, tuple(self.confinement.entry))


class Gids:
    """A root supervisor's session gids: each child gets one no other live
    process has, so that prlimit(2), which needs the caller's uid and gid to
    match the target's, fails between sessions and against every root
    process. Handed out round the range: a released gid comes back last,
    long after any leftover of its session is gone."""

    def __init__(self, first: int, last: int) -> None:
        if not 0 < first <= last:
            raise ValueError(f"session gids {first}-{last}: expected 0 < FIRST <= LAST")
        self.first, self.last = first, last
        self.next = first
        self.used: set[int] = set()

    def take(self) -> int:
        size = self.last - self.first + 1
        if len(self.used) >= size:
            raise OSError(errno.EAGAIN, f"all {size} session gids are in use")
        while self.next in self.used:
            self.next = self.first if self.next >= self.last else self.next + 1
        gid = self.next
        self.next = self.first if gid >= self.last else gid + 1
        self.used.add(gid)
        return gid

    def release(self, gid: int | None) -> None:
        if gid is not None:
            self.used.discard(gid)


class NoErrorPipe(OSError):
    """The zygote forked, but its reply came without the child's error pipe
    (the supervisor is out of fds): the child is killed."""


class SpawnError(Exception):
    def __init__(self, stage: str, errno_: int, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage, self.errno = stage, errno_


def read_error(data: bytes) -> SpawnError:
    stage, _, rest = data.decode(errors="replace").partition(":")
    number, _, message = rest.partition(":")
    return SpawnError(stage, int(number) if number.isdigit() else 0, message)


@dataclass
class Pooled:
    """A child the zygote forked ahead, confined, waiting for its request."""
    pid: int
    handover: socket.socket   # at its EOF the child exits unused
    gid: int | None = None    # its session gid


def _proc_limits(pid: int) -> bytes | None:
    """/proc/PID/limits: readable by anyone, where prlimit(2) of another
    uid or gid would need CAP_SYS_RESOURCE."""
    try:
        fd = os.open(f"/proc/{pid}/limits", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)


class Zygote:
    """The supervisor's handle on its zygote and on the pooled children it
    forked. A spawn without a pool is one request answered before the next
    (a fork takes well under a millisecond), so a child's pid is known
    before its SIGCHLD can be handled; pooled children arrive on their own
    and are handed their request by the supervisor, the zygote not involved.

    With `gids`, every pooled child is forked with a session gid of its
    own, taken here and given back when it is reaped (or never forked)."""

    def __init__(self, selector: selectors.BaseSelector, gids: Gids | None = None,
                 nofile: tuple[int, int] | None = None) -> None:
        self.selector = selector
        self.gids = gids
        self.nofile = nofile    # the zygote's NOFILE limit, so its children's: the supervisor's before it raised it
        self.pid: int | None = None
        self.channel: socket.socket | None = None
        self.generations = itertools.count(1)
        self.pools: dict[str, tuple[int, landlock.Confinement]] = {}   # name -> (generation, what it enters)
        self.ready: dict[str, list[Pooled]] = {}
        self.retired: set[int] = set()  # sent away unused: reaped, not orphans
        self.unreaped: set[int] = set()  # zygotes closed, not yet reaped
        self.gid_of: dict[int, int] = {}  # pooled children sent away: their gids, until reaped
        self.limits = b""   # /proc/<zygote>/limits: what a pooled child has until its hand-over
        self.tampered: list[int] = []  # pooled children found with other limits, sent away (the caller logs them)
        self.outstanding: set[int] = set()  # gids sent to the zygote for children not yet announced

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # -S: no site, so no site-packages; where each import lives, instead.
        paths = list(dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in (
            os.path.dirname(__file__), os.path.dirname(landlock.__file__), prctl.__file__, _prctl.__file__)))
        try:
            # A fresh interpreter, not a fork of ours: small, and nothing of
            # the supervisor's in it. Its own session: a terminal's ^C is the
            # supervisor's to handle. No environment: children get theirs.
            self.pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _BOOT, *paths], {},
                                      file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), zygote.CHANNEL_FD)],
                                      setsid=True, setsigmask=())
        finally:
            theirs.close()
        self.channel = ours
        self.selector.register(ours, selectors.EVENT_READ, lambda key: self.receive())
        reply = self._reply()
        if reply[0] != "ready":
            raise OSError(0, f"the zygote said {reply!r} at start")
        if self.nofile is not None:
            # Before its first fork (it forks only when asked).
            resource.prlimit(self.pid, resource.RLIMIT_NOFILE, self.nofile)
        self.limits = _proc_limits(self.pid) or b""

    def spawn(self, launch: Launch, stdio: list[int], gid: int | None = None) -> tuple[int, int]:
        """Fork a child for launch (with session gid `gid`); returns (pid,
        read end of its error pipe). Raises OSError when the fork fails
        (EAGAIN, ENOMEM) or the zygote is gone twice, NoErrorPipe when the
        child was forked but cannot be followed (it is killed)."""
        request = marshal.dumps((launch.argv, launch.env))
        if len(request) > zygote.MAX_MESSAGE:
            raise OSError(errno.E2BIG, f"argv and environment exceed {zygote.MAX_MESSAGE // 1024} KiB")
        # The child reads argv and env from here after the fork: they never
        # enter the zygote, whose memory every later child copies.
        memfd = os.memfd_create("spawn-request", os.MFD_CLOEXEC)
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(memfd, view):]
            fds = stdio + [memfd] + ([launch.confinement.ruleset.fd] if launch.confinement.ruleset.fd >= 0 else [])
            message = marshal.dumps(("spawn", launch.message(), gid, len(request)))
            for attempt in (1, 2):
                try:
                    if self.channel is None:
                        self.start()
                    self.channel.sendmsg([message], protocol.rights(fds))
                    reply = self._reply()
                    break
                except (OSError, EOFError) as e:
                    self.close()
                    if attempt == 2:
                        raise OSError(getattr(e, "errno", 0) or 0, f"the zygote is gone: {e}") from None
        finally:
            os.close(memfd)
        if reply[0] == "forked":
            if len(reply) < 3:
                os.kill(reply[1], signal.SIGKILL)  # ours (CLONE_PARENT), not reaped yet: its pid
                self.retired.add(reply[1])
                raise NoErrorPipe(errno.EMFILE, "the supervisor is out of file descriptors")
            return reply[1], reply[2]
        if reply[0] == "fork_failed":
            raise OSError(reply[1], reply[2])
        raise OSError(0, f"the zygote said {reply!r}")

    def _gid(self, launch: Launch) -> int | None:
        """A session gid for a pooled child of launch; raises OSError when none is free."""
        if self.gids is None or not launch.session_gid:
            return None
        gid = self.gids.take()
        self.outstanding.add(gid)
        return gid

    def _returned(self, gid: int | None, pid: int = 0) -> None:
        """The zygote spoke of gid: a child pid has it (until reaped), or nobody."""
        if gid is None or self.gids is None:
            return
        self.outstanding.discard(gid)
        if pid:
            self.gid_of[pid] = gid
        else:
            self.gids.release(gid)

    def take(self, launch: Launch, stdio: list[int]) -> tuple[int, int, int | None] | None:
        """Hand the request to a pooled child of launch.pool; returns (pid,
        error pipe, its session gid, now the caller's), or None when none is
        ready (the pool is set up, or replaced when its confinement changed,
        for the next spawns)."""
        name, size = launch.pool
        generation, confinement = self.pools.get(name, (0, None))
        if confinement is not launch.confinement:
            self._pool(name, size, launch)
            return None
        self.receive()
        children = self.ready.get(name, [])
        if not children:
            return None
        request = marshal.dumps((launch.argv, launch.env))
        if len(request) > zygote.HANDOVER_MAX:
            return None  # a fresh child takes it (or spawn() says why not)
        errpipe, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            while children:
                child = children.pop()
                if child.gid is None and _proc_limits(child.pid) != self.limits:
                    # Without a gid of its own, a process of its uid and gid
                    # may have lowered its limits while it waited (an
                    # unchanged one also compares them itself, at hand-over).
                    self.tampered.append(child.pid)
                    self._send_away(child)
                    child.handover.close()
                    continue
                try:
                    child.handover.sendmsg([request], protocol.rights([*stdio, err_w]))
                except OSError:
                    # Died before its use (a child that dies young does so
                    # again: no refill for it; the fresh spawn reports why).
                    self._send_away(child)
                    continue
                finally:
                    child.handover.close()
                try:
                    gid = self._gid(launch)
                except OSError:
                    pass  # no gid free: the pool shrinks by one
                else:
                    try:
                        self._send(("refill", name, generation, gid))
                    except OSError:
                        self.close()
                return child.pid, errpipe, child.gid
        finally:
            os.close(err_w)
        os.close(errpipe)
        return None

    def _send_away(self, child: Pooled) -> None:
        self.retired.add(child.pid)
        if child.gid is not None:
            self.gid_of[child.pid] = child.gid

    def _pool(self, name: str, size: int, launch: Launch) -> None:
        self._retire(name)
        generation = next(self.generations)
        fd = launch.confinement.ruleset.fd
        gids: list[int | None] = []
        try:
            for _ in range(size):
                gids.append(self._gid(launch))
        except OSError:
            if not gids:
                return
        try:
            if self.channel is None:
                self.start()
            self._send(("pool", name, generation, tuple(gids), launch.message()), [fd] if fd >= 0 else [])
        except (OSError, EOFError):
            self.close()  # gives the outstanding gids back
            return
        self.pools[name] = (generation, launch.confinement)

    def _retire(self, name: str) -> None:
        for child in self.ready.pop(name, []):
            self._send_away(child)
            child.handover.close()
        self.pools.pop(name, None)

    def drain(self) -> None:
        """Every pool emptied and stopped (a reload)."""
        for name in list(self.pools):
            self._retire(name)
            if self.channel is not None:
                try:
                    self._send(("pool", name, 0, (), None))
                except OSError:
                    self.close()

    def reaped(self, pid: int) -> bool:
        """Whether a reaped pid was a pooled child (or one sent away)."""
        if pid in self.retired:
            self.retired.discard(pid)
            if self.gids is not None:
                self.gids.release(self.gid_of.pop(pid, None))
            return True
        for children in self.ready.values():
            for child in children:
                if child.pid == pid:
                    children.remove(child)
                    child.handover.close()
                    if self.gids is not None:
                        self.gids.release(child.gid)
                    return True
        return False

    def owns(self, pid: int) -> bool:
        """Whether pid is the zygote or a pooled child (ready, or sent away unreaped)."""
        return pid == self.pid or pid in self.retired or any(
            child.pid == pid for children in self.ready.values() for child in children)

    def receive(self) -> None:
        """Take in the pooled children that arrived (the channel is readable)."""
        if self.channel is not None and not self._collect():
            self.close()

    def _collect(self) -> bool:
        """Read what the zygote sent; False at the channel's end."""
        while True:
            try:
                message = self._read(socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except (OSError, EOFError):
                return False
            if message[0] == "forked":  # the answer to a spawn given up on: nobody's child
                os.kill(message[1], signal.SIGKILL)
                self.retired.add(message[1])
                if len(message) > 2:
                    os.close(message[2])
            elif message[0] not in _ASYNC:
                raise OSError(0, f"the zygote said {message!r} out of turn")

    def _reply(self) -> tuple:
        """The answer to the request just sent; pooled children that come first are kept."""
        deadline = time.monotonic() + _REPLY_TIMEOUT
        poller = select.poll()  # not select(): the supervisor's fds may pass 1023
        poller.register(self.channel, select.POLLIN)
        while True:
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                raise TimeoutError("the zygote did not answer")
            message = self._read(0)
            if message[0] not in _ASYNC:
                return message

    def _read(self, flags: int) -> tuple:
        data, ancillary, _, _ = self.channel.recvmsg(4096, socket.CMSG_SPACE(2 * 4), socket.MSG_CMSG_CLOEXEC | flags)
        fds = protocol.received_fds(ancillary)
        if not data:
            raise EOFError("EOF from the zygote")
        message = marshal.loads(data)
        if message[0] == "unused":
            for gid in message[1]:
                self._returned(gid)
        elif message[0] in _ASYNC:
            pid, helper = message[3:5]
            gid = message[-1]
            if helper:
                self.retired.add(helper)  # reaped once the child has exec'd or exited
            if message[0] == "pooled" and self.pools.get(message[1], (None,))[0] == message[2] and len(fds) == 1:
                if self.gids is not None:
                    self.outstanding.discard(gid)
                self.ready.setdefault(message[1], []).append(Pooled(pid, socket.socket(fileno=fds[0]), gid))
            else:  # failed, or of a pool since replaced
                if pid:
                    self.retired.add(pid)
                self._returned(gid, pid)
                for fd in fds:
                    os.close(fd)
        elif message[0] == "forked" and len(fds) == 1:
            message = (*message, fds[0])
        else:
            for fd in fds:
                os.close(fd)
        return message

    def _send(self, message: tuple, fds: list[int] = ()) -> None:
        self.channel.sendmsg([marshal.dumps(message)], protocol.rights(fds))

    def close(self) -> None:
        """Close the channel and kill the zygote (unless it was reaped
        already); the pooled children exit at EOF on their hand-over sockets;
        the next spawn starts another zygote."""
        if self.channel is not None:
            try:
                # The zygote may have died with pooled children announced
                # but not yet read (its SIGCHLD handled first): read them,
                # so that they are reaped as ours, not as orphans.
                self._collect()
            except OSError:
                pass
        for name in list(self.pools):
            self._retire(name)
        if self.gids is not None:
            # Never to be announced: a child forked for one dies within
            # moments (its pipe and hand-over socket are gone).
            for gid in self.outstanding:
                self.gids.release(gid)
        self.outstanding.clear()
        if self.channel is not None:
            self.selector.unregister(self.channel)
            self.channel.close()
            self.channel = None
        if self.pid is not None:
            # Not reaped yet, so the pid is still its own. A stopped zygote
            # (a spawn timed out) must never wake to fork for a request
            # given up on.
            os.kill(self.pid, signal.SIGKILL)
            self.unreaped.add(self.pid)
            self.pid = None

    def ended(self, pid: int) -> bool:
        """Whether a reaped pid was a zygote (the channel closes with it)."""
        if pid == self.pid:
            self.pid = None
            self.close()
            return True
        if pid in self.unreaped:
            self.unreaped.discard(pid)
            return True
        return False
