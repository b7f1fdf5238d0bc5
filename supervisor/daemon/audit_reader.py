"""The audit records read in the supervisor's loop: the multicast socket, a bounded number of datagrams a turn, records grouped by event, then handed to Denials."""
from __future__ import annotations

import errno
import select
import socket
import time

from landlock import audit

from .denials import Denials
from .loop import Loop, Timer

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from .audit import Mode

# Datagrams read a turn of the loop: a flood of denials never keeps a
# spawn waiting; what the socket cannot hold is lost, and counted.
READS_PER_TURN = 64
# An event's records (ACCESS, then SYSCALL at syscall exit, EOE) may be
# interleaved with other events': kept by serial until its EOE, or this long.
# (Bounded for memory too: an event may hold two 4 KiB names, a path and an exe.)
EVENT_WAIT = 0.2
OPEN_EVENTS_MAX = 1024

class Reader:
    """The multicast socket, read in the loop a bounded number of
    datagrams a turn; records grouped by event, then handed to Denials."""

    def __init__(self, loop: Loop, sock: socket.socket, denials: Denials) -> None:
        self.loop, self.sock, self.denials = loop, sock, denials
        self.events: dict[int, tuple[float, list[audit.Access], list[audit.Syscall]]] = {}
        self.overflows = 0        # ENOBUFS: records lost for this reader
        self.timer: Timer | None = None
        self.busy = False         # records came since the last status (see status())
        self.last_status: audit.Status | None = None
        denials.behind = lambda: bool(select.select([sock], [], [], 0)[0])
        denials.status = self.status
        loop.watch(sock, self.on_readable, last=True)   # clients' requests first, whatever the flood

    def close(self) -> None:
        self.loop.unwatch(self.sock)
        self.sock.close()

    def on_readable(self) -> None:
        self.busy = True
        for _ in range(READS_PER_TURN):
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self.overflows += 1
                    continue
                raise
            for serial, record in audit.records(data):
                self._record(serial, record)
        if self.events and self.timer is None:
            self.timer = self.loop.at(EVENT_WAIT, self._flush)

    def _record(self, serial: int, record: audit.Record | None) -> None:
        if isinstance(record, audit.Domain):
            if record.status == "deallocated":
                self._finish_domain(record.domain)
            self.denials.domain(record)  # at once: the event's accesses need it
            return
        if record is None:  # EOE: the event is complete
            self._finish(serial)
            return
        event = self.events.get(serial)
        if event is None:
            if isinstance(record, audit.Syscall):
                return  # another subsystem's event
            if len(self.events) >= OPEN_EVENTS_MAX:
                self._finish(next(iter(self.events)))
            event = self.events[serial] = (time.monotonic(), [], [])
        if isinstance(record, audit.Access):
            event[1].append(record)
        else:
            event[2].append(record)

    def _finish(self, serial: int) -> None:
        event = self.events.pop(serial, None)
        if event is None:
            return
        syscall = event[2][0] if event[2] else None
        for access in event[1]:
            self.denials.access(access, syscall)

    def _finish_domain(self, domain: int) -> None:
        """A deallocated domain's events are complete (its processes are
        gone, their records came first): those still open (no EOE: a task
        without an audit context) are handled before its count, so that its
        canary's record names it first (a child that ended at once: its
        `settled` gets the count)."""
        for serial in [s for s, e in self.events.items() if any(a.domain == domain for a in e[1])]:
            self._finish(serial)

    def _flush(self) -> None:
        """Events without an EOE (a task without an audit context)."""
        self.timer = None
        due = time.monotonic() - EVENT_WAIT
        for serial in [s for s, e in self.events.items() if e[0] <= due]:
            self._finish(serial)
        if self.events:
            self.timer = self.loop.at(EVENT_WAIT, self._flush)

    def status(self) -> audit.Status | None:
        """The host's audit status, asked only when no record came since the
        last time: the kernel makes whoever sends it a request sleep while
        its backlog is over the limit (up to backlog_wait_time, 60 s by
        default), and a flood keeps it there: the whole loop would wait.
        Else (audit is on: records flow) the last answer, None before any."""
        if not self.busy:
            try:
                self.last_status = audit.status()
            except OSError:
                pass
        self.busy = False
        return self.last_status

    def lost(self, mode: Mode) -> dict[str, int]:
        """What the kernel dropped since start (all record types: its
        counter is host-wide; as of the last status), and what this reader
        could not hold."""
        status = self.status()
        kernel = -1 if status is None else max(0, status.lost - mode.lost_at_start)
        return {"kernel": kernel, "reader_overflows": self.overflows,
                "unattributed": self.denials.unattributed}
