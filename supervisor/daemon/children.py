"""Starting children: through the zygote, fresh or pooled (a tampered pooled one replaced), error pipe -> `spawned` or the stage that failed; a held warm server handed over.

Each child is a Session, keyed by pid, from its fork until its end
(supervisor/daemon/endings.py: TERM->KILL, `exited`, its gid given back) is done.
"""
from __future__ import annotations

import errno
import os

from .. import protocol
from .connections import Connections
from .denials import Denials, Tally
from .endings import Endings
from ..errors import Code, Refused
from .limits import Limits
from .loop import Loop, Periodic
from ..manifests.manifest import Manifest
from .session import Connection, Session
from ..zygote.messages import ChildFailure
from ..zygote.pools import Gids
from ..zygote.process import Launch, ZygoteProcess

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .session import Retry


class Children:
    def __init__(self, loop: Loop, zygote: ZygoteProcess, gids: Gids | None, connections: Connections,
                 limits: Limits, stats: dict[str, int], tick: Periodic, endings: Endings,
                 visibility: dict[str, Any]) -> None:
        """visibility: audit.Mode.describe(), in every `spawned`."""
        self.loop, self.zygote, self.gids, self.connections = loop, zygote, gids, connections
        self.limits, self.stats, self.tick, self.endings = limits, stats, tick, endings
        self.sessions = endings.sessions
        self.records = endings.records
        self.denials: Denials | None = endings.denials
        self.visibility = visibility

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
        if self.denials is not None:
            self.denials.handed(session)
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
                self.endings.release_gid(gid)
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
                self.endings.on_held(session)
            if session.exited is not None:
                self.endings.forget(session)
            return
        if session.held:
            self.endings.on_held(session)   # exec'd: `spawned` goes out at its hand-over
            if session.exited is not None:
                self.endings.forget(session)   # reaped already, nobody to tell
            elif session.kill_reason is not None:
                self.endings.terminate(session, session.kill_reason)   # discarded before it exec'd
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
            self.endings.announce_exit(session)
        elif session.kill_reason in ("client_gone", "shutdown"):
            self.endings.terminate(session, session.kill_reason)

    def _replace_tampered(self, session: Session, launch: Launch, stdio: list[int]) -> None:
        """A pooled child whose limits were changed while it waited (it
        said so and exits): the request goes to a fresh child, the client
        none the wiser."""
        self.zygote.tampered(session.manifest.name, session.pid, retire=session.exited is None)
        pipes, session.pipes = session.pipes, None
        self.endings.forget(session)
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
