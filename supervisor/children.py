"""Running children: started through the zygote, error pipe -> spawned/failed, SIGCHLD -> exited, TERM->KILL, session gids given back.

Each child is a Session, keyed by pid, from its fork until its `exited`
went out (or its failure), and its leftovers were killed.
"""
from __future__ import annotations

import errno
import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import audit, procfs, protocol, reap, survivors
from .audit import SETTLE_MAX, SETTLE_WAIT
from .connections import Connection, Connections
from .denials import Denials, Tally
from .errors import Code, Refused
from .limits import Limits
from .log import log
from .loop import Loop, Periodic, Timer
from .manifest import Manifest
from .zygote.messages import ChildFailure
from .zygote.pools import Gids
from .zygote.process import Launch, Reaped, ZygoteProcess

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

Retry = tuple[Launch, list[int]]


@dataclass
class Session:
    """A spawned child, from its request to its reaping: its client, error pipe, exit, session gid, denials."""
    pid: int
    manifest: Manifest
    conn: Connection | None
    report: dict[str, Any]
    uid: int
    errpipe: int = -1               # open until exec (EOF) or a failure report
    spawned: bool = False           # the `spawned` reply went out
    exited: dict[str, Any] | None = None
    kill_reason: str | None = None
    record: str | None = None       # the file in sessions/ that outlives a crash
    kill_timer: Timer | None = None
    first_term: float | None = None  # monotonic time of the first TERM a client asked for: the grace runs from it
    gid: int | None = None          # its session gid (Config.session_gids)
    leftovers: bool = False         # processes of its session outlived it: its gid stays taken until the KILL
    retry: Retry | None = None      # a pooled child's request and the client's stdio, kept until it
                                    # execs: a fresh child's if it was tampered with
    tally: Tally | None = None      # its denials, when they are read (supervisor/audit.py)
    held: bool = False              # a warm server nobody's yet (supervisor/warm.py): `spawned` waits for its client
    pipes: list[int] | None = None  # the client's ends of its stdio pipes (`stdio: "pipes"`), sent with `spawned`
    warm: dict[str, Any] | None = None   # in `spawned`: whether a warm server served it, and if not why

    def update(self, pipes: list[int] | None, warm: dict[str, Any] | None) -> "Session":
        self.pipes, self.warm = pipes, warm
        return self


class Children:
    def __init__(self, loop: Loop, zygote: ZygoteProcess, gids: Gids | None, connections: Connections,
                 limits: Limits, stats: dict[str, int], records: survivors.Records, tick: Periodic) -> None:
        self.loop, self.zygote, self.gids, self.connections = loop, zygote, gids, connections
        self.limits, self.stats, self.records, self.tick = limits, stats, records, tick
        self.pid = os.getpid()
        self.sessions: dict[int, Session] = {}
        self.denials: Denials | None = None       # set when denials are read
        self.visibility: dict[str, Any] = {"mode": "off"}   # audit.Mode.describe(), in every `spawned`
        # A held session exec'd, failed or ended: the warm servers' (supervisor/warm.py) to look at.
        self.on_held: Callable[[Session], None] = lambda session: None

    def __len__(self) -> int:
        return len(self.sessions)

    def count_of(self, uid: int) -> int:
        return sum(s.uid == uid for s in self.sessions.values())

    # ---- starting ---------------------------------------------------------

    def start(self, conn: Connection, m: Manifest, launch: Launch, stdio: list[int], pipes: list[int] | None,
              warm: dict[str, Any]) -> None:
        """A child for launch: a pooled one if ready, else a fresh fork. Closes stdio, or keeps it
        with the session until a pooled child's exec; pipes (the client's ends, when
        it asked for pipes) go with `spawned`, which says `warm`."""
        conn.deadline = None
        try:
            pooled = self.zygote.take(launch, stdio) if launch.pool else None
        except OSError as e:
            protocol.close_all(stdio)
            protocol.close_all(pipes or [])
            self.connections.deadline(conn, self.limits.linger)
            raise Refused(Code.FORK_FAILED, f"fork failed: {e.strerror or e}") from None
        if pooled is None:
            self._fresh(conn, m, launch, stdio, pipes=pipes, warm=warm)
            return
        pid, errpipe, gid, canary = pooled
        retry = None
        if gid is None:
            # Others of its uid and gid could prlimit it while it waited: it
            # compares its limits at hand-over, and a fresh child serves the
            # request if they changed. The client's fds stay here until then.
            retry = (launch, stdio)
        else:
            protocol.close_all(stdio)
        self._track(conn, m, launch, pid, errpipe, gid, retry, canary).update(pipes, warm)

    def start_held(self, m: Manifest, launch: Launch, stdio: list[int]) -> Session:
        """A warm server: a fresh child of nobody's request, held until a
        client takes it (hand_over). Closes stdio; raises Refused."""
        return self._fresh(None, m, launch, stdio, held=True)

    def hand_over(self, conn: Connection, session: Session, pipes: list[int]) -> None:
        """A held warm server becomes conn's session, charged to its uid:
        `spawned` with the supervisor's ends of its pipes, then what it was
        denied while it waited."""
        conn.deadline = None
        session.held, session.conn, session.uid = False, conn, conn.peer.uid
        session.update(pipes, {"warm": True})
        conn.session = session
        self._spawned(session)

    def _fresh(self, conn: Connection | None, m: Manifest, launch: Launch, stdio: list[int], *,
               pipes: list[int] | None = None, warm: dict[str, Any] | None = None, held: bool = False) -> Session:
        """A fresh child for the request: the zygote forks it. Closes stdio (and pipes if refused)."""
        try:
            try:
                gid = self.gids.take() if self.gids is not None and launch.session_gid else None
            except OSError as e:
                raise Refused(Code.TOO_MANY_CHILDREN, str(e)) from None
            try:
                pid, errpipe, gid, canary = self.zygote.spawn(launch, stdio, gid)
            except OSError as e:
                self.release_gid(gid)
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise Refused(Code.SPAWN_FAILED, f"{m.name}: out of file descriptors: {e.strerror}") from None
                raise Refused(Code.FORK_FAILED, f"fork failed: {e.strerror or e}") from None
        except Refused:
            protocol.close_all(pipes or [])
            if conn is not None:
                self.connections.deadline(conn, self.limits.linger)
            raise
        finally:
            protocol.close_all(stdio)
        session = self._track(conn, m, launch, pid, errpipe, gid, None, canary)
        session.held = held
        return session.update(pipes, warm)

    def _track(self, conn: Connection | None, m: Manifest, launch: Launch, pid: int, errpipe: int,
               gid: int | None, retry: Retry | None, canary: str | None) -> Session:
        previous = self.sessions.get(pid)
        if previous is not None:
            # pids wrap: the last child with this pid was reaped in this same
            # select batch, its error pipe not read yet. Settle it first, or
            # it would take the new child's session with it when forgotten.
            self.on_errpipe(previous)
            self.sessions.pop(pid, None)
        # A held one (a warm server) is charged to no uid until its hand-over.
        session = Session(pid, m, conn, {**launch.confinement.report_dict, "tid": pid},
                          conn.peer.uid if conn is not None else -1, errpipe, gid=gid, retry=retry)
        # Now, while the child execs on the other CPU; a failed one is forgotten with its record.
        session.record = self.records.add(pid)
        if conn is not None:
            conn.session = session
        self.sessions[pid] = session
        if self.denials is not None:
            session.tally = Tally(quiet=m.quiet_denials, canary=canary)
            self.denials.started(session)
        self.loop.watch(errpipe, lambda: self.on_errpipe(session))
        self.tick.start()  # the sweep also watches our own limits while children run
        return session

    def on_errpipe(self, session: Session) -> None:
        """EOF: it exec'd; data: where it failed."""
        try:
            data = os.read(session.errpipe, 4096)
        except BlockingIOError:
            return
        self.loop.unwatch(session.errpipe)
        os.close(session.errpipe)
        session.errpipe = -1
        retry, session.retry = session.retry, None
        if data and retry is not None and ChildFailure.decode(data).stage == "tampered":
            self._replace_tampered(session, *retry)
            return
        if retry is not None:
            protocol.close_all(retry[1])
        if data:
            error = ChildFailure.decode(data)
            self.stats["failed"] += 1
            self.connections.send(session.conn, protocol.error(
                Code.SPAWN_FAILED, f"{session.manifest.name}: {error}", op="spawn", stage=error.stage,
                errno=error.errno))
            session.kill_reason = "spawn_failed"
            protocol.close_all(session.pipes or [])
            session.pipes = None
            if session.conn is not None:
                self.connections.deadline(session.conn, self.limits.linger)
            if session.held:
                self.on_held(session)
            if session.exited is not None:
                self._forget(session)
            return
        if session.held:
            self.on_held(session)   # exec'd: `spawned` goes out at its hand-over
            if session.exited is not None:
                self._forget(session)   # reaped already, nobody to tell
            elif session.kill_reason is not None:
                self.terminate(session, session.kill_reason)   # discarded before it exec'd
            return
        self._spawned(session)

    def _spawned(self, session: Session) -> None:
        """`spawned` (with the client's pipe ends, if it asked for pipes), then what was denied before."""
        self.stats["spawned"] += 1
        session.spawned = True
        event = protocol.spawned(session.pid, session.manifest.name, session.report, self.visibility, session.warm)
        pipes, session.pipes = session.pipes or [], None
        try:
            self.connections.send(session.conn, event, pipes)
        finally:
            protocol.close_all(pipes)
        if session.tally is not None:
            for early in session.tally.early:   # what was denied before `spawned`, in order
                self.connections.offer(session.conn, early)
            session.tally.early = []
        if session.exited is not None:
            self._announce_exit(session)
        elif session.kill_reason in ("client_gone", "shutdown"):
            self.terminate(session, session.kill_reason)

    def _replace_tampered(self, session: Session, launch: Launch, stdio: list[int]) -> None:
        """A pooled child whose limits were changed while it waited (it
        said so and exits): the request goes to a fresh child, the client
        none the wiser."""
        self.zygote.tampered(session.manifest.name, session.pid, reaped=session.exited is not None)
        pipes, session.pipes = session.pipes, None
        self._forget(session)
        conn = session.conn
        if conn is None or conn.session is not session:
            protocol.close_all([*stdio, *(pipes or [])])  # the client went meanwhile
            return
        conn.session = None
        try:
            self._fresh(conn, session.manifest, launch, stdio, pipes=pipes, warm=session.warm)
        except Refused as e:
            self.stats["refused"] += 1
            self.connections.send(conn, protocol.error(e.code, str(e), op="spawn"))

    # ---- ending -----------------------------------------------------------

    def client_gone(self, conn: Connection) -> None:
        session = conn.session
        if session is not None:
            session.conn = None
            if session.manifest.on_disconnect == "kill" and session.exited is None:
                self.terminate(session, "client_gone")

    def terminate_all(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            self.terminate(session, reason)

    def terminate(self, session: Session, reason: str) -> None:
        """TERM the child's process group, KILL it after the grace period."""
        if session.exited is not None:
            return
        session.kill_reason = session.kill_reason if session.kill_reason == "spawn_failed" else reason
        if session.errpipe >= 0:
            return  # not exec'd yet: on_errpipe terminates it once it is
        survivors.killpg(session.pid, signal.SIGTERM)  # its leader is not reaped: the group is still its own
        if session.kill_timer is None:
            # A client that asked for TERM and then went (`run` forwarding
            # the MCP client's TERM, then SIGKILLed by it) has waited part
            # of the grace already: KILL comes at that TERM + the grace.
            waited = time.monotonic() - session.first_term if session.first_term is not None else 0.0
            session.kill_timer = self.loop.at(max(0.0, self.limits.grace - waited),
                                              lambda: self._kill_group(session, signal.SIGKILL))

    def _kill_group(self, session: Session, sig: int) -> bool:
        """Signal what is left of session's process group; whether any was.
        Its leader unreaped, the pgid is still its own; once reaped, the
        number may be another process's: the session's members are found
        in /proc, each pinned with a pidfd and checked again (survivors.leftovers)."""
        if session.exited is None:
            return survivors.killpg(session.pid, sig)
        if not survivors.killpg(session.pid, 0) and not session.leftovers:
            return False  # nobody in the group: the common case costs one system call
        return bool(survivors.signal_leftovers(session.pid, sig, self.pid, self._owned_elsewhere(session)))

    def _owned_elsewhere(self, session: Session) -> Callable[[int], bool]:
        """Whether a pid now leads something else of ours: another session, a
        pooled child, the zygote (helpers live in its session)."""
        def owned(pid: int) -> bool:
            other = self.sessions.get(pid)
            return (other is not None and other is not session) or self.zygote.owns(pid)
        return owned

    def reap(self, stopping: bool) -> None:
        """SIGCHLD: every child that ended, ours or an orphan's."""
        for pid, status, rusage in reap.reap_all():
            session = self.sessions.get(pid)
            if session is None:
                self._reaped_other(pid, status, stopping)
                continue
            session.exited = reap.describe(status, rusage)
            # What is left of its session goes with it: TERM now, KILL after
            # the grace period; meanwhile its gid stays taken.
            if self._kill_group(session, signal.SIGTERM):
                session.leftovers = True
                self.loop.at(self.limits.grace, functools.partial(self._kill_leftovers, session))
            if session.errpipe >= 0:
                continue  # on_errpipe reports it, in order
            if session.held:
                self.on_held(session)
            if session.spawned:
                self._announce_exit(session)
            else:
                self._forget(session)

    def _kill_leftovers(self, session: Session) -> None:
        self._kill_group(session, signal.SIGKILL)
        session.leftovers = False
        if self.sessions.get(session.pid) is not session:  # forgotten meanwhile: the gid was kept for this
            self.release_gid(session.gid)
            session.gid = None

    def _reaped_other(self, pid: int, status: int, stopping: bool) -> None:
        what = self.zygote.reaped(pid)
        if what is Reaped.ZYGOTE and not stopping:
            log(f"the zygote (pid {pid}) ended with status {os.waitstatus_to_exitcode(status)}; "
                "another starts at the next spawn")
        elif what is Reaped.OTHER:
            self.stats["reaped_orphans"] += 1

    def _announce_exit(self, session: Session) -> None:
        """`exited` at once, with the denials counted so far; where the
        kernel's own count is still to come, `settled` follows it."""
        exited = session.exited
        assert exited is not None
        tally = session.tally
        settling = self._settles(session)
        reason = session.kill_reason or ("exited" if exited["code"] is not None else "signalled")
        self.stats["exited"] += 1
        found = None
        if reason == "exited" and exited["code"] and session.conn is not None:
            # A server that stops on its own may have met file permissions, not Landlock.
            from . import dac
            found = [str(f) for f in dac.findings(session.manifest)]
        self.connections.send(session.conn, protocol.exited(
            session.pid, reason, exited, None if tally is None else {**tally.summary(), "final": not settling},
            found))
        if session.conn is not None and session.conn.session is session:
            self.connections.deadline(session.conn, self.limits.linger)  # closed then, unless it asks for something
        if settling:
            self._settle_later(session, SETTLE_WAIT)
        self._forget(session)

    def _settles(self, session: Session) -> bool:
        """Whether a `settled` event follows its `exited`: the kernel's count
        is to come for a domain known, or for one whose canary's record is
        not read yet (a child that ends within a few ms of its canary
        denial: the records come through the kernel's audit thread). Its
        tally stays known by its canary and its domains until then, never
        by its pid (issue 20.2)."""
        tally, denials = session.tally, self.denials
        if tally is None or session.conn is None or denials is None or tally.settled or tally.kernel is not None:
            return False
        return denials.awaits(session) or (tally.own is None and tally.canary is not None)

    def _settle_later(self, session: Session, waited: float) -> None:
        """The kernel's count comes ~60 ms after the domain's last process:
        waited for, a little longer while the reader is behind, never long.
        The session is forgotten meanwhile (its pid may serve another);
        its canary and its domains stay its own until then."""
        assert session.tally is not None and self.denials is not None
        denials = self.denials

        def expired() -> None:
            if waited < SETTLE_MAX and denials.behind():
                self._settle_later(session, waited + SETTLE_WAIT)
            else:
                self._settled(session)
        timer = self.loop.at(SETTLE_WAIT, expired)

        def settled() -> None:
            timer.cancel()
            self._settled(session)
        session.tally.on_settled = settled

    def _settled(self, session: Session) -> None:
        """`settled`: the session's denials in all, the kernel's count
        included when it came (else why not), and its domains forgotten."""
        tally, denials = session.tally, self.denials
        assert tally is not None and denials is not None
        if tally.settled:
            return
        tally.settled, tally.on_settled = True, None
        why = None if tally.kernel is not None else audit.unsettled_reason(denials.status(), tally.own is not None)
        self.connections.send(session.conn, protocol.settled(session.pid, tally.summary(), why))
        denials.forget(session)

    def _forget(self, session: Session) -> None:
        if session.kill_timer is not None:
            session.kill_timer.cancel()
        if self.denials is not None and session.tally is not None and session.tally.on_settled is None:
            self.denials.forget(session)   # (else once settled)
        if self.sessions.get(session.pid) is session:  # not a newer child with the same pid
            del self.sessions[session.pid]
        if session.retry is not None:
            protocol.close_all(session.retry[1])
            session.retry = None
        protocol.close_all(session.pipes or [])
        session.pipes = None
        if not session.leftovers:  # else at their KILL
            self.release_gid(session.gid)
            session.gid = None
        self.records.remove(session.record)

    def release_gid(self, gid: int | None) -> None:
        if self.gids is not None:
            self.gids.release(gid)

    def end_descendants(self) -> None:
        """At the end: reparented descendants that outlived their session's
        leader; killing one orphans its own children to us in turn."""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            left = procfs.children_of(self.pid)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in reap.reap_all():
                pass
            time.sleep(0.01)
