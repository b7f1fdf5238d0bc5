"""ZygoteProcess, the supervisor's handle on its zygote: start and restart, spawn, pools, hand-over to pooled children.

Everything is computed in the supervisor (argv, environment, the
Confinement with its ruleset fd, each child's error pipe); the zygote
(zygote.main) forks, and the child (zygote.child) makes its system calls in
a fixed order and leaves by exec or os._exit. A failure travels back over
the close-on-exec error pipe as a messages.ChildFailure; EOF on it means
exec succeeded.
"""
from __future__ import annotations

import errno
import os
import resource
import select
import selectors
import signal
import socket
import time
from dataclasses import dataclass
from enum import Enum

import landlock

from . import boot, messages
from .messages import Drain, Forked, ForkFailed, Pool, Ready, Refill, Request, Spawn
from .pools import Demand, Gids, Pools, proc_limits

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..daemon.policy import SpawnPlan

assert (boot.REQUESTS_FD, boot.EVENTS_FD) == (messages.REQUESTS_FD, messages.EVENTS_FD)
_REPLY_TIMEOUT = 3.0  # a fork takes a millisecond; the supervisor waits on nothing else so long


@dataclass(frozen=True)
class Launch:
    """One child to start, carried as one from Supervisor._spawn to the zygote:
    policy's plan and the prepared confinement of its spec."""
    plan: SpawnPlan
    confinement: landlock.Confinement

    @property
    def pool(self) -> tuple[str, int | None] | None:   # the pool that may serve it (Demand: size None)
        return self.plan.pool

    @property
    def session_gid(self) -> bool:   # each child gets a gid of its own (Gids)
        return self.plan.session_gid

    def request(self) -> bytes:
        """What the child reads after the fork: argv and env never enter the zygote."""
        return messages.encode(Request(self.plan.argv, self.plan.env))

    def ruleset_fds(self) -> list[int]:
        return [self.confinement.ruleset.fd] if self.confinement.ruleset.fd >= 0 else []


# A child forked for a request, fresh or pooled: its pid, the read end of its
# error pipe (EOF at exec, else a ChildFailure), its session gid (the
# caller's to give back once the child is reaped), its canary (see messages).
Started = tuple[int, int, "int | None", "str | None"]


def _error_pipe() -> tuple[int, int]:
    """A child's error pipe, made here for every child, fresh or pooled:
    close-on-exec at both ends, so the read end sees EOF at exec."""
    return os.pipe2(os.O_CLOEXEC)


def _request_memfd(request: bytes) -> int:
    """The child reads argv and env from here after the fork: they never
    enter the zygote, whose memory every later child copies."""
    memfd = os.memfd_create("spawn-request", os.MFD_CLOEXEC)
    try:
        view = memoryview(request)
        while view:
            view = view[os.write(memfd, view):]
    except BaseException:
        os.close(memfd)
        raise
    return memfd


class Reaped(Enum):
    """What a reaped pid was to the zygote's handle."""
    ZYGOTE = "zygote"   # a zygote: its channels closed with it
    POOLED = "pooled"   # a pooled child: ready, sent away unused, or tampered with
    OTHER = "other"     # not the zygote's: a session's child, or an orphan reparented to us


class ZygoteProcess:
    """The supervisor's handle on its zygote and on the pooled children it
    forked. A spawn without a pool is one request answered before the next
    (a fork takes well under a millisecond), so a child's pid is known
    before its SIGCHLD can be handled; pooled children arrive on their own
    (on the events channel, watched by the selector) and are handed their
    request by the supervisor, the zygote not involved (their record:
    pools.Pools, which others ask it about: owns, reaped, pooled)."""

    def __init__(self, selector: selectors.BaseSelector, log: Callable[[str], None], gids: Gids | None = None,
                 nofile: tuple[int, int] | None = None, pool_idle: float = 300.0) -> None:
        self.selector = selector
        self.log = log   # the daemon's, one line an event (the zygote package imports nothing of the daemon)
        self.nofile = nofile    # the zygote's NOFILE limit, so its children's: the supervisor's before it raised it
        self.pid: int | None = None
        self.requests: socket.socket | None = None   # see messages
        self.events: socket.socket | None = None
        self.pools = Pools(gids)
        self.demand = Demand(pool_idle)   # the `pool: auto` manifests'
        self.unreaped: set[int] = set()  # zygotes closed, not yet reaped

    def start(self, booting: boot.Booting | None = None) -> None:
        """Spawn the zygote (or take one spawned already) and wait for its Ready."""
        if booting is None:
            booting = boot.launch()
        self.pid, self.requests, self.events = booting.pid, booting.requests, booting.events
        self.selector.register(booting.events, selectors.EVENT_READ, lambda key: self.receive())
        reply = self._reply()
        if not isinstance(reply, Ready):
            raise OSError(errno.EPROTO, f"the zygote said {reply!r} at start")
        if self.nofile is not None:
            # Before its first fork (it forks only when asked).
            resource.prlimit(self.pid, resource.RLIMIT_NOFILE, self.nofile)
        self.pools.limits = proc_limits(self.pid) or b""

    def spawn(self, launch: Launch, stdio: list[int], gid: int | None = None) -> Started:
        """Fork a child for launch (with session gid `gid`). Raises OSError
        when the fork fails (EAGAIN, ENOMEM), the zygote is gone twice, or
        the supervisor is out of fds for the child's error pipe (EMFILE)."""
        request = launch.request()
        if len(request) > messages.MAX_MESSAGE:
            raise OSError(errno.E2BIG, f"argv and environment exceed {messages.MAX_MESSAGE // 1024} KiB")
        memfd = _request_memfd(request)
        try:
            plan = launch.plan
            message = Spawn(plan.program, plan.cwd, plan.umask, launch.confinement.entry, gid, len(request))
            retried = False
            while True:
                errpipe, err_w = _error_pipe()   # a new one each time: the first zygote may have forked
                try:
                    if self.requests is None:
                        self.start()
                    self._send(message, [*stdio, memfd, err_w, *launch.ruleset_fds()])
                    reply = self._reply()
                except (OSError, EOFError, ValueError) as e:
                    os.close(errpipe)
                    self.close()
                    if retried:
                        raise OSError(getattr(e, "errno", 0) or 0, f"the zygote is gone: {e}") from None
                    retried = True
                    continue
                finally:
                    os.close(err_w)
                break
        finally:
            os.close(memfd)
        if isinstance(reply, Forked):
            return reply.pid, errpipe, gid, reply.canary
        os.close(errpipe)
        if isinstance(reply, ForkFailed):
            raise OSError(reply.errno, reply.message)
        raise OSError(errno.EPROTO, f"the zygote said {reply!r}")

    def take(self, launch: Launch, stdio: list[int]) -> Started | None:
        """Hand the request to a pooled child of launch.pool, or None when
        none is ready (the pool is set up, or replaced when its
        confinement changed, for the next spawns). A ready one whose limits
        were changed while it waited is discarded (and said so)."""
        assert launch.pool is not None
        name, size = launch.pool
        adaptive = size is None
        if size is None:
            size = self.demand.spawned(name, time.monotonic())
            if not size:
                return None
        generation, confinement = self.pools.running.get(name, (0, None))
        if confinement is not launch.confinement:
            self._pool(name, size, launch)
            return None
        self.receive()
        if not self.pools.ready.get(name):
            if adaptive and self.demand.grow(name):
                self._refill(name, generation, launch.session_gid)
            return None
        request = launch.request()
        if len(request) > messages.HANDOVER_MAX:
            return None  # a fresh child takes it (or spawn() says why not)
        errpipe, err_w = _error_pipe()
        try:
            child = self.pools.hand(name, request, [*stdio, err_w])
        finally:
            os.close(err_w)
            for pid in self.pools.discarded():
                self.tampered(name, pid, retire=False)   # (the pools sent it away already)
        if child is None:
            os.close(errpipe)
            return None
        self._refill(name, generation, launch.session_gid)
        return child.pid, errpipe, child.gid, child.canary

    def tampered(self, name: str, pid: int, retire: bool) -> None:
        """A pooled child of `name` found with its limits changed while it waited (by the pools, or by
        itself at hand-over: it exits, retired unless reaped already, so reaped as ours, not an orphan)."""
        self.log(f"{name}: pooled child {pid} had its resource limits changed while it waited: discarded, a "
                 "fresh child serves the request")
        if retire:
            self.pools.retired.add(pid)

    def pooled(self) -> dict[str, int]:
        """How many children each pool has ready (`stats`)."""
        return {name: len(ready) for name, ready in self.pools.ready.items() if ready}

    def _refill(self, name: str, generation: int, session_gid: bool) -> None:
        """One more child for pool `name` (a replacement, or growth)."""
        try:
            gid = self.pools.gid(session_gid)
        except OSError:
            return  # no gid free: the pool shrinks by one
        try:
            self._send(Refill(name, generation, gid))
        except OSError:
            self.close()

    def _pool(self, name: str, size: int, launch: Launch) -> None:
        new = self.pools.new(name, size, launch.session_gid)
        if new is None:
            return
        generation, gids = new
        try:
            if self.requests is None:
                self.start()
            plan = launch.plan
            self._send(Pool(plan.program, plan.cwd, plan.umask, launch.confinement.entry,
                            name, generation, tuple(gids)), launch.ruleset_fds())
        except (OSError, EOFError, ValueError):
            self.close()  # gives the outstanding gids back
            return
        self.pools.running[name] = (generation, launch.confinement)

    def drain(self) -> None:
        """Every pool emptied and stopped (a reload); demand counted afresh."""
        self.demand.forget()
        for name in list(self.pools.running):
            self._drain(name)

    def drain_idle(self) -> float | None:
        """The `pool: auto` pools idle too long, emptied and stopped; the
        seconds until the next one may be (None: no adaptive pool left)."""
        now = time.monotonic()
        for name in self.demand.idle_since(now):
            self._drain(name)
        return self.demand.due(now)

    def _drain(self, name: str) -> None:
        self.pools.retire(name)
        if self.requests is not None:
            try:
                self._send(Drain(name))
            except OSError:
                self.close()

    def owns(self, pid: int) -> bool:
        """Whether pid is the zygote or a pooled child (ready, or sent away unreaped)."""
        return pid == self.pid or self.pools.owns(pid)

    def receive(self) -> None:
        """Take in what the zygote announced (the events channel is readable)."""
        if self.events is not None and not self.pools.collect(self.events):
            self.close()

    def _reply(self) -> tuple:
        """The answer to the request just sent."""
        assert self.requests is not None
        poller = select.poll()  # not select(): the supervisor's fds may pass 1023
        poller.register(self.requests, select.POLLIN)
        if not poller.poll(_REPLY_TIMEOUT * 1000):
            raise TimeoutError("the zygote did not answer")
        message, fds = messages.receive(self.requests, 4096)
        messages.close(fds)
        if message is None:
            raise EOFError("EOF from the zygote")
        return message

    def _send(self, message: tuple, fds: list[int] | None = None) -> None:
        assert self.requests is not None
        messages.send(self.requests, message, fds or [])

    def _late_answer(self) -> None:
        """A spawn given up on (the zygote did not answer in time) may have
        forked after all: nobody's child, killed."""
        assert self.requests is not None
        try:
            message, fds = messages.receive(self.requests, 4096, socket.MSG_DONTWAIT)
        except (OSError, ValueError):
            return
        messages.close(fds)
        if isinstance(message, Forked):
            os.kill(message.pid, signal.SIGKILL)  # ours (CLONE_PARENT), not reaped yet: its pid
            self.pools.retired.add(message.pid)

    def close(self) -> None:
        """Close the channels and kill the zygote (unless it was reaped
        already); the pooled children exit at EOF on their hand-over sockets;
        the next spawn starts another zygote."""
        if self.events is not None:
            try:
                # The zygote may have died with pooled children announced
                # but not yet read (its SIGCHLD handled first): read them,
                # so that they are reaped as ours, not as orphans.
                self.pools.collect(self.events)
            except OSError:
                pass
        if self.requests is not None:
            self._late_answer()
        self.pools.close()
        if self.events is not None:
            self.selector.unregister(self.events)
            self.events.close()
            self.events = None
        if self.requests is not None:
            self.requests.close()
            self.requests = None
        if self.pid is not None:
            # Not reaped yet, so the pid is still its own. A stopped zygote
            # (a spawn timed out) must never wake to fork for a request
            # given up on.
            os.kill(self.pid, signal.SIGKILL)
            self.unreaped.add(self.pid)
            self.pid = None

    def reaped(self, pid: int) -> Reaped:
        """What a reaped pid was; a zygote's channels close with it, a pooled child's gid is given back."""
        if pid == self.pid:
            self.pid = None
            self.close()
            return Reaped.ZYGOTE
        if pid in self.unreaped:
            self.unreaped.discard(pid)
            return Reaped.ZYGOTE
        return Reaped.POOLED if self.pools.reaped(pid) else Reaped.OTHER
