"""Denial visibility: the audit mode (the operator's `serve --audit`, the host's state), the flags each domain gets, the record reader in the loop, the `denials` reply.

Modes: `off` reads nothing; `count` (the default where audit is already on)
marks each domain with a canary denial before exec and learns from the
kernel how many denials a session had, logging nothing after exec;
`detail` logs every denial (LOG_NEW_EXEC_ON). Audit is host state: only an
operator's explicit `--audit count|detail` switches it on (and raises the
backlog when no audit daemon owns it), and it is put back when the last
supervisor relying on it is gone (audit_settings). Audit switched off under
a supervisor is seen within WATCH seconds, and said.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import select
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from landlock import audit

from . import audit_settings
from .denials import Denials
from .log import log
from .loop import Loop, Periodic, Timer

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

MODES = ("off", "count", "detail")
BACKLOG = 8192
# Datagrams read a turn of the loop: a flood of denials never keeps a
# spawn waiting; what the socket cannot hold is lost, and counted.
READS_PER_TURN = 64
# An event's records (ACCESS, then SYSCALL at syscall exit, EOE) may be
# interleaved with other events': kept by serial until its EOE, or this long.
# (Bounded for memory too: an event may hold two 4 KiB names, a path and an exe.)
EVENT_WAIT = 0.2
OPEN_EVENTS_MAX = 1024
# How long an `exited` waits for the kernel's count (the `deallocated`
# record comes ~60 ms after the domain's last process).
SETTLE_WAIT = 0.25
SETTLE_MAX = 2.0     # while records wait unread in the socket
NOT_VISIBLE = "; `landlock-supervisor learn` writes a manifest from a traced run instead"
# How often the host's audit status is checked while denials are read.
WATCH = 1.0


@dataclass
class Mode:
    """How denials are seen: off, count or detail, why, and the host settings it needs."""
    name: str                 # off, count, detail
    reason: str = ""          # why off, when it is
    panic: bool = False       # failure=2: a lost record panics the host
    nested: bool = False      # the servers' own domains' denials too
    wanted: dict[str, int] = field(default_factory=dict)   # host settings it needs changed
    holding: bool = False     # a holder in the shared record (audit_settings)
    lost_at_start: int = 0

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.name}
        if self.reason:
            out["reason"] = self.reason
        return out


def domain_logging(mode: str, manifest_log: tuple[str, ...], panic: bool,
                   nested: bool) -> tuple[tuple[str, ...], bool, str | None]:
    """(the restrict_self log flags, whether a canary marks the domain, a
    warning): how `--audit` and a manifest's `log:` combine. Pure.

    - subdomains_off always, unless the operator asked for nested denials: a
      server's own Landlock domain logs its denials by default, a flood the
      supervisor did not choose;
    - new_exec_on in `detail`, or where the manifest asks for it, never
      when a lost record panics the host (a server could flood it down);
    - same_exec_off only with `off`: in `count` and `detail` it would
      silence the canary;
    - a canary in `count` and `detail`."""
    flags = {f for f in manifest_log if f != "subdomains_off"}
    warning = None
    if mode != "off":
        flags.discard("same_exec_off")
    if mode == "detail":
        flags.add("new_exec_on")
    if "new_exec_on" in flags and panic:
        flags.discard("new_exec_on")
        warning = ("log: new_exec_on ignored: audit failure=2 here (a lost record panics the host), "
                   "and a server could flood it")
    if not nested:
        flags.add("subdomains_off")
    return tuple(sorted(flags)), mode != "off", warning


def choose(requested: str | None, nested: bool, logging_available: bool) -> Mode:
    """The mode, from the operator's choice and what this host allows. A
    mode the operator asked for and cannot have raises SystemExit."""
    def unavailable(reason: str) -> Mode:
        if requested in ("count", "detail"):
            raise SystemExit(f"landlock-supervisor: --audit {requested}: {reason}")
        return Mode("off", reason + NOT_VISIBLE, nested=nested)

    if requested == "off":
        return Mode("off", "serve --audit off", nested=nested)
    if not logging_available:
        return unavailable("Landlock cannot log denials on this kernel (Linux 6.15+, Landlock ABI 7)")
    if os.geteuid() != 0:
        return unavailable("a user's own supervisor cannot read audit records (CAP_AUDIT_READ)")
    if in_other_netns():
        return unavailable("audit records reach only the initial network namespace")
    try:
        status = audit.status()
    except OSError as e:
        return unavailable(f"cannot read the audit status: {e.strerror or e} (CAP_AUDIT_CONTROL, "
                           "in the initial PID namespace)")
    mode = Mode(requested or "count", panic=status.failure == audit.FAILURE_PANIC, nested=nested,
                lost_at_start=status.lost)
    if mode.name == "detail" and mode.panic:
        raise SystemExit("landlock-supervisor: --audit detail refused: audit failure=2 here, and a lost "
                         "record panics the host: a server flooding denials could bring it down")
    if not status.enabled:
        if requested is None:
            return Mode("off", "audit is off on this host; `serve --audit count` switches it on (host-wide: "
                               "every process's system calls are slower until reboot)" + NOT_VISIBLE)
        mode.wanted["enabled"] = 1
    if requested is not None and status.pid == 0 and status.enabled != 2:
        # No audit daemon owns the queue: ours is the only reader. A larger
        # one, and no wait for room in it: a process whose record finds it
        # full (a flood fills it) would sleep up to 60 s in the kernel, a
        # child of ours at its canary among them; the record is lost
        # instead, and counted.
        if status.backlog_limit < BACKLOG:
            mode.wanted["backlog_limit"] = BACKLOG
        if status.backlog_wait_time > 0:
            mode.wanted["backlog_wait_time"] = 0
    return mode


def hold(mode: Mode) -> None:
    """Rely on the host's audit (a holder in the shared record), with the
    settings the mode needs. Raises OSError when it cannot."""
    try:
        changed = audit_settings.hold(mode.wanted)
    except OSError as e:
        raise OSError(e.errno, f"cannot set the host's audit: {e.strerror or e}") from None
    mode.holding = True
    for name, value in changed.items():
        log(f"audit: {name} set to {value} (put back when no supervisor relies on it)")


def restore(mode: Mode) -> None:
    """No longer rely on it: the last holder puts back what was changed
    (audit stays `ever enabled`, and every process's system calls slower,
    until reboot: the kernel's doing)."""
    if not mode.holding:
        return
    mode.holding = False
    try:
        restored = audit_settings.release()
    except OSError as e:
        log(f"audit: cannot put the host's settings back: {e.strerror or e}")
        return
    for name, value in restored.items():
        log(f"audit: {name} put back to {value}")


def in_other_netns() -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino != os.stat("/proc/1/ns/net").st_ino
    except OSError:
        return False


def unsettled_reason(status: audit.Status | None, domain_known: bool) -> str:
    """Why a session's `deallocated` record (the kernel's count) did not
    come, from the host's audit status (the reader's: None when it cannot
    be read): the kernel logs none while audit is off, and another program
    (auditctl -e 0, an auditd stopping) may have switched it off; none for
    a domain that logged nothing (its canary's record never came). Pure:
    tested as a table."""
    if status is None:
        return "the kernel's count did not come, and the audit status cannot be read"
    if not status.enabled:
        return "audit is off on this host now (switched off during the session): the kernel logs nothing"
    if not domain_known:
        return ("no record of its domain came: audit was off while it ran (switched off and on again), or it "
                "logged nothing (its manifest grants the supervisor's canary, and nothing was denied), or the "
                "records were lost (see `denials`)")
    return "the kernel's count did not come in time (its record lost: see `denials` for what was lost)"


def make_canary_root(directory: str) -> str:
    """This supervisor's canary root, `<directory>/<pid>`, empty: where its
    zygote makes each child's canary (zygote.child.make_canary). Root's
    and 0711 at both levels: any uid may pass through to a canary whose
    name it was told, nobody may list one; no manifest grants it."""
    root = f"{directory}/{os.getpid()}"
    remove_canaries(root)   # a dead supervisor's, of our pid
    for path in (directory, root):
        try:
            os.mkdir(path, 0o711)
        except FileExistsError:
            pass
        try:   # (no lchmod before glibc 2.32: the directory's own fd)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise OSError(errno.EPERM, f"{path}: not a directory of ours") from None
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise OSError(errno.EPERM, f"{path}: not a directory of ours")
            os.fchmod(fd, 0o711)
        finally:
            os.close(fd)
    return root


def remove_canaries(root: str) -> None:
    """The canaries left in root (their records lost), then root."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError:
        pass


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


# Where the canaries are, which no manifest grants.
CANARY_DIR = audit_settings.DIRECTORY
# A `denials` reply holds the newest that fit in one datagram (64 KiB).
REPLY_MAX = 60000


class Visibility:
    """One supervisor's view of the kernel's denials: the mode chosen
    before any fork (a task has an audit context only if audit was on
    when it was forked), the reader, the canary, who follows."""

    def __init__(self, loop: Loop, requested: str | None, nested: bool, private: bool,
                 offer: Callable[[Any, dict[str, Any]], bool]) -> None:
        import landlock
        self.logging_available = "logging" in landlock.support.probe().features
        self.mode = choose(requested, nested, self.logging_available)
        self.blind: str | None = None      # why denials are no longer seen (audit switched off under us)
        # In every `spawned`, and the `denials` reply: updated in place.
        self.report: dict[str, Any] = self.mode.describe()
        self.offer = offer
        self.followers: list[Any] = []     # connections of `denials --follow`
        self.reader: Reader | None = None
        self.canary: str | None = None
        # (A private supervisor's stderr is its client's: `run` says it when a server fails.)
        self.quiet = private
        if self.mode.name != "off":
            self._read(loop, requested)
        elif requested != "off":
            self._say(f"denials: not visible: {self.mode.reason}")

    def _say(self, line: str) -> None:
        if not self.quiet:
            log(line)

    def _read(self, loop: Loop, requested: str | None) -> None:
        try:
            hold(self.mode)
            self.canary = make_canary_root(CANARY_DIR)
            sock = audit.open_reader()
        except (audit.Unavailable, OSError) as e:
            self.close()
            if requested is not None:
                raise SystemExit(f"landlock-supervisor: --audit {self.mode.name}: {e}") from None
            self.mode = Mode("off", f"{e}{NOT_VISIBLE}")
            self._describe()
            self._say(f"denials: not visible: {self.mode.reason}")
            return
        denials = Denials(self.canary, lambda s, event: self.offer(s.conn, event), self._tell_followers)
        self.reader = Reader(loop, sock, denials)
        self.reader.status()   # (no record read yet: asked)
        Periodic(loop, WATCH, self._watch).start()
        self._say(f"denials: {self.mode.name} mode" + (" (nested domains too)" if self.mode.nested else ""))

    def _describe(self) -> None:
        self.report.clear()
        self.report.update({"mode": "off", "reason": self.blind} if self.blind else self.mode.describe())

    def _watch(self) -> bool:
        """Audit switched off under us (by another process): said, not
        reported as zero denials; and when it is back on."""
        if self.reader is None:
            return False
        if self.reader.busy:   # records flow: audit is on (and asking could make the loop wait)
            self.reader.busy = False
            enabled = True
        else:
            status = self.reader.status()
            if status is None:
                return True
            enabled = status.enabled != 0
        if bool(self.blind) == enabled:   # (a host's steady records must not keep it "off")
            if not enabled:
                self.blind = (f"audit was switched off on this host at {time.strftime('%H:%M:%S')} by another "
                              f"process: denials are not seen (the mode was {self.mode.name})")
                self._say(f"denials: not visible any more: {self.blind}")
            else:
                self.blind = None
                self._say(f"denials: {self.mode.name} mode again (audit is back on)")
            self._describe()
        return True

    @property
    def denials(self) -> Denials | None:
        return self.reader.denials if self.reader is not None else None

    def logged(self, spec: Any) -> tuple[Any, str | None]:
        """A manifest's Spec with the log flags this mode gives its domains
        (domain_logging), and a warning when its `log:` was overruled."""
        if not self.logging_available:
            return spec, None
        flags, _, warning = domain_logging(self.mode.name, spec.log, self.mode.panic, self.mode.nested)
        return dataclasses.replace(spec, log=flags), warning

    def reply(self, uid: int, everyone: bool) -> dict[str, Any]:
        """The `denials` reply: the recent ones uid may see (everyone: all),
        newest last, as many as fit in one datagram."""
        reply: dict[str, Any] = {"event": "denials", **self.report, "recent": [], "omitted": 0}
        if self.reader is not None:
            reply["lost"] = self.reader.lost(self.mode)
            visible = [d for d in self.reader.denials.recent if everyone or d["uid"] == uid]
            size = 0
            for d in reversed(visible):
                size += len(json.dumps(d)) + 2
                if size > REPLY_MAX:
                    break
                reply["recent"].append(d)
            reply["recent"].reverse()
            reply["omitted"] = len(visible) - len(reply["recent"])
        return reply

    def _tell_followers(self, event: dict[str, Any], uid: int) -> None:
        for conn in list(self.followers):
            if conn.peer.uid in (uid, os.geteuid()):
                self.offer(conn, event)

    def unfollow(self, conn: Any) -> None:
        if conn in self.followers:
            self.followers.remove(conn)

    def close(self) -> None:
        """The reader closed, the canaries removed, the host's settings put back."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.canary is not None:
            remove_canaries(self.canary)
            self.canary = None
        restore(self.mode)
