"""What the kernel denied each session: a record's domain -> its session, one event per distinct denial, rate-limited, with the manifest line that would allow it.

The records are Landlock's (landlock.audit); which are read at all is
supervisor/daemon/audit.py's business. A session's own domain is the one named by
the record of its canary: a file with a random name the zygote made for
that child alone, which the child, confined, tries to open for writing
before exec (landlock.enter.mark_domain). Nobody else can name it (its
directory is not listable), and it is removed at its first record: a
second one is nobody's. Nothing else attributes a domain: not a pid (reused, and
the `allocated` record names the pid that created a domain, whenever its
first denial comes: a foreign domain made from a pid a session's child
later gets would pass for the session's), not a process session. A
server's own nested domain is the session's only where the kernel names
its parent domain (6.18 does not): otherwise its denials are unattributed.
"""
from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from landlock import audit, rights

from .. import protocol
from ..manifests import refusal, scalar

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

# A session's distinct denials kept (each counted after its first), and the
# events it gets a second beyond a burst: a server polling a forbidden file
# costs its client one line, a flood of distinct ones a bounded trickle.
DISTINCT_MAX = 512
RATE, BURST = 20.0, 50
# Records of a domain not known yet (its canary's event may complete up to
# EVENT_WAIT after a later one: a task without an audit context has no
# EOE): kept this long, for this many domains, this many records in all
# (the rest counted as unattributed at once): memory stays bounded (each
# may hold two 4 KiB names) whatever a flood of foreign domains sends.
UNKNOWN_WAIT, UNKNOWN_MAX, UNKNOWN_KEPT = 0.5, 1024, 256
# Canary records of pooled children not handed a session yet.
UNCLAIMED_MAX = 4096
RECENT_MAX = 1000
# The zygote's canary names (zygote.canary.make).
_CANARY_NAME = re.compile(r"[0-9a-f]{32}")


def home_dirs() -> frozenset[str]:
    """The homes of the host's users as /etc/passwd has them, /root, what
    /home holds, and this process's $HOME (set by the environment, as in
    containers: passwd may not know it)."""
    import os
    import pwd
    found = {"/root", os.environ.get("HOME") or "/", *(p.pw_dir for p in pwd.getpwall())}
    try:
        found |= {os.path.join("/home", n) for n in os.listdir("/home")}
    except OSError:
        pass
    return refusal.known(found, ()).homes


# The manifest's network keys, by the kernel's name of the right.
_NET_KEYS = {"net.connect_tcp": "connect_tcp", "net.bind_tcp": "bind_tcp", "net.connect_send_udp": "connect_udp",
             "net.bind_udp": "bind_udp"}
# Path classes, narrowest first: a denial gets the first that covers it.
_CLASSES = sorted(rights.PATH_CLASSES.items(), key=lambda item: bin(item[1]).count("1"))


def _fs_rights(blockers: tuple[str, ...]) -> int | None:
    """The blockers as landlock.rights.FS flags; None if one is not a filesystem right."""
    mask = 0
    for blocker in blockers:
        kind, _, name = blocker.partition(".")
        if kind != "fs" or name.upper() not in rights.FS.__members__:
            return None
        mask |= rights.FS[name.upper()]
    return mask


def allow_line(blockers: tuple[str, ...], path: str | None, port: int | None,
               known: refusal.Known) -> tuple[str | None, str | None]:
    """(the manifest line that would allow it, or None; why not): the
    narrowest class of landlock.rights.PATH_CLASSES holding every right
    denied. Pure: tested as a table."""
    net = [_NET_KEYS[b] for b in blockers if b in _NET_KEYS]
    if net:
        return (f"{net[0]}: [{port}]", None) if port is not None else (None, "no port in the record")
    if any(b.startswith("scope.") for b in blockers):
        return None, "a scope (signals, abstract unix sockets) is not granted per target"
    needed = _fs_rights(blockers)
    cls = next((name for name, mask in _CLASSES if needed is not None and needed & mask == needed), None)
    if path is None or cls is None:
        return None, "no manifest class grants " + ",".join(sorted(blockers))
    why = refusal.why_not(path, known)
    if why is not None:
        return None, f"not proposed: {why}"
    if not scalar.writable(path):
        return None, "not proposed: a manifest cannot name this path as it is"
    # One token: a path the server chose with a comma or a bracket in it is one grant, not two.
    return f"{cls}: [{scalar.token(path)}]", None


def describe(access: audit.Access) -> tuple[str, str]:
    """(kind, object) of an access: a path, an address and port, a process."""
    if access.port is not None:
        return "tcp", f"{access.addr or '?'}:{access.port}"
    if access.opid is not None:
        return "process", f"pid {access.opid} ({scalar.token(access.ocomm or '?')})"
    if any(b == "scope.abstract_unix_socket" for b in access.blockers):
        return "abstract_unix_socket", "@" + (access.path or "").lstrip("\0")
    return "path", access.path or "?"


@dataclass
class Tally:
    """One session's denials."""
    quiet: tuple[str, ...]                   # path prefixes its profiles expect denied (node's /proc reads)
    canary: str | None = None                # its child's canary file (see the module's doc)
    own: int | None = None                   # the domain its canary's record named
    domains: set[int] = field(default_factory=set)
    received: int = 0                        # denials whose records reached us
    shown: int = 0                           # distinct ones told
    suppressed: int = 0                      # in `quiet`: counted, not told
    hidden: int = 0                          # over the rate or the distinct cap
    kernel: int | None = None                # the kernel's own count, from `deallocated`
    seen: dict[tuple[tuple[str, ...], str], int] = field(default_factory=dict)
    tokens: float = BURST
    refilled: float = field(default_factory=time.monotonic)
    early: list[dict[str, Any]] = field(default_factory=list)  # before `spawned` went out
    unowned: list[dict[str, Any]] = field(default_factory=list)  # its `recent` ones while it was a warm spare
    on_settled: Callable[[], None] | None = None   # the `settled` waiting for `kernel`, after `exited`
    settled: bool = False                    # that wait is over

    def summary(self) -> dict[str, Any]:
        return {"received": self.received, "shown": self.shown, "suppressed": self.suppressed,
                "hidden": self.hidden, "kernel": self.kernel}

    def spend(self) -> bool:
        """A token of the rate limit, if one is left."""
        now = time.monotonic()
        self.tokens = min(BURST, self.tokens + (now - self.refilled) * RATE)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Denials:
    """Records in, `denied` events out (to the session's client, and to
    whoever follows), counts kept per session."""

    def __init__(self, canary_root: str | None, tell: Callable[[Any, dict[str, Any]], bool],
                 follow: Callable[[dict[str, Any], set[int]], None]) -> None:
        self.canary_root = canary_root  # where this supervisor's zygote makes canaries
        self.tell = tell               # (session, event): to its client, if it reads them (whether it went)
        self.follow = follow           # (event, uids): to the followers of those uids
        # What no line proposes (refusal.py): the server adds its servers'
        # HOMEs and its own directories once it knows them.
        self.known = refusal.known(home_dirs(), ())
        self.domains: dict[int, Any] = {}                                   # domain -> Session
        self.claims: dict[str, Any] = {}     # canary name -> the session still waiting for its record
        # Canary records that came before their session (a pooled child's): name -> domain, and back.
        self.unclaimed: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.unclaimed_name: dict[int, str] = {}
        self.unknown: collections.OrderedDict[int, list[tuple[float, audit.Access, audit.Syscall | None]]] = \
            collections.OrderedDict()
        self.unknown_kept = 0          # records in `unknown`
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_MAX)
        self.unattributed = 0
        self.behind: Callable[[], bool] = lambda: False   # records wait unread (the reader says)
        self.status: Callable[[], audit.Status | None] = lambda: None   # the host's audit status (the reader's)

    # ---- domains ------------------------------------------------------

    def domain(self, record: audit.Domain) -> None:
        if record.status == "allocated" and record.parent is not None:
            session = self.domains.get(record.parent)   # a nested domain, its parent named by the kernel
            if session is not None:
                self._attach(session, record.domain)
        elif record.status == "deallocated":
            session = self.domains.pop(record.domain, None)
            self._drop_unknown(record.domain)
            name = self.unclaimed_name.pop(record.domain, None)
            if name is not None:
                self.unclaimed.pop(name, None)
            if session is not None and session.tally is not None and record.denials is not None:
                tally = session.tally
                canary = record.domain == tally.own
                tally.kernel = (tally.kernel or 0) + max(0, record.denials - canary)
                if tally.on_settled is not None and not any(d in self.domains for d in tally.domains):
                    settled, tally.on_settled = tally.on_settled, None
                    settled()

    def _attach(self, session: Any, domain: int) -> None:
        if session.tally is None:
            return
        session.tally.domains.add(domain)
        self.domains[domain] = session
        kept = self.unknown.pop(domain, [])
        self.unknown_kept -= len(kept)
        for _, access, syscall in kept:
            self._count(session, access, syscall)

    def started(self, session: Any) -> None:
        """A new session (fresh or pooled): its canary's record may have come already."""
        if session.tally is None or session.tally.canary is None:
            return
        name = os.path.basename(session.tally.canary)
        domain = self.unclaimed.pop(name, None)
        if domain is None:
            self.claims[name] = session
            return
        self.unclaimed_name.pop(domain, None)
        self._own(session, domain)

    def _marked(self, name: str, domain: int) -> None:
        """A record of one of our canaries: it names that child's domain,
        the first time only (the canary goes now: a second record of it is
        nobody's, whoever made it)."""
        try:
            os.unlink(f"{self.canary_root}/{name}")
        except FileNotFoundError:
            self.unattributed += 1
            return
        session = self.claims.pop(name, None)
        if session is not None:
            self._own(session, domain)
            return
        self.unclaimed[name] = domain
        self.unclaimed_name[domain] = name
        while len(self.unclaimed) > UNCLAIMED_MAX:   # (deallocated records lost)
            self.unclaimed_name.pop(self.unclaimed.popitem(last=False)[1], None)

    def _own(self, session: Any, domain: int) -> None:
        """A session has one own domain: another is nobody's."""
        if session.tally is None or session.tally.own is not None:
            self.unattributed += 1
            return
        session.tally.own = domain
        self._attach(session, domain)

    def _canary_name(self, access: audit.Access) -> str | None:
        """The name of our canary the access names, or None."""
        if self.canary_root is None or access.path is None or access.blockers != ("fs.write_file",):
            return None
        parent, _, name = access.path.rpartition("/")
        return name if parent == self.canary_root and _CANARY_NAME.fullmatch(name) else None

    def awaits(self, session: Any) -> bool:
        """Whether a `settled` should wait for the kernel's count: a domain
        of it is known and not deallocated yet."""
        tally = session.tally
        return (tally is not None and not tally.settled and tally.kernel is None
                and any(self.domains.get(d) is session for d in tally.domains))

    def forget(self, session: Any) -> None:
        for domain in session.tally.domains if session.tally else ():
            if self.domains.get(domain) is session:
                del self.domains[domain]
        canary = session.tally.canary if session.tally else None
        if canary is not None and self.claims.get(os.path.basename(canary)) is session:
            del self.claims[os.path.basename(canary)]   # its record never came: the canary goes
            try:
                os.unlink(canary)
            except OSError:
                pass

    # ---- denials ------------------------------------------------------

    def access(self, access: audit.Access, syscall: audit.Syscall | None) -> None:
        name = self._canary_name(access)
        if name is not None:
            self._marked(name, access.domain)
            return
        session = self.domains.get(access.domain)
        if session is None:
            self._keep_unknown(access, syscall)
            return
        self._count(session, access, syscall)

    def _keep_unknown(self, access: audit.Access, syscall: audit.Syscall | None) -> None:
        """Kept a while in case its domain's canary record completes later;
        bounded in domains and in records."""
        now = time.monotonic()
        while self.unknown:
            oldest, first = next(iter(self.unknown.items()))
            if first[0][0] > now - UNKNOWN_WAIT and len(self.unknown) < UNKNOWN_MAX:
                break
            self._drop_unknown(oldest)
        if self.unknown_kept >= UNKNOWN_KEPT:
            self.unattributed += 1
            return
        self.unknown.setdefault(access.domain, []).append((now, access, syscall))
        self.unknown_kept += 1

    def _drop_unknown(self, domain: int) -> None:
        kept = self.unknown.pop(domain, None)
        if kept is not None:
            self.unknown_kept -= len(kept)
            self.unattributed += len(kept)

    def handed(self, session: Any) -> None:
        """A warm spare handed over: what it was denied while it waited is
        its client's to read (`denials`), as a fresh child's before `spawned`
        is, and told now to its uid's followers (the supervisor's owner's
        were told as it came)."""
        if session.tally is not None:
            for entry in session.tally.unowned:
                entry["uid"] = session.uid
                self.follow({k: v for k, v in entry.items() if k not in ("time", "uid")},
                            {session.uid} - {os.geteuid()})
            session.tally.unowned = []

    def _count(self, session: Any, access: audit.Access, syscall: audit.Syscall | None) -> None:
        tally = session.tally
        tally.received += 1
        kind, obj = describe(access)
        key = (access.blockers, obj)
        seen = tally.seen.get(key)
        if seen is not None:
            tally.seen[key] = seen + 1
            return
        if kind == "path" and any(obj == q or obj.startswith(q.rstrip("/") + "/") for q in tally.quiet):
            tally.suppressed += 1
            return
        if len(tally.seen) >= DISTINCT_MAX or not tally.spend():
            tally.hidden += 1
            return
        tally.seen[key] = 1
        tally.shown += 1
        allow, why = allow_line(access.blockers, access.path if kind == "path" else None, access.port, self.known)
        event = protocol.denied(
            session.pid, session.manifest.name, list(access.blockers), kind, obj,
            None if syscall is None else {"pid": syscall.pid, "comm": syscall.comm, "exe": syscall.exe}, allow, why)
        self.recent.append({**event, "time": time.time(), "uid": session.uid})
        if session.held:
            tally.unowned.append(self.recent[-1])   # its client's once handed over (handed())
        self.follow(event, {session.uid, os.geteuid()})   # (a spare's uid is -1: nobody's yet)
        if not session.spawned:
            if len(tally.early) < BURST:
                tally.early.append(event)   # no `denied` before `spawned`
        elif not self.tell(session, event):
            tally.shown -= 1
            tally.hidden += 1   # its client does not read them: counted, never at the cost of its `exited`
