"""How a session ends: TERM then KILL of its process group and of what outlives it, SIGCHLD -> `exited` (then `settled`), the session forgotten and its gid given back.

Children starts sessions and puts them in `sessions`; from then on their
end is decided here.
"""
from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable

from .. import protocol
from . import reap, survivors
from .connections import Connections
from .denials import Denials
from .limits import Limits
from .log import log
from .loop import Loop
from .session import Connection, Session
from .settling import Settling
from ..zygote.pools import Gids
from ..zygote.process import Reaped, ZygoteProcess


class Endings:
    def __init__(self, loop: Loop, zygote: ZygoteProcess, gids: Gids | None, connections: Connections,
                 limits: Limits, stats: dict[str, int], records: survivors.Records, denials: Denials | None) -> None:
        """denials: None unless denials are read."""
        self.loop, self.zygote, self.gids, self.connections = loop, zygote, gids, connections
        self.limits, self.stats, self.records, self.denials = limits, stats, records, denials
        self.pid = os.getpid()
        self.sessions: dict[int, Session] = {}   # by pid, from its fork until forgotten
        self.settling = Settling(loop, denials, connections.send) if denials is not None else None
        # A held session exec'd, failed or ended: the warm servers' (supervisor/daemon/warm.py) to look at.
        self.on_held: Callable[[Session], None] = lambda session: None

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
            return  # not exec'd yet: Children.on_errpipe terminates it once it is
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
                continue  # Children.on_errpipe reports it, in order
            if session.held:
                self.on_held(session)
            if session.spawned:
                self.announce_exit(session)
            else:
                self.forget(session)

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

    def announce_exit(self, session: Session) -> None:
        """`exited` at once, with the denials counted so far; where the
        kernel's own count is still to come, `settled` follows it."""
        exited = session.exited
        assert exited is not None
        tally = session.tally
        settling = self.settling if self.settling is not None and self.settling.follows(session) else None
        reason = session.kill_reason or ("exited" if exited["code"] is not None else "signalled")
        self.stats["exited"] += 1
        found = None
        if reason == "exited" and exited["code"] and session.conn is not None:
            # A server that stops on its own may have met file permissions, not Landlock.
            from ..manifests import dac
            found = [str(f) for f in dac.findings(session.manifest)]
        self.connections.send(session.conn, protocol.exited(
            session.pid, reason, exited, None if tally is None else {**tally.summary(), "final": settling is None},
            found))
        if session.conn is not None and session.conn.session is session:
            self.connections.deadline(session.conn, self.limits.linger)  # closed then, unless it asks for something
        if settling is not None:
            settling.wait(session)
        self.forget(session)

    def forget(self, session: Session) -> None:
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
