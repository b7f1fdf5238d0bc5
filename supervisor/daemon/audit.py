"""Denial visibility: the audit mode (the operator's `serve --audit`, the host's state), the flags each domain gets, the `denials` reply (the record reader: audit_reader).

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
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from landlock import audit

from . import audit_settings
from .audit_reader import Reader
from .canaries import CANARY_DIR, make_canary_root, remove_canaries
from .denials import Denials
from .log import log
from .loop import Loop, Periodic

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

MODES = ("off", "count", "detail")
BACKLOG = 8192
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

    def _tell_followers(self, event: dict[str, Any], uids: set[int]) -> None:
        for conn in list(self.followers):
            if conn.peer.uid in uids:
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
