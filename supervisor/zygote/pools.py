"""The supervisor's record of its pooled children: the pools running, the children ready for a request, those sent away, the session gids of all of them, and the demand that keeps `pool: auto` pools."""
from __future__ import annotations

import errno
import itertools
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import landlock

from . import messages
from .messages import Pooled, PoolFailed, Unused


class Gids:
    """A root supervisor's session gids: each child gets one no other live
    process has, so that prlimit(2), which needs the caller's uid and gid to
    match the target's, fails between sessions and against every root
    process. Handed out round the range, a released gid coming back last;
    a process that left its session (setsid) keeps its gid after the
    session ends, so each round begins with a look at every process's gids
    (`held`: the range's gids some process has), and a gid held then, or
    in use then, is passed over for the round. Sound because only take()
    gives a gid of the range: one free at the look and taken in the round
    comes round again only after the next look."""

    def __init__(self, first: int, last: int, held: Callable[[int, int], set[int]]) -> None:
        if not 0 < first <= last:
            raise ValueError(f"session gids {first}-{last}: expected 0 < FIRST <= LAST")
        self.first, self.last, self.look = first, last, held
        self.next = first
        self.used: set[int] = set()
        self.held: set[int] = set()   # at the round's look

    def take(self) -> int:
        size = self.last - self.first + 1
        if len(self.used) >= size:
            raise OSError(errno.EAGAIN, f"all {size} session gids are in use")
        looked = False
        while True:   # until a whole round after a look has found none: at most 2 * size steps
            gid = self.next
            if gid == self.first:
                if looked:
                    break
                # In use then too (a pooled child not forked yet has no process): passed over until the next look.
                self.held, looked = self.look(self.first, self.last) | self.used, True
            self.next = self.first if gid >= self.last else gid + 1
            if gid not in self.used and gid not in self.held:
                self.used.add(gid)
                return gid
        # (A look came in this call: what is not in use is held by a process.)
        raise OSError(errno.EAGAIN, f"the {size - len(self.used)} session gid(s) not in use are held by a process "
                      "that left its session")

    def release(self, gid: int | None) -> None:
        if gid is not None:
            self.used.discard(gid)


class Demand:
    """`pool: auto` (the default): whether a manifest is spawned often
    enough to keep children ready. None for a manifest spawned now and then;
    one once it is spawned ENGAGE times within WINDOW seconds; one more
    each time a spawn finds none ready, up to CAP, while the spawns go on;
    none again (drained) after `idle` seconds without a spawn."""
    ENGAGE, WINDOW, CAP = 3, 10.0, 4

    def __init__(self, idle: float = 300.0) -> None:
        self.idle = idle
        self.recent: dict[str, list[float]] = {}   # not engaged: the last spawns' times
        self.size: dict[str, int] = {}             # engaged: the pool's size now
        self.last: dict[str, float] = {}           # engaged: its last spawn

    def spawned(self, name: str, now: float) -> int:
        """A spawn of `name` now: the size its pool should have (0: none)."""
        if name in self.size:
            self.last[name] = now
            return self.size[name]
        times = [t for t in self.recent.get(name, ()) if now - t <= self.WINDOW]
        times.append(now)
        if len(times) < self.ENGAGE:
            self.recent[name] = times
            return 0
        self.recent.pop(name, None)
        self.size[name], self.last[name] = 1, now
        return 1

    def grow(self, name: str) -> bool:
        """A spawn found no child ready: one more, unless at CAP."""
        if self.size.get(name, self.CAP) >= self.CAP:
            return False
        self.size[name] += 1
        return True

    def idle_since(self, now: float) -> list[str]:
        """The engaged pools idle for `idle` seconds, forgotten."""
        names = [name for name, last in self.last.items() if now - last >= self.idle]
        for name in names:
            self.forget(name)
        return names

    def due(self, now: float) -> float | None:
        """Seconds until the next pool goes idle, or None when none is engaged."""
        return max(0.0, min(self.last.values()) + self.idle - now) if self.last else None

    def forget(self, name: str | None = None) -> None:
        """Start over for `name` (None: every manifest, a reload)."""
        for table in (self.recent, self.size, self.last):
            if name is None:
                table.clear()
            else:
                table.pop(name, None)


@dataclass
class Waiting:
    """A child the zygote forked ahead, confined, waiting for its request."""
    pid: int
    handover: socket.socket   # at its EOF the child exits unused
    gid: int | None = None    # its session gid
    canary: str | None = None  # what marked its domain (see messages)


def proc_limits(pid: int) -> bytes | None:
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


class Pools:
    """With `gids`, every pooled child is forked with a session gid of its
    own, taken here and given back when it is reaped (or never forked)."""

    def __init__(self, gids: Gids | None) -> None:
        self.gids = gids
        self.generations = itertools.count(1)
        self.running: dict[str, tuple[int, landlock.Confinement]] = {}   # name -> (generation, what it enters)
        self.ready: dict[str, list[Waiting]] = {}
        self.retired: set[int] = set()  # sent away unused: reaped, not orphans
        self.gid_of: dict[int, int] = {}  # pooled children sent away: their gids, until reaped
        self.outstanding: set[int] = set()  # gids sent to the zygote for children not yet announced
        self.limits = b""   # /proc/<zygote>/limits: what a pooled child has until its hand-over
        self.tampered: list[int] = []  # pooled children found with other limits, sent away, until discarded() says so

    def gid(self, wanted: bool) -> int | None:
        """A session gid for a pooled child (if `wanted`); raises OSError when none is free."""
        if self.gids is None or not wanted:
            return None
        gid = self.gids.take()
        self.outstanding.add(gid)
        return gid

    def returned(self, gid: int | None, pid: int = 0) -> None:
        """The zygote spoke of gid: a child pid has it (until reaped), or nobody."""
        if gid is None or self.gids is None:
            return
        self.outstanding.discard(gid)
        if pid:
            self.gid_of[pid] = gid
        else:
            self.gids.release(gid)

    def new(self, name: str, size: int, wanted_gids: bool) -> tuple[int, list[int | None]] | None:
        """A new generation of pool `name` replaces the old one: its
        generation and a gid for each child to fork, or None when no gid is free."""
        self.retire(name)
        gids: list[int | None] = []
        try:
            for _ in range(size):
                gids.append(self.gid(wanted_gids))
        except OSError:
            if not gids:
                return None
        return next(self.generations), gids

    def waiting(self, name: str) -> Waiting | None:
        """A ready child of pool `name`, now the caller's; the ones whose
        limits changed while they waited are sent away."""
        children = self.ready.get(name, [])
        while children:
            child = children.pop()
            if child.gid is None and proc_limits(child.pid) != self.limits:
                # Without a gid of its own, a process of its uid and gid
                # may have lowered its limits while it waited (an
                # unchanged one also compares them itself, at hand-over).
                self.tampered.append(child.pid)
                self.send_away(child)
                child.handover.close()
                continue
            return child
        return None

    def hand(self, name: str, request: bytes, fds: list[int]) -> Waiting | None:
        """The request (and fds: the client's stdio, the error pipe) handed
        to a ready child of pool `name`, now the caller's; None when none took it."""
        while (child := self.waiting(name)) is not None:
            try:
                messages.send(child.handover, request, fds)
            except OSError:
                # Died before its use (a child that dies young does so
                # again: no refill for it; the fresh spawn reports why).
                self.send_away(child)
                continue
            finally:
                child.handover.close()
            return child
        return None

    def discarded(self) -> list[int]:
        """The children found tampered with since last asked."""
        found, self.tampered = self.tampered, []
        return found

    def send_away(self, child: Waiting) -> None:
        self.retired.add(child.pid)
        if child.gid is not None:
            self.gid_of[child.pid] = child.gid

    def retire(self, name: str) -> None:
        for child in self.ready.pop(name, []):
            self.send_away(child)
            child.handover.close()
        self.running.pop(name, None)

    def collect(self, events: socket.socket) -> bool:
        """Take in the zygote's announcements on its events channel; False at the channel's end."""
        while True:
            try:
                message, fds = messages.receive(events, 4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except (OSError, ValueError):
                return False
            if message is None:
                return False
            self.announced(message, fds)

    def announced(self, message: tuple, fds: list[int]) -> None:
        """What the zygote said on its events channel."""
        if isinstance(message, Unused):
            for gid in message.gids:
                self.returned(gid)
        elif isinstance(message, (Pooled, PoolFailed)):
            if message.helper:
                self.retired.add(message.helper)  # reaped once the child has exec'd or exited
            if (isinstance(message, Pooled) and len(fds) == 1
                    and self.running.get(message.name, (None,))[0] == message.generation):
                if self.gids is not None:
                    self.outstanding.discard(message.gid)
                self.ready.setdefault(message.name, []).append(
                    Waiting(message.pid, socket.socket(fileno=fds[0]), message.gid, message.canary))
                return
            # failed, of a pool since replaced, or its socket lost (we are out of fds)
            if message.pid:
                self.retired.add(message.pid)
            self.returned(message.gid, message.pid)
        for fd in fds:
            os.close(fd)

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
        """Whether pid is a pooled child (ready, or sent away unreaped)."""
        return pid in self.retired or any(child.pid == pid for children in self.ready.values() for child in children)

    def close(self) -> None:
        """The zygote is gone: every pool with it."""
        for name in list(self.running):
            self.retire(name)
        if self.gids is not None:
            # Never to be announced: a child forked for one dies within
            # moments (its pipe and hand-over socket are gone).
            for gid in self.outstanding:
                self.gids.release(gid)
        self.outstanding.clear()
