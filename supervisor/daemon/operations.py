"""The operations besides `spawn`: ping, list, stats, describe, denials, status and signal, each a handler answering on its connection.

They only read the parts (a signal aside, sent to the connection's own
child): what is served, the sessions, the zygote's pools, the warm
servers, the denials seen.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping

from . import policy, procfs
from .. import protocol
from .audit import Visibility
from .children import Children
from .connections import Connections
from ..errors import Code, Refused
from ..manifests.manifest import Manifest
from .session import Connection, Session
from .warm import WarmServers
from ..zygote.process import ZygoteProcess

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .connections import Handler

Served = Callable[[], tuple[Mapping[str, Manifest], Mapping[str, str]]]   # the manifests served, and why not the others


class Operations:
    def __init__(self, connections: Connections, children: Children, zygote: ZygoteProcess, warm: WarmServers,
                 visibility: Visibility, stats: dict[str, int], served: Served) -> None:
        self.connections, self.children, self.zygote, self.warm = connections, children, zygote, warm
        self.visibility, self.stats, self.served = visibility, stats, served
        self.pid = os.getpid()

    def handlers(self) -> dict[str, Handler]:
        return {"ping": self._ping, "list": self._list, "stats": self._stats, "describe": self._describe,
                "status": self._status, "signal": self._signal, "denials": self._denials}

    def _ping(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        self.connections.send(conn, protocol.pong(self.pid))

    def _list(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        # Other uids' sessions (pids, uids, clients) are the owner's to see.
        everyone = conn.peer.uid == os.geteuid()
        sessions = [s for s in self.children.sessions.values() if everyone or s.uid == conn.peer.uid]
        table = list(procfs.stats()) if any(s.held for s in sessions) else []
        self.connections.send(conn, protocol.listed(sorted(self.served()[0]), [
            {"pid": s.pid, "manifest": s.manifest.name, "peer_uid": s.uid,
             "peer_pid": s.conn.peer.pid if s.conn else None, "running": s.exited is None, "warm": s.held,
             **(self._cost(s.pid, table) if s.held else {})}
            for s in sessions]))

    @staticmethod
    def _cost(pid: int, table: list[tuple[int, list[str]]]) -> dict[str, Any]:
        """What a warm server costs while it waits (docs/manifests.md): its
        process's PSS, and its session's (npx and uvx start the server as
        their child)."""
        own, session, processes = procfs.session_pss_kib(pid, table)
        return {"pss_kib": own, "session_pss_kib": session, "session_processes": processes}

    def _stats(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        self.connections.send(conn, protocol.stats(
            self.stats, children=len(self.children), zygote=self.zygote.pid, pooled=self.zygote.pooled(),
            warm=self.warm.pids(), connections=len(self.connections), fds=procfs.fd_count(),
            rss_kib=procfs.rss_kib()))

    def _describe(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        m = policy.named(message.get("manifest"), *self.served())
        # What a client may give it: `run` passes the client_env names it
        # has (an MCP client config's `env`), and says which it keeps.
        # What it reads from the supervisor's environment (in private mode,
        # run's), `uses`: `run` does not call them dropped. Whether a spawn on
        # pipes may get a server started ahead, `warm`: `run` asks for pipes
        # then (and passes its own fds, no relay, else).
        self.connections.send(conn, protocol.described(m.name, sorted(m.client_env), m.client_args,
                                                       sorted(m.variables | set(m.inherit_env)),
                                                       self.warm.kept(m.name)))

    def _denials(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        """The recent denials this peer may see (the owner: all; others: their
        sessions'), newest last; with follow, each new one as it comes."""
        follow = message.get("follow", False)
        if not isinstance(follow, bool):
            raise Refused(Code.BAD_REQUEST, "'follow' must be true or false")
        self.connections.send(conn, self.visibility.reply(conn.peer.uid, conn.peer.uid == os.geteuid()))
        if follow:
            conn.deadline = None
            self.visibility.followers.append(conn)

    def _status(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        session = _session_of(conn, "status")
        self.connections.send(conn, protocol.status(session.pid, session.exited))

    def _signal(self, conn: Connection, message: dict[str, Any], fds: list[int]) -> None:
        session = _session_of(conn, "signal")
        sig = message.get("signal", signal.SIGTERM)
        try:
            if isinstance(sig, bool):  # JSON true is no signal number
                raise ValueError(sig)
            sig = signal.Signals[sig] if isinstance(sig, str) else signal.Signals(sig)
        except (KeyError, ValueError):
            raise Refused(Code.BAD_SIGNAL, f"unknown signal {message.get('signal')!r}") from None
        if session.exited is not None:
            self.connections.send(conn, protocol.error(Code.EXITED, "the child has exited", op="signal"))
            return
        session.kill_reason = "signalled_on_request"
        if sig == signal.SIGTERM and session.first_term is None:
            session.first_term = time.monotonic()
        try:
            if message.get("group", True):
                os.killpg(session.pid, sig)
            else:
                os.kill(session.pid, sig)
        except ProcessLookupError:
            pass
        self.connections.send(conn, protocol.signalled(sig.value))


def _session_of(conn: Connection, op: str) -> Session:
    if conn.session is None:
        raise Refused(Code.NO_CHILD, f"{op!r} needs a spawned child on this connection")
    return conn.session
