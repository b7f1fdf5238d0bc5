"""A session's denials after its `exited`: whether the kernel's own count is still to come, the short wait for it, then `settled`.

The session is forgotten meanwhile (its pid may serve another child);
its tally stays known by its canary and its domains until `settled`,
never by its pid (issue 20.2).
"""
from __future__ import annotations

from collections.abc import Callable

from . import audit
from .. import protocol
from .audit import SETTLE_MAX, SETTLE_WAIT
from .denials import Denials
from .loop import Loop
from .session import Connection, Session


class Settling:
    def __init__(self, loop: Loop, denials: Denials,
                 send: Callable[[Connection | None, protocol.Event], None]) -> None:
        self.loop, self.denials, self.send = loop, denials, send

    def follows(self, session: Session) -> bool:
        """Whether a `settled` event follows its `exited`: the kernel's count
        is to come for a domain known, or for one whose canary's record is
        not read yet (a child that ends within a few ms of its canary
        denial: the records come through the kernel's audit thread)."""
        tally = session.tally
        if tally is None or session.conn is None or tally.settled or tally.kernel is not None:
            return False
        return self.denials.awaits(session) or (tally.own is None and tally.canary is not None)

    def wait(self, session: Session, waited: float = SETTLE_WAIT) -> None:
        """The kernel's count comes ~60 ms after the domain's last process:
        waited for, a little longer while the reader is behind, never long."""
        assert session.tally is not None

        def expired() -> None:
            if waited < SETTLE_MAX and self.denials.behind():
                self.wait(session, waited + SETTLE_WAIT)
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
        tally = session.tally
        assert tally is not None
        if tally.settled:
            return
        tally.settled, tally.on_settled = True, None
        why = None if tally.kernel is not None else audit.unsettled_reason(self.denials.status(), tally.own is not None)
        self.send(session.conn, protocol.settled(session.pid, tally.summary(), why))
        self.denials.forget(session)
