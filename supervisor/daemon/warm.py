"""Warm servers: a manifest's own process started ahead (`warm: N`), held on pipes by the supervisor, handed whole to one client.

A warm server is a fresh spawn of its manifest with nobody's request
(policy.plan with {}): the same zygote path, the same (stage, step)
sequence (zygote.child.FRESH), its own uid, session gid, keyring, Landlock
domain and canary; its stdin, stdout and stderr are pipes whose other ends
only the supervisor holds (the zygote closes its copies once it forked, the
child's ends are closed here once sent). It is sent nothing. A spawn
request that would start exactly that process and asks for pipes gets the
supervisor's three ends with `spawned` (children.hand_over), which closes
them: from then on the server is that client's session, and no process
but the client holds an end. Each serves one session; the next is started
off the request's path.

Never handed out: a server that exited, wrote to its stdout (it answered
nobody: it is not the process a fresh spawn would be), was stopped, or
whose limits or scheduling are not as forked (`tamper.Forked`); one older than
warm_max_age; one of a manifest since reloaded (all retired at each
reload). What it wrote to stderr stays in its pipe (bounded by the pipe's
size: a server that writes more waits) and is the client's to read, as a
fresh server's banner would be. A server that fails or is discarded is
replaced after a backoff that doubles, so a crashing server cannot spin.
"""
from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import landlock

from .. import protocol
from .children import Children
from .endings import Endings
from ..errors import Code, Refused
from .limits import Limits
from .log import log
from .loop import Loop, Timer
from ..manifests.manifest import Manifest
from .session import Session
from .tamper import Forked, as_forked, limits_of, scheduling_of
from ..zygote.process import Launch

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

BACKOFF_FIRST, BACKOFF_MAX = 1.0, 300.0
TEND = 5.0               # seconds between looks at demand and at room under the children limit
STABLE = 10.0            # a server that waited this long was no failure, whatever ended it
# The request fields that always mean a fresh spawn (the list), and
# the values of each that are nothing of the client's (policy.plan's own
# reading). Any other value goes fresh, a wrong type (`args: null`) too, where
# policy.plan refuses it: a hand-over makes no plan, so it must never meet one.
_CLIENT_FIELDS: tuple[tuple[str, str, tuple[object, ...]], ...] = (
    ("args", "client args", ([],)), ("env", "a client environment", ({}, None)),
    ("cwd", "a client cwd", ()), ("narrow", "a narrowing", ()))


def unfit(m: Manifest, request: Mapping[str, Any], pipes: bool) -> str | None:
    """Why a spawn request is not one a warm server may serve (None: it
    may, if one is ready): anything of the client's in it means a fresh
    spawn, so that no client's data reaches a process started before it."""
    if not m.warm:
        return "its manifest keeps no warm server"
    if not pipes:
        return "the client passed its own stdio"
    for key, what, nothing in _CLIENT_FIELDS:
        if key in request and request[key] not in nothing:
            return f"the request has {what}"
    return None


def signal_unscoped(spec: landlock.Spec, support: landlock.Support) -> str | None:
    """Why spec's sessions may signal processes of their uid outside their
    domain on this kernel (Landlock's signal scope not enforced), or None.
    Pure."""
    if "signal" not in spec.scopes:
        return "its `scopes:` leave out signal"
    try:
        return landlock.downgrade(spec, support).dropped.get("scope_signal")
    except landlock.LandlockUnavailable:
        return None   # its sessions never start


def pipes() -> tuple[list[int], list[int]]:
    """stdio pipes: a child's ends (stdin's read end, stdout's and stderr's
    write ends) and the others (its client's, or the supervisor's while a
    warm server waits); close-on-exec, as everything the supervisor opens."""
    ends: list[int] = []
    try:
        for _ in range(3):
            ends.extend(os.pipe2(os.O_CLOEXEC))
    except OSError as e:
        protocol.close_all(ends)
        raise Refused(Code.SPAWN_FAILED, f"no pipes for the child: {e.strerror}") from None
    return [ends[0], ends[3], ends[5]], [ends[1], ends[2], ends[4]]


@dataclass
class Warm:
    """One warm server: its session (held), what it was started as, the
    supervisor's ends of its pipes (stdin's write end, stdout's and
    stderr's read ends)."""
    session: Session
    launch: Launch
    pipes: list[int]
    started: float
    ready: bool = False
    gone: bool = False        # handed over or discarded: none of its callbacks may act again
    timer: Timer | None = None
    forked: Forked | None = None   # what it was forked with, its /proc files open


class WarmServers:
    """The warm servers of every manifest with `warm: N`, kept by the
    loop: started at serve and after each use, retired at reload, drained
    when their manifest was not asked for in `idle` seconds (started again
    at its next spawn, which is fresh)."""

    def __init__(self, loop: Loop, children: Children, endings: Endings, limits: Limits,
                 launch_of: Callable[[Manifest], Launch], current: Callable[[Launch], bool],
                 zygote_pid: Callable[[], int | None], idle: float) -> None:
        self.loop, self.children, self.endings, self.limits, self.launch_of = loop, children, endings, limits, launch_of
        self.current = current
        self.zygote_pid, self.idle = zygote_pid, idle
        self.manifests: dict[str, Manifest] = {}   # those whose warm servers are kept
        self.unkept: dict[str, str] = {}             # with `warm:`, not kept: why
        self.servers: dict[str, list[Warm]] = {}
        self.failures: dict[str, int] = {}
        self.fills: dict[str, Timer] = {}
        self.asked: dict[str, float] = {}   # when each manifest was last asked for
        self.dormant: set[str] = set()      # drained for want of demand
        self.tending: Timer | None = None
        self.stopping = False
        endings.on_held = self._held

    def serve(self, manifests: Mapping[str, Manifest]) -> None:
        """The manifests served now (at start, after a reload): every warm
        server of before retired, new ones started for these."""
        self.retire_all("the manifests were reloaded")
        self.manifests, self.unkept = {}, {}
        # The sessions still running count too: a reload leaves them their manifest of before.
        unscoped = _unscoped_uids([*manifests.values(), *(s.manifest for s in self.children.sessions.values())])
        for name, m in manifests.items():
            if m.warm and _uid(m) in unscoped:
                self.unkept[name] = f"uid {_uid(m)}'s sessions may signal a warm server ({unscoped[_uid(m)]})"
                log(f"{m.source}: warning: warm: {m.warm} not kept: {self.unkept[name]}: every spawn is fresh")
            elif m.warm:
                self.manifests[name] = m
        self.failures.clear()
        self.dormant.clear()
        now = time.monotonic()
        self.asked = {name: now for name in self.manifests}
        for name in self.manifests:
            self._fill_later(name, 0.0)
        if self.manifests:
            self.tending = self.loop.at(min(TEND, self.idle), self._tend)

    def stop(self) -> None:
        self.stopping = True
        self.retire_all("the supervisor stops")

    def asked_for(self, m: Manifest) -> None:
        """A spawn of m (warm or not): in demand; a drained manifest's warm servers come back."""
        if m.name in self.manifests:
            self.asked[m.name] = time.monotonic()
            if m.name in self.dormant:
                self.dormant.discard(m.name)
                self._fill_later(m.name, 0.0)

    def _tend(self) -> None:
        """Drain the manifests not asked for in `idle` seconds; refill the
        others (room under the children limit may have come)."""
        now = time.monotonic()
        for name in self.manifests:
            if name in self.dormant:
                continue
            if now - self.asked[name] >= self.idle:
                self.dormant.add(name)
                for warm in list(self.servers.get(name, [])):
                    self._discard(warm, f"drained: its manifest was not asked for in {self.idle:g} s", failed=False)
            else:
                self._fill_later(name, 0.0)
                for warm in self.servers.get(name, []):
                    if warm.ready and warm.forked is not None:
                        warm.forked.note()   # (what it set itself at start: no parsing at its hand-over)
        self.tending = self.loop.at(min(TEND, self.idle), self._tend)

    def pids(self) -> dict[str, list[int]]:
        return {name: [w.session.pid for w in servers if w.ready] for name, servers in self.servers.items() if servers}

    def kept(self, name: str) -> int:
        """How many warm servers of this manifest are kept (0: none, or not kept here)."""
        m = self.manifests.get(name)
        return 0 if m is None else m.warm

    def ready(self, name: str) -> bool:
        return any(w.ready for w in self.servers.get(name, ()))

    # ---- hand-over ---------------------------------------------------------

    def take(self, m: Manifest) -> tuple[Warm | None, str]:
        """A ready warm server that is exactly the process a fresh spawn of
        m's own would be now, the caller's to hand over (children.hand_over
        with warm.pipes, then handed()), or None and why not. The ones found
        unfit are discarded on the way."""
        if m.name in self.unkept:
            return None, f"its warm servers are not kept: {self.unkept[m.name]}"
        servers = self.servers.get(m.name, [])
        for warm in [w for w in servers if w.ready]:
            why = self._unfit(warm, m)
            if why is not None:
                # No backoff: a process of its uid may have done it (renice),
                # and a request, not the loop, found it: nothing spins.
                self._discard(warm, why, failed=False)
                continue
            self._forget(warm)
            return warm, ""
        return None, "no warm server is ready"

    def handed(self, warm: Warm) -> None:
        """After take()'s server was sent, off the request's path: what it held let go, its replacement started."""
        self._release(warm)
        self.failures.pop(warm.session.manifest.name, None)
        self._fill_later(warm.session.manifest.name, 0.0)

    def _unfit(self, warm: Warm, m: Manifest) -> str | None:
        # Its plan is policy.plan of this manifest with {}, which is what a
        # request that `unfit` lets through gets: only the manifest (a reload)
        # and its paths' inodes (the confinement) can have changed since.
        if warm.session.exited is not None or _readable(warm.pipes[1]):
            return "it exited or wrote to its stdout before hand-over"
        if self.manifests.get(m.name) is not m or not self.current(warm.launch):
            return "it is not what a fresh spawn of its manifest would be now"
        assert warm.forked is not None
        return warm.forked.tampered()

    # ---- starting, ending ----------------------------------------------------

    def _fill_later(self, name: str, delay: float) -> None:
        if name not in self.fills and not self.stopping:
            self.fills[name] = self.loop.at(delay, lambda: self._fill(name))

    def _fill(self, name: str) -> None:
        self.fills.pop(name, None)
        m = self.manifests.get(name)
        # Until a failure schedules the next try (the backoff).
        while (m is not None and not self.stopping and name not in self.fills and name not in self.dormant
               and len(self.servers.get(name, [])) < m.warm and len(self.children) < self.limits.children):
            if not self._start(m):
                self._failed(name)
                return

    def _start(self, m: Manifest) -> bool:
        """One more warm server of m; False when it could not be started (logged)."""
        ours: list[int] = []
        try:
            launch = self.launch_of(m)
            theirs, ours = pipes()
            session = self.children.start_held(m, launch, theirs)   # closes theirs
        except Refused as e:
            protocol.close_all(ours)
            log(f"{m.name}: no warm server: {e}")
            return False
        warm = Warm(session, launch, ours, time.monotonic())
        self.servers.setdefault(m.name, []).append(warm)
        self.loop.watch(ours[1], lambda: self._discard(warm, "it wrote to its stdout (or closed it) before "
                                                             "hand-over"))
        warm.timer = self.loop.at(m.warm_max_age, lambda: self._discard(
            warm, f"it was not used within warm_max_age ({m.warm_max_age} s)", failed=False))
        try:
            warm.forked = self._as_forked(session.pid, launch)   # the zygote runs now
        except OSError as e:
            self._discard(warm, f"what it was forked with cannot be known: {e}")
        return True

    def _as_forked(self, pid: int, launch: Launch) -> Forked:
        """pid, a child of the zygote, and what it gets: its scheduling
        (reset on fork) and limits, the manifest's rlimits over them."""
        zygote = self.zygote_pid()
        if zygote is None:
            raise OSError(0, "the zygote is not running")
        scheduling = as_forked(scheduling_of(zygote))
        limits = limits_of(zygote)
        limits.update({res: (soft, hard) for res, soft, hard in launch.confinement.entry.rlimits})
        return Forked(pid, limits, scheduling)

    def _held(self, session: Session) -> None:
        """Children says: a held session exec'd, failed, or ended."""
        warm = next((w for w in self.servers.get(session.manifest.name, []) if w.session is session), None)
        if warm is None:
            return   # discarded already
        if session.exited is None and session.kill_reason is None and session.errpipe < 0:
            warm.ready = True
            if warm.forked is not None:
                warm.forked.note()
            return
        self._discard(warm, "it failed to start" if session.kill_reason == "spawn_failed"
                      else "it exited before hand-over", failed=time.monotonic() - warm.started < STABLE)

    def _discard(self, warm: Warm, why: str, failed: bool = True) -> None:
        """Never handed out: logged, ended, replaced (after a backoff if it failed)."""
        if warm.gone:
            return   # (its stdout's callback may come in the turn that discarded it)
        name = warm.session.manifest.name
        log(f"{name}: warm server {warm.session.pid} discarded: {why}")
        self._forget(warm)
        self._release(warm)
        protocol.close_all(warm.pipes)
        self.endings.terminate(warm.session, "discarded")
        if failed:
            self._failed(name)
        else:
            self._fill_later(name, 0.0)

    def _failed(self, name: str) -> None:
        failures = self.failures[name] = self.failures.get(name, 0) + 1
        self._fill_later(name, min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1)))

    def _forget(self, warm: Warm) -> None:
        """No longer one of ours (handed over, or discarded); its stdout no
        longer watched (before its pipes close: the client holds them on)."""
        warm.gone = True
        servers = self.servers.get(warm.session.manifest.name, [])
        if warm in servers:
            servers.remove(warm)
        self.loop.unwatch(warm.pipes[1])

    def _release(self, warm: Warm) -> None:
        """What it held while it waited: its timer, its /proc files."""
        if warm.timer is not None:
            warm.timer.cancel()
        if warm.forked is not None:
            warm.forked.close()

    def retire_all(self, why: str) -> None:
        for name in list(self.servers):
            for warm in list(self.servers[name]):
                self._discard(warm, f"retired: {why}", failed=False)
        for timer in self.fills.values():
            timer.cancel()
        self.fills.clear()
        if self.tending is not None:
            self.tending.cancel()
            self.tending = None


def _uid(m: Manifest) -> int:
    return os.getuid() if m.uid is None else m.uid


def _unscoped_uids(manifests: Iterable[Manifest]) -> dict[int, str]:
    """uid -> why some sessions of that uid are not kept from signalling
    the others (a warm spare among them could be stopped, or sent SIGUSR1,
    which starts node's inspector, while it waits for its client)."""
    unscoped: dict[int, str] = {}
    for m in {id(m): m for m in manifests}.values():   # (a manifest of many sessions: once)
        why = signal_unscoped(m.spec, landlock.probe(m.spec.max_abi))
        if why is not None:
            unscoped.setdefault(_uid(m), f"Landlock's signal scope for {m.name}: {why}")
    return unscoped


def _readable(fd: int) -> bool:
    """Whether a pipe's read end has data or EOF now."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
