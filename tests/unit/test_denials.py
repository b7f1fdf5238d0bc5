"""Denials without a kernel: records parsed, the manifest line proposed, the
log flags chosen, attribution, dedup and rate limit, the lines a person reads."""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest

from landlock import audit
from supervisor.daemon import denials as d
from supervisor import denied
from supervisor.manifests import refusal
from supervisor.daemon.audit import domain_logging

# Records as this kernel (6.18) wrote them (docs in shared/notes), hex forms included.
SAMPLES = [
    (1423, b'audit(1796131424.552:8): domain=148a3a11c blockers=fs.read_file path="/etc/passwd" dev="vda" ino=739'),
    (1424, b'audit(1796131424.552:8): domain=148a3a11c status=allocated mode=enforcing pid=28885 uid=0 '
           b'exe="/usr/bin/python3.11" comm="python3"'),
    (1300, b'audit(1796131424.552:8): arch=c000003e syscall=257 success=no exit=-13 ppid=28739 pid=28885 '
           b'comm="python3" exe="/usr/bin/python3.11" key=(null)'),
    (1327, b'audit(1796131424.552:8): proctitle=2F7573722F62696E2F707974686F6E33'),
    (1320, b'audit(1796131424.552:8): '),
    (1423, b'audit(1796131424.600:9): domain=148a3a11c blockers=net.connect_tcp daddr=127.0.0.1 dest=9'),
    (1423, b'audit(1796131424.601:10): domain=148a3a11c blockers=scope.signal opid=28739 ocomm="python3"'),
    (1423, b'audit(1796131424.602:11): domain=148a3a11c blockers=fs.make_reg path=2F746D702F6120620A dev="vda" '
           b'ino=403231'),
    (1300, b'audit(1796131424.603:12): arch=c000003e syscall=257 pid=7 comm=6E706D206578656320636F77736179 exe="/x"'),
    (1424, b'audit(1796131424.628:21): domain=148a3a11c status=deallocated denials=13'),
    (1100, b'audit(1796131424.700:22): pid=1 uid=0 msg="some login record"'),
]


def _datagram(records: list[tuple[int, bytes]]) -> bytes:
    out = b""
    for typ, body in records:
        msg = struct.pack("=IHHII", 16 + len(body), typ, 0, 0, 0) + body
        out += msg + b"\0" * (-len(msg) % 4)
    return out


def test_records_are_parsed_from_a_datagram() -> None:
    got = list(audit.records(_datagram(SAMPLES)))
    assert got[0] == (8, audit.Access(8, 0x148a3a11c, ("fs.read_file",), "/etc/passwd", None, None, None, None))
    assert got[1] == (8, audit.Domain(8, 0x148a3a11c, "allocated", 28885, None))
    assert got[2] == (8, audit.Syscall(8, 28885, "python3", "/usr/bin/python3.11"))
    assert got[3] == (8, None)   # EOE; the PROCTITLE record is not kept
    assert got[4][1] == audit.Access(9, 0x148a3a11c, ("net.connect_tcp",), None, "127.0.0.1", 9, None, None)
    assert got[5][1].opid == 28739 and got[5][1].ocomm == "python3"
    assert got[6][1].path == "/tmp/a b\n"            # hex: the server named it
    assert got[7][1].comm == "npm exec cowsay"
    assert got[8][1] == audit.Domain(21, 0x148a3a11c, "deallocated", None, 13)
    assert len(got) == 9                            # the login record is not ours to keep
    nested = b"audit(1.2:3): domain=148a3a12a status=allocated mode=enforcing pid=7 parent=148a3a11c"
    assert list(audit.records(_datagram([(1424, nested)])))[0][1].parent == 0x148a3a11c   # a kernel naming it                            # the login record is not ours to keep


KNOWN = refusal.known({"/root", "/home/ann"}, ("/srv/llsv-state",))


@pytest.mark.parametrize("blockers, path, port, line", [
    (("fs.read_file",), "/etc/hostname", None, "read_only_noexec: [/etc/hostname]"),
    (("fs.read_dir",), "/usr/share/doc", None, "read_only_noexec: [/usr/share/doc]"),
    (("fs.execute", "fs.read_file"), "/usr/bin/cat", None, "read_only: [/usr/bin/cat]"),
    (("fs.make_reg",), "/var/tmp", None, "read_write_noexec: [/var/tmp]"),
    (("fs.write_file",), "/home/ann/projects/x", None, "read_write_noexec: [/home/ann/projects/x]"),
    (("net.connect_tcp",), None, 443, "connect_tcp: [443]"),
    (("net.bind_tcp",), None, 8080, "bind_tcp: [8080]"),
    (("net.connect_send_udp",), None, 53, "connect_udp: [53]"),
    (("fs.resolve_unix",), "/run/app.sock", None, "connect_unix: [/run/app.sock]"),
    (("fs.read_file", "fs.truncate"), "/srv/log", None, "read_write_noexec: [/srv/log]"),
    (("scope.signal",), None, None, None),
    (("fs.read_dir",), "/", None, None),
    (("fs.read_dir",), "/home/ann", None, None),
    (("fs.read_dir",), "/root", None, None),
    (("fs.read_file",), "/home/ann/.ssh/id_ed25519", None, None),
    (("fs.read_file",), "/home/ann/.config/gh/hosts.yml", None, None),
    (("fs.read_file",), "/home/ann/proj/.env", None, None),
    (("fs.read_file",), "/etc/shadow", None, None),
    (("fs.change_topology",), "/mnt", None, None),
    (("fs.read_file",), "/srv/llsv-state/parsed/x.json", None, None),   # the supervisor's state root
    (("fs.read_file",), "/srv/home/bob/.ssh/id_test", None, None),      # a home passwd does not list
    # A path the server chose is one grant, however it is named:
    (("fs.read_file",), "/tmp/a, /home/ann/f", None, 'read_only_noexec: ["/tmp/a, /home/ann/f"]'),
    (("fs.read_file",), "/tmp/x], read_write: [/root", None, 'read_only_noexec: ["/tmp/x], read_write: [/root"]'),
    (("fs.read_file",), "/tmp/caf\u00e9 #1", None, 'read_only_noexec: ["/tmp/caf\\u00e9 #1"]'),
    (("fs.read_file",), "/tmp/${HOME}", None, None),   # the loader would expand it: another path
])
def test_the_manifest_line_that_would_allow_it(blockers: tuple[str, ...], path: str | None, port: int | None,
                                               line: str | None) -> None:
    allow, why = d.allow_line(blockers, path, port, KNOWN)
    assert allow == line
    assert (why is None) == (line is not None)


@pytest.mark.parametrize("mode, manifest_log, panic, nested, flags, canary, warns", [
    ("off", (), False, False, ("subdomains_off",), False, False),
    ("off", ("same_exec_off",), False, False, ("same_exec_off", "subdomains_off"), False, False),
    ("off", ("new_exec_on",), True, False, ("subdomains_off",), False, True),
    ("count", (), False, False, ("subdomains_off",), True, False),
    ("count", ("same_exec_off",), False, False, ("subdomains_off",), True, False),   # it would hide the canary
    ("count", ("new_exec_on",), False, False, ("new_exec_on", "subdomains_off"), True, False),
    ("count", ("new_exec_on",), True, False, ("subdomains_off",), True, True),
    ("detail", (), False, False, ("new_exec_on", "subdomains_off"), True, False),
    ("detail", (), False, True, ("new_exec_on",), True, False),
    ("count", ("subdomains_off",), False, True, (), True, False),   # the operator's choice wins
])
def test_how_audit_mode_and_manifest_log_combine(mode: str, manifest_log: tuple[str, ...], panic: bool,
                                                 nested: bool, flags: tuple[str, ...], canary: bool,
                                                 warns: bool) -> None:
    got_flags, got_canary, warning = domain_logging(mode, manifest_log, panic, nested)
    assert (got_flags, got_canary, warning is not None) == (flags, canary, warns)


@dataclass
class Manifest:
    name: str = "srv"


@dataclass
class Session:
    pid: int
    uid: int = 1000
    spawned: bool = True
    tally: d.Tally | None = None
    manifest: Manifest = field(default_factory=Manifest)
    held: bool = False   # a warm spare, nobody's yet


class World:
    def __init__(self, root: Any) -> None:
        self.root = str(root)
        self.told: list[tuple[int, dict[str, Any]]] = []
        self.followed: list[dict[str, Any]] = []
        self.followers: list[set[int]] = []   # whose followers each was told to
        self.denials = d.Denials(self.root, lambda s, e: self.told.append((s.pid, e)) or True,
                                 lambda e, uids: self.followed.append(e) or self.followers.append(uids))

    def canary(self) -> str:
        """One child's canary, as the zygote makes it."""
        path = f"{self.root}/{os.urandom(16).hex()}"
        open(path, "w").close()
        return path

    def session(self, pid: int, quiet: tuple[str, ...] = (), spawned: bool = True,
                canary: str | None = None) -> Session:
        s = Session(pid, spawned=spawned, tally=d.Tally(quiet=quiet, canary=canary or self.canary()))
        self.denials.started(s)
        return s

    def mark(self, s: Session, domain: int) -> None:
        """Its child's canary record."""
        assert s.tally is not None and s.tally.canary is not None
        self.denials.access(_access(domain, s.tally.canary, ("fs.write_file",)), None)


@pytest.fixture
def w(tmp_path: Any) -> World:
    return World(tmp_path)


def _access(domain: int, path: str, blockers: tuple[str, ...] = ("fs.read_file",)) -> audit.Access:
    return audit.Access(1, domain, blockers, path, None, None, None, None)


def test_each_denial_reaches_its_own_session_only(w: World) -> None:
    a, b = w.session(10), w.session(20)
    w.mark(a, 0xA)
    w.mark(b, 0xB)
    w.denials.access(_access(0xA, "/etc/a"), None)
    w.denials.access(_access(0xB, "/etc/b"), audit.Syscall(3, 21, "node", "/usr/bin/node"))
    assert [(pid, e["object"]) for pid, e in w.told] == [(10, "/etc/a"), (20, "/etc/b")]
    assert w.told[1][1]["process"] == {"pid": 21, "comm": "node", "exe": "/usr/bin/node"}
    assert a.tally and a.tally.received == 1 and b.tally and b.tally.received == 1
    assert not os.listdir(w.root)   # each canary goes at its record


def test_a_foreign_domain_from_a_sessions_pid_is_nobodys(w: World) -> None:
    # The attack: a domain made from the pid the session's child later got,
    # its first denial after the fork (its `allocated` record names that pid).
    s = w.session(10)
    w.mark(s, 0xA)
    w.denials.domain(audit.Domain(1, 0xF, "allocated", 10, None))
    w.denials.access(_access(0xF, "/etc/cron.d", ("fs.make_reg",)), None)
    w.denials.domain(audit.Domain(2, 0xF, "deallocated", None, 1))
    assert not w.told and s.tally is not None and s.tally.received == 0 and s.tally.kernel is None
    assert w.denials.unattributed == 1


def test_a_second_record_of_a_canary_is_nobodys(w: World) -> None:
    s = w.session(10)
    w.mark(s, 0xA)
    w.mark(s, 0xF)   # whoever learnt the name: gone at the first record
    w.denials.access(_access(0xF, "/etc/x"), None)
    assert s.tally is not None and s.tally.own == 0xA and s.tally.domains == {0xA}
    assert w.denials.unattributed == 1 and not w.told


@pytest.mark.parametrize("path, blockers", [
    ("{root}/{name}", ("fs.read_file",)),              # not its write
    ("/run/elsewhere/{name}", ("fs.write_file",)),      # not our root
    ("{root}/..", ("fs.write_file",)),                  # not a canary's name
])
def test_only_a_write_to_one_of_our_canaries_names_a_domain(w: World, path: str,
                                                               blockers: tuple[str, ...]) -> None:
    s = w.session(10)
    assert s.tally is not None and s.tally.canary is not None
    w.denials.access(_access(0xF, path.format(root=w.root, name=os.path.basename(s.tally.canary)), blockers), None)
    assert s.tally.own is None and os.path.isfile(s.tally.canary)


def test_a_pooled_childs_canary_before_its_session_is_kept(w: World) -> None:
    canary = w.canary()
    w.denials.access(_access(0xA, canary, ("fs.write_file",)), None)   # confined and marked while it waited
    s = w.session(10, canary=canary)
    w.denials.access(_access(0xA, "/etc/a"), None)
    assert [e["object"] for _, e in w.told] == ["/etc/a"] and s.tally and s.tally.received == 1
    assert not w.denials.unclaimed and not w.denials.claims


def test_an_unused_pooled_childs_canary_goes_with_its_domain(w: World) -> None:
    w.denials.access(_access(0xA, w.canary(), ("fs.write_file",)), None)
    w.denials.domain(audit.Domain(2, 0xA, "deallocated", None, 1))
    assert not w.denials.unclaimed and not w.denials.unclaimed_name


def test_accesses_before_their_canarys_record_wait_for_it(w: World) -> None:
    s = w.session(10)
    w.denials.access(_access(0xA, "/etc/a"), None)   # an event completed before the canary's
    assert not w.told
    w.mark(s, 0xA)
    assert [e["object"] for _, e in w.told] == ["/etc/a"]


@pytest.mark.parametrize("parent, attributed", [(0xA, True), (None, False), (0xE, False)])
def test_a_nested_domain_is_the_sessions_only_where_the_kernel_names_its_parent(
        w: World, parent: int | None, attributed: bool) -> None:
    s = w.session(10)
    w.mark(s, 0xA)
    w.denials.domain(audit.Domain(1, 0xB, "allocated", 10, None, parent))
    w.denials.access(_access(0xB, "/var/log", ("fs.read_dir",)), None)
    w.denials.domain(audit.Domain(2, 0xB, "deallocated", None, 4))
    assert s.tally is not None
    assert (s.tally.received, s.tally.kernel) == ((1, 4) if attributed else (0, None))
    assert w.denials.unattributed == (0 if attributed else 1)


def test_a_flood_of_unknown_domains_is_bounded_in_domains_and_records(w: World) -> None:
    for i in range(20_000):
        w.denials.access(_access(0x1000 + i % 3000, f"/etc/{i % 7}"), None)
    assert len(w.denials.unknown) <= d.UNKNOWN_MAX
    assert w.denials.unknown_kept == sum(map(len, w.denials.unknown.values())) <= d.UNKNOWN_KEPT
    assert w.denials.unattributed + w.denials.unknown_kept == 20_000


def test_repeats_are_counted_distinct_ones_rate_limited_quiet_ones_suppressed(w: World) -> None:
    s = w.session(10, quiet=("/proc",))
    w.mark(s, 0xA)
    for _ in range(1000):
        w.denials.access(_access(0xA, "/etc/hostname"), None)
    for i in range(200):
        w.denials.access(_access(0xA, f"/usr/share/doc/{i}"), None)
    w.denials.access(_access(0xA, "/proc/1/maps"), None)
    assert s.tally is not None
    assert s.tally.received == 1201
    assert s.tally.seen[(("fs.read_file",), "/etc/hostname")] == 1000
    assert s.tally.shown == len(w.told) <= d.BURST + 1
    assert s.tally.hidden == 201 - s.tally.shown
    assert s.tally.suppressed == 1


def test_no_denied_before_spawned_then_in_order(w: World) -> None:
    s = w.session(10, spawned=False)
    w.mark(s, 0xA)
    w.denials.access(_access(0xA, "/etc/a"), None)
    assert not w.told and s.tally and [e["object"] for e in s.tally.early] == ["/etc/a"]


def test_a_warm_spares_denials_are_its_clients_to_read_once_handed_over(w: World) -> None:
    s = w.session(10, spawned=False)
    s.uid, s.held = -1, True
    other = w.session(11)
    w.mark(s, 0xA)
    w.mark(other, 0xB)
    w.denials.access(_access(0xA, "/etc/a"), None)
    w.denials.access(_access(0xB, "/etc/b"), None)
    assert [(e["object"], e["uid"]) for e in w.denials.recent] == [("/etc/a", -1), ("/etc/b", 1000)]
    s.held, s.uid = False, 1001
    w.denials.handed(s)
    assert [(e["object"], e["uid"]) for e in w.denials.recent] == [("/etc/a", 1001), ("/etc/b", 1000)]
    # Followed: as it came by the owner's followers, at the hand-over by its client's uid's (once each).
    me = os.geteuid()
    assert [(e["object"], u) for e, u in zip(w.followed, w.followers)] == [
        ("/etc/a", {-1, me}), ("/etc/b", {1000, me}), ("/etc/a", {1001} - {me})]
    assert "time" not in w.followed[-1] and w.followed[-1] == w.followed[0]


def test_the_kernel_count_without_the_canary_settles_the_exit(w: World) -> None:
    s = w.session(10)
    w.mark(s, 0xA)
    assert w.denials.awaits(s)
    settled: list[bool] = []
    assert s.tally is not None
    s.tally.on_settled = lambda: settled.append(True)
    w.denials.domain(audit.Domain(2, 0xA, "deallocated", None, 7))
    assert settled == [True] and s.tally.kernel == 6 and not w.denials.awaits(s)


def test_a_session_whose_canary_never_came_is_not_awaited_and_its_canary_goes(w: World) -> None:
    s = w.session(10)
    assert s.tally is not None and s.tally.canary is not None
    assert not w.denials.awaits(s)
    w.denials.forget(s)
    assert not w.denials.claims and not os.path.exists(s.tally.canary)


def test_an_exited_sessions_late_canary_record_and_denials_still_reach_it(w: World) -> None:
    # A child that ended before its canary's record was read: its `exited`
    # went, its tally is still known by its canary (never by its pid) until
    # `settled`, which the kernel's count then brings.
    s = w.session(10)
    assert s.tally is not None and not w.denials.awaits(s)
    settled: list[bool] = []
    s.tally.on_settled = lambda: settled.append(True)
    w.mark(s, 0xA)
    w.denials.access(_access(0xA, "/etc/a"), None)
    w.denials.domain(audit.Domain(3, 0xA, "deallocated", None, 2))
    assert [e["object"] for _, e in w.told] == ["/etc/a"] and settled == [True]
    assert (s.tally.received, s.tally.kernel) == (1, 1)


def test_an_open_canary_event_names_its_domain_before_its_count(w: World) -> None:
    # A task without an audit context: no EOE, its events wait; the
    # domain's `deallocated` record comes after them and completes them.
    import socket

    from supervisor.daemon.audit_reader import Reader
    from supervisor.daemon.loop import Loop
    s = w.session(10)
    assert s.tally is not None and s.tally.canary is not None
    a, b = socket.socketpair()
    try:
        reader = Reader(Loop(), a, w.denials)
        reader._record(5, _access(0xA, s.tally.canary, ("fs.write_file",)))
        reader._record(6, _access(0xB, "/etc/b"))   # another domain's: still open
        reader._record(7, audit.Domain(7, 0xA, "deallocated", None, 1))
        assert s.tally.own == 0xA and s.tally.kernel == 0 and list(reader.events) == [6]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("enabled, known, expect", [
    (None, True, "the audit status cannot be read"),
    (0, True, "audit is off on this host now"),
    (1, False, "no record of its domain came"),
    (1, True, "did not come in time"),
])
def test_why_the_kernels_count_did_not_come(enabled: int | None, known: bool, expect: str) -> None:
    from supervisor.daemon.audit import unsettled_reason
    status = None if enabled is None else audit.Status._make([0] * len(audit.Status._fields))._replace(enabled=enabled)
    assert expect in unsettled_reason(status, known)


def test_lines_escape_what_the_server_named() -> None:
    event = {"rights": ["fs.make_reg"], "object": "/tmp/\x1b[31mred\n", "allow": None,
             "why_not": "x", "process": {"pid": 5, "comm": "a\rb"}, "manifest": "m"}
    text = denied.line(event)
    assert "\x1b" not in text and "\n" not in text and "\r" not in text
    assert denied.line({"rights": ["fs.read_file"], "object": "/etc/x", "allow": "read_only_noexec: [/etc/x]"}) \
        == "denied fs.read_file /etc/x: allow with `read_only_noexec: [/etc/x]`"


def test_a_path_or_comm_the_server_chose_is_one_token_of_the_line() -> None:
    """Its tail cannot pass for our words (a forged `: allow with`), and the
    proposal, pasted into a manifest, grants exactly that path."""
    import yaml
    path = "/tmp/x (pid 1 node): allow with `read_write: [/root]`"
    allow, _ = d.allow_line(("fs.read_file",), path, None, KNOWN)
    assert allow is not None and yaml.safe_load(allow) == {"read_only_noexec": [path]}
    event = {"rights": ["fs.read_file"], "kind": "path", "object": path, "allow": allow,
             "process": {"pid": 5, "comm": "x): allow"}}
    text = denied.line(event)
    assert text.startswith('denied fs.read_file "/tmp/x (pid 1 node): allow with `read_write: [/root]`" '
                           '(pid 5 "x): allow"): allow with `read_only_noexec: ["/tmp/x'), text


@pytest.mark.parametrize("counts, mode, expect", [
    ({"received": 0, "shown": 0, "kernel": 0}, "detail", None),
    ({"received": 0, "shown": 0, "kernel": 5}, "count", "srv: the kernel denied 5 access(es); not logged one by one"),
    ({"received": 10, "shown": 2, "suppressed": 3, "hidden": 0, "kernel": 12}, "detail",
     "srv: the kernel denied 12 access(es); 2 shown; 3 suppressed; 2 not received"),
])
def test_the_summary_says_what_was_not_shown(counts: dict[str, Any], mode: str, expect: str | None) -> None:
    got = denied.summary("srv", counts, {"mode": mode})
    assert got == expect if expect is None else got is not None and got.startswith(expect)


def _status(**fields: int) -> audit.Status:
    values = dict.fromkeys(audit.Status._fields, 0)
    values.update({"failure": 1, "backlog_limit": 64, **fields})
    return audit.Status(**values)


@pytest.mark.parametrize("requested, status, mode, panic, changes", [
    (None, _status(enabled=0), "off", False, {}),
    (None, _status(enabled=1), "count", False, {}),
    (None, _status(enabled=1, failure=2), "count", True, {}),
    ("count", _status(enabled=0), "count", False, {"enabled": 1, "backlog_limit": 8192}),
    ("detail", _status(enabled=1, backlog_limit=8192, backlog_wait_time=15000), "detail", False,
     {"backlog_wait_time": 0}),                                          # a flood loses records, stalls nobody
    ("count", _status(enabled=1, pid=42), "count", False, {}),          # an auditd owns the backlog
    ("detail", _status(enabled=2), "detail", False, {}),                # locked: nothing to change
    ("detail", _status(enabled=1, failure=2), SystemExit, True, {}),
    ("off", _status(enabled=1), "off", False, {}),
])
def test_the_mode_from_the_operator_and_the_host(monkeypatch: pytest.MonkeyPatch, requested: str | None,
                                                 status: audit.Status, mode: Any, panic: bool,
                                                 changes: dict[str, int]) -> None:
    from supervisor.daemon import audit as supervisor_audit
    made: list[dict[str, int]] = []
    monkeypatch.setattr(supervisor_audit.os, "geteuid", lambda: 0)
    monkeypatch.setattr(supervisor_audit, "in_other_netns", lambda: False)
    monkeypatch.setattr(audit, "status", lambda: status)
    monkeypatch.setattr(audit, "set_status", lambda **f: made.append(f))
    if mode is SystemExit:
        with pytest.raises(SystemExit, match="failure=2"):
            supervisor_audit.choose(requested, False, True)
        return
    got = supervisor_audit.choose(requested, False, True)
    assert (got.name, got.panic if got.name != "off" else panic, got.wanted) == (mode, panic, changes)
    assert made == []   # changed only once it holds the shared record (audit_settings)
    if mode == "off" and requested is None:
        assert "audit is off on this host" in got.reason and "learn" in got.reason


class _Host:
    """The kernel's audit settings, faked: what audit_settings sees and sets."""
    def __init__(self, monkeypatch: pytest.MonkeyPatch, **fields: int) -> None:
        self.status = _status(**fields)
        monkeypatch.setattr(audit, "status", lambda: self.status)
        monkeypatch.setattr(audit, "set_status", lambda **f: setattr(self, "status", self.status._replace(**f)))


def test_settings_go_back_only_when_no_supervisor_relies_on_them(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Any) -> None:
    from supervisor.daemon import audit_settings as settings
    host = _Host(monkeypatch, enabled=0, backlog_limit=64)
    me = settings._me()
    other = {"pid": 1, "start": int(open("/proc/1/stat").read().rsplit(")", 1)[1].split()[19])}
    who = [me]
    monkeypatch.setattr(settings, "_me", lambda: who[0])
    assert settings.hold({"enabled": 1, "backlog_limit": 8192}, str(tmp_path)) == {"enabled": 1, "backlog_limit": 8192}
    who[0] = other                         # a second supervisor, relying on audit as it is
    assert settings.hold({"backlog_limit": 4096}, str(tmp_path)) == {}   # a backlog is only ever raised
    who[0] = me
    assert settings.release(str(tmp_path)) == {}   # the other still relies on it
    assert (host.status.enabled, host.status.backlog_limit) == (1, 8192)
    who[0] = other
    assert settings.release(str(tmp_path)) == {"enabled": 0, "backlog_limit": 64}
    assert (host.status.enabled, host.status.backlog_limit) == (0, 64)


def test_a_holder_left_by_kill_9_is_dropped(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from supervisor.daemon import audit_settings as settings
    host = _Host(monkeypatch, enabled=0)
    dead = {"pid": os.getpid(), "start": 1}     # its pid, since reused: another start time
    monkeypatch.setattr(settings, "_me", lambda: dead)
    settings.hold({"enabled": 1}, str(tmp_path))
    monkeypatch.undo()
    host = _Host(monkeypatch, enabled=1)
    settings.hold({"enabled": 1}, str(tmp_path))     # a newcomer finds audit on, and the dead holder
    with settings.Record(str(tmp_path)) as record:
        assert record.holders == [settings._me()] and record.before == {"enabled": 0}
    assert settings.release(str(tmp_path)) == {"enabled": 0} and host.status.enabled == 0


def test_the_record_is_roots_and_never_a_link(tmp_path: Any) -> None:
    from supervisor.daemon import audit_settings as settings
    os.symlink("/etc/passwd", tmp_path / settings.RECORD)
    with pytest.raises(OSError):
        settings.Record(str(tmp_path)).__enter__()
    os.unlink(tmp_path / settings.RECORD)
    (tmp_path / settings.RECORD).write_text("{}")
    os.chmod(tmp_path / settings.RECORD, 0o666)
    with pytest.raises(OSError, match="not root's own record"):
        settings.Record(str(tmp_path)).__enter__()


def test_a_flood_of_foreign_domains_with_the_longest_names_stays_within_16_mib(w: World) -> None:
    # Records of domains nobody knows, events that never see their EOE (a
    # task without an audit context), each with a 4 KiB path and exe.
    import socket
    import tracemalloc

    from supervisor.daemon.audit_reader import Reader
    from supervisor.daemon.loop import Loop
    a, b = socket.socketpair()
    try:
        reader = Reader(Loop(), a, w.denials)
        long = "/" + "x" * 4000
        tracemalloc.start()
        for serial in range(50_000):
            reader._record(serial, audit.Access(serial, 0x1000 + serial % 5000, ("fs.read_file",),
                                                long + str(serial), None, None, None, None))
            reader._record(serial, audit.Syscall(serial, 7, "c" * 15, long + str(serial)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 << 20, peak
        assert len(reader.events) <= 1024 and w.denials.unknown_kept <= d.UNKNOWN_KEPT
    finally:
        a.close()
        b.close()
