"""Denial visibility: the audit mode (the operator's `serve --audit`, the host's state), the flags each domain gets, the record reader in the loop, the `denials` reply.

Modes: `off` reads nothing; `count` (the default where audit is already on)
marks each domain with a canary denial before exec and learns from the
kernel how many denials a session had, logging nothing after exec;
`detail` logs every denial (LOG_NEW_EXEC_ON). Audit is host state: only an
operator's explicit `--audit count|detail` switches it on (and raises the
backlog when no audit daemon owns it), and it is put back at the end.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from landlock import audit

from .denials import Denials
from .log import log
from .loop import Loop, Timer

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
EVENT_WAIT = 0.2
OPEN_EVENTS_MAX = 4096
# How long an `exited` waits for the kernel's count (the `deallocated`
# record comes ~60 ms after the domain's last process).
SETTLE_WAIT = 0.25
SETTLE_MAX = 2.0     # while records wait unread in the socket
NOT_VISIBLE = "; `landlock-supervisor learn` writes a manifest from a traced run instead"


@dataclass
class Mode:
    """How denials are seen: off, count or detail, why, and the host settings to restore."""
    name: str                 # off, count, detail
    reason: str = ""          # why off, when it is
    panic: bool = False       # failure=2: a lost record panics the host
    nested: bool = False      # the servers' own domains' denials too
    restore: dict[str, int] = field(default_factory=dict)   # host settings changed, their old values
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
        _set(mode, "enabled", 1, status.enabled)
    if requested is not None and status.pid == 0 and status.backlog_limit < BACKLOG and status.enabled != 2:
        _set(mode, "backlog_limit", BACKLOG, status.backlog_limit)
    return mode


def _set(mode: Mode, name: str, value: int, old: int) -> None:
    try:
        audit.set_status(**{name: value})
    except OSError as e:
        raise SystemExit(f"landlock-supervisor: --audit {mode.name}: cannot set audit {name}: "
                         f"{e.strerror or e}") from None
    mode.restore[name] = old
    log(f"audit: {name} set to {value} (was {old}; put back at the end)")


def restore(mode: Mode) -> None:
    """Put back what choose() changed (audit stays `ever enabled`, and every
    process's system calls slower, until reboot: the kernel's doing)."""
    for name, old in mode.restore.items():
        try:
            audit.set_status(**{name: old})
        except OSError as e:
            log(f"audit: cannot put {name} back to {old}: {e.strerror or e}")
    mode.restore.clear()


def in_other_netns() -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino != os.stat("/proc/1/ns/net").st_ino
    except OSError:
        return False


def unsettled_reason(domain_known: bool) -> str:
    """Why a session's `deallocated` record (the kernel's count) did not
    come: the kernel logs none while audit is off, and another program
    (auditctl -e 0, an auditd stopping) may have switched it off; none for
    a domain that logged nothing (a manifest granting the canary)."""
    try:
        enabled = audit.status().enabled
    except OSError as e:
        return f"the kernel's count did not come, and the audit status cannot be read: {e.strerror or e}"
    if not enabled:
        return "audit is off on this host now (switched off during the session): the kernel logs nothing"
    if not domain_known:
        return ("no record of its domain came: audit was off while it ran (switched off and on again), or it "
                "logged nothing (its manifest grants the supervisor's canary, and nothing was denied), or the "
                "records were lost (see `denials`)")
    return "the kernel's count did not come in time (its record lost: see `denials` for what was lost)"


def make_canary(directory: str) -> str:
    """A file every domain denies (no manifest grants the supervisor's own
    directory) and DAC lets any uid open: a DAC refusal is never logged."""
    os.makedirs(directory, mode=0o711, exist_ok=True)
    st = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory) or st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{directory}: not a directory of ours")
    os.chmod(directory, 0o711)
    path = os.path.join(directory, f"canary-{os.getpid()}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444))
    os.chmod(path, 0o444)
    return path


class Reader:
    """The multicast socket, read in the loop a bounded number of
    datagrams a turn; records grouped by event, then handed to Denials."""

    def __init__(self, loop: Loop, sock: socket.socket, denials: Denials) -> None:
        self.loop, self.sock, self.denials = loop, sock, denials
        self.events: dict[int, tuple[float, list[audit.Access], list[audit.Syscall]]] = {}
        self.overflows = 0        # ENOBUFS: records lost for this reader
        self.timer: Timer | None = None
        denials.behind = lambda: bool(select.select([sock], [], [], 0)[0])
        loop.watch(sock, self.on_readable, last=True)

    def close(self) -> None:
        self.loop.unwatch(self.sock)
        self.sock.close()

    def on_readable(self) -> None:
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

    def _flush(self) -> None:
        """Events without an EOE (a task without an audit context)."""
        self.timer = None
        due = time.monotonic() - EVENT_WAIT
        for serial in [s for s, e in self.events.items() if e[0] <= due]:
            self._finish(serial)
        if self.events:
            self.timer = self.loop.at(EVENT_WAIT, self._flush)

    def lost(self, mode: Mode) -> dict[str, int]:
        """What the kernel dropped since start (all record types: its
        counter is host-wide) and what this reader could not hold."""
        try:
            kernel = max(0, audit.status().lost - mode.lost_at_start)
        except OSError:
            kernel = -1
        return {"kernel": kernel, "reader_overflows": self.overflows,
                "unattributed": self.denials.unattributed}


# The canary every domain denies, where no manifest grants.
CANARY_DIR = "/run/landlock-supervisor-audit"
# A `denials` reply holds the newest that fit in one datagram (64 KiB).
REPLY_MAX = 60000


class Visibility:
    """One supervisor's view of the kernel's denials: the mode chosen
    before any fork (a task has an audit context only if audit was on
    when it was forked), the reader, the canary, who follows."""

    def __init__(self, loop: Loop, requested: str | None, nested: bool, private: bool,
                 session_of: Callable[[int], Any], offer: Callable[[Any, dict[str, Any]], bool]) -> None:
        import landlock
        self.logging_available = "logging" in landlock.support.probe().features
        self.mode = choose(requested, nested, self.logging_available)
        self.offer = offer
        self.followers: list[Any] = []     # connections of `denials --follow`
        self.reader: Reader | None = None
        self.canary: str | None = None
        # (A private supervisor's stderr is its client's: `run` says it when a server fails.)
        self.quiet = private
        if self.mode.name != "off":
            self._read(loop, requested, session_of)
        elif requested != "off":
            self._say(f"denials: not visible: {self.mode.reason}")

    def _say(self, line: str) -> None:
        if not self.quiet:
            log(line)

    def _read(self, loop: Loop, requested: str | None, session_of: Callable[[int], Any]) -> None:
        try:
            self.canary = make_canary(CANARY_DIR)
            sock = audit.open_reader()
        except (audit.Unavailable, OSError) as e:
            self.close()
            if requested is not None:
                raise SystemExit(f"landlock-supervisor: --audit {self.mode.name}: {e}") from None
            self.mode = Mode("off", f"{e}{NOT_VISIBLE}")
            self._say(f"denials: not visible: {self.mode.reason}")
            return
        denials = Denials(self.canary, session_of, lambda s, event: self.offer(s.conn, event), self._tell_followers)
        self.reader = Reader(loop, sock, denials)
        self._say(f"denials: {self.mode.name} mode" + (" (nested domains too)" if self.mode.nested else ""))

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
        reply: dict[str, Any] = {"event": "denials", **self.mode.describe(), "recent": [], "omitted": 0}
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
        """The reader closed, the canary removed, the host's settings put back."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.canary is not None:
            try:
                os.unlink(self.canary)
            except OSError:
                pass
            self.canary = None
        restore(self.mode)
