"""The escape catalogue, continued: attacks on the running server (issue 11,
findings 2, 5, 7 and 8) and the limits they leave.

prlimit(2) has no Landlock hook: the kernel lets a caller change another
process's limits when its uid and gid match the target's (or it has
CAP_SYS_RESOURCE). A root supervisor gives every child a gid of its own
(`serve --session-gids`), so no child matches the supervisor, the zygote,
any root process or another session. Each case id here is a row of
docs/security.md (the Escape catalogue, or Limits for check_limit).
"""
from __future__ import annotations

import fcntl
import json
import os
import pty
import resource
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from sechelpers import (BOMB_UID, CHILD_UID, PROBE, PYTHON3, REPO, SUPERVISOR_UID, Outcome, Supervisor, attack, case,
                        check_limit, through_a_terminal)
from supervisor.daemon import leases, procfs
from supervisor.manifests import ids
from supervisor.client import SupervisorError
from svhelpers import processes_with_tag, read_all, run, spawn_bg, wait_until

pytestmark = pytest.mark.enforcement
RLIMITS = tuple(range(16))


def _limits(pid: int) -> tuple:
    return tuple(resource.prlimit(pid, res) for res in RLIMITS)


def _nofile(pid: int) -> tuple[int, int] | None:
    """From /proc (root here may lack CAP_SYS_RESOURCE, which prlimit(2) of another gid needs)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    except OSError:
        return None
    return None


class Running:
    """An attacker started, not yet waited for (attack() waits)."""

    def __init__(self, client: Any, manifest: str, ops: list[list[Any]], stdin: int | None = None) -> None:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        try:
            self.child = client.spawn(manifest, [json.dumps(ops)], stdin=null if stdin is None else stdin,
                                      stdout=out_w, stderr=err_w)
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        self.pid = self.child.pid

    def finish(self, timeout: float = 20) -> Outcome:
        with self.child:
            out, err = read_all(self.out_r, self.err_r, timeout=timeout)
            self.child.wait(timeout)
        results = [json.loads(line) for line in out.decode().splitlines()]
        return Outcome(results, self.child.exited, err.decode(errors="replace"))


def _tell(path: Path, pid: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid}.")
    os.chmod(tmp, 0o644)
    tmp.rename(path)


@pytest.fixture(scope="module")
def rt(module_lab):
    """Its own supervisor (root, session gids on by default) with probe
    manifests: `sib` (uid 64100, no group: a gid per session), `rootsib`
    (allow_root), `dynsib` (`user: dynamic`: a uid of its own, no group
    either), `sibg` (uid 64100 naming group 64100: one gid for all its
    sessions), `tty` (allow_root, terminal: true); each with a pool."""
    base = module_lab.dir / "rt"
    mdir, share = base / "manifests", base / "share"
    share.mkdir(parents=True)
    os.chmod(share, 0o777)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    sandbox = {"profiles": ["system"], "read_only_noexec": [str(share), "/proc"]}
    common = dict(command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True, sandbox=sandbox,
                  directory=mdir, pool=1)
    module_lab.manifest("sib", user=CHILD_UID, **common)
    module_lab.manifest("rootsib", allow_root=True, **common)
    module_lab.manifest("sibg", user=CHILD_UID, group=CHILD_UID, **common)
    module_lab.manifest("dynsib", user="dynamic", **common)
    module_lab.manifest("tty", allow_root=True, terminal=True, **{**common, "pool": 0})
    sv = module_lab.supervisor(manifests=[mdir], socket_path=base / "run" / "socket",
                               state_root=base / "state").start()
    sv.share = share
    yield sv


# ---- prlimit ------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
@case("prlimit-supervisor")
def test_prlimit_supervisor_and_zygote(fresh, ident):
    """Attempt: lower the supervisor's and the zygote's NOFILE to 3 and
    their CPU limit to 1 s with prlimit(2) (it would accept nobody, or die
    with every server). Stopped by: the child's ids: a dedicated uid is not
    root's; an allow_root child is uid 0 with a session gid of its own and
    no CAP_SYS_RESOURCE: EPERM. Their limits stay as they were."""
    sv = fresh.sv
    zygote = sv.client.stats()["zygote"]
    assert zygote
    before = {pid: _limits(pid) for pid in (sv.pid, zygote)}
    o = fresh.attack(ident, [["prlimit", sv.pid, "NOFILE", 3, 3], ["prlimit", sv.pid, "CPU", 1, 1],
                             ["prlimit", zygote, "NOFILE", 3, 3], ["prlimit", zygote, "CPU", 1, 1],
                             ["prlimit", 1, "NOFILE", 3, 3], ["ids"]])
    assert [o.errname(i) for i in range(5)] == ["EPERM"] * 5, o
    gid = int(o[5]["value"]["Gid"][0])
    assert gid != 0, o
    assert {pid: _limits(pid) for pid in (sv.pid, zygote)} == before
    assert sv.client.ping()["pid"] == sv.pid


@pytest.mark.timeout(40)
@pytest.mark.parametrize("manifest", ["sib", "rootsib", "dynsib"], ids=["uid", "root", "dynamic"])
@case("prlimit-sibling")
def test_prlimit_sibling_sessions(rt, manifest):
    """Attempt: two sessions of one manifest (one uid) lower each other's
    limits, and those of every other child of the supervisor (the pooled
    sibling waiting for the next client, the zygote, helpers). Stopped by:
    each session has a gid of its own: EPERM each way and for all; the
    next client's spawn of that manifest works with the limits it should."""
    pa, pb = rt.share / f"a-{manifest}", rt.share / f"b-{manifest}"
    ops = lambda path: [["prlimit_from", str(path), "NOFILE", 3, 3],  # noqa: E731
                        ["prlimit_siblings", rt.pid, "NOFILE", 3, 3], ["sleep", 1]]
    a = Running(rt.client, manifest, ops(pa))
    b = Running(rt.client, manifest, ops(pb))
    assert wait_until(lambda: rt.client.stats()["pooled"].get(manifest), 5)
    _tell(pa, b.pid)
    _tell(pb, a.pid)
    oa, ob = a.finish(), b.finish()
    for o, other in ((oa, b.pid), (ob, a.pid)):
        assert o.errname(0) == "EPERM", o
        hits = o[1]["value"]
        assert str(other) in hits and set(hits.values()) == {"EPERM"}, o
        assert len(hits) >= 3, o   # the other session, a pooled child, the zygote at least
    o = attack(rt.client, manifest, [["rlimits"]])
    assert o[0]["ok"] and o[0]["value"]["NOFILE"] != [3, 3], o


@pytest.mark.timeout(40)
def test_prlimit_named_group_sessions(rt):
    """A manifest that names its `group:` keeps it: its sessions share uid
    and gid, so they can prlimit each other and their pooled siblings. A
    pooled child tampered with while it waited is found out at hand-over
    (it compares its limits) and discarded: the next client's spawn is
    served by a fresh child, never failed."""
    first = attack(rt.client, "sibg", [["ids"]])           # the pool starts with the first spawn
    assert first[0]["ok"], first
    assert wait_until(lambda: rt.client.stats()["pooled"].get("sibg"), 5)
    o = attack(rt.client, "sibg", [["prlimit_siblings", rt.pid, "NOFILE", 5, 5]])
    hits = o[0]["value"]
    check_limit("prlimit-named-group", "ok" in hits.values())
    tampered = [int(pid) for pid, r in hits.items() if r == "ok"]
    assert tampered and all(_nofile(p) in ((5, 5), None) for p in tampered), o
    after = attack(rt.client, "sibg", [["rlimits"]])
    assert after[0]["ok"] and after[0]["value"]["NOFILE"] != [5, 5], after
    assert "had its resource limits changed while it waited" in rt.log()


# One session gid for the whole supervisor: each session gets the gid the last one had.
REUSED_GID = ids.DEFAULT_SESSION_GIDS[1]


@pytest.fixture(scope="module")
def reuse(module_lab):
    """A root supervisor with a single session gid (`--session-gids G-G`),
    so that every session gets the gid the one before it had; writers `a-*`
    (uid 64100, allow_root, `user: dynamic`) whose manifest asks for umask
    007 and may write the shared directory, and a reader `b` (another
    manifest, uid 64101, no group: a session gid too) that may read it."""
    base = module_lab.dir / "reuse"
    mdir, share, files = base / "manifests", base / "share", base / "files"
    for d in (share, files):
        d.mkdir(parents=True)
        os.chmod(d, 0o777)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    common = dict(command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True,
                  directory=mdir, pool=0)
    writes = {"profiles": ["system"], "read_only_noexec": [str(share), "/proc"], "read_write_noexec": [str(files)]}
    for name, who in (("a-uid", {"user": CHILD_UID}), ("a-root", {"allow_root": True}),
                      ("a-dynamic", {"user": "dynamic"})):
        module_lab.manifest(name, umask="007", sandbox=writes, **who, **common)
    module_lab.manifest("b", user=BOMB_UID, sandbox={**writes, "read_write_noexec": [],
                                                     "read_only_noexec": [str(share), str(files), "/proc"]},
                        **common)
    sv = module_lab.supervisor(manifests=[mdir], socket_path=base / "run" / "socket", state_root=base / "state",
                               extra=["--session-gids", f"{REUSED_GID}-{REUSED_GID}"]).start()
    sv.files = files
    yield sv


def _attack_when_a_gid_is_free(client: Any, manifest: str, ops: list[list[Any]]) -> Outcome:
    """The last session's gid comes back when it is reaped, a moment after its `exited`."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return attack(client, manifest, ops)
        except SupervisorError as e:
            if e.code != "too_many_children" or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("writer", ["a-uid", "a-root", "a-dynamic"], ids=["uid", "root", "dynamic"])
@case("session-gid-reuse")
def test_session_gid_reused_by_another_manifest(reuse, writer):
    """Attempt: read a file another session left behind, through the group
    its session gid had: session gids are reused, and the writer's manifest
    asks for umask 007 (its files group-readable). Stopped by: a child with
    a session gid has the group bits of its umask masked, whatever the
    manifest says: the file is not open to its group, and the later session
    of another manifest that gets the same gid reads EACCES."""
    path = reuse.files / f"secret-{writer}"
    a = _attack_when_a_gid_is_free(reuse.client, writer, [["ids"], ["write_file", str(path), "secret", "666"]])
    assert a[1]["ok"], a
    b = _attack_when_a_gid_is_free(reuse.client, "b", [["ids"], ["read", str(path)]])
    a_ids, b_ids = a[0]["value"], b[0]["value"]
    assert a_ids["Gid"][0] == b_ids["Gid"][0] == str(REUSED_GID), (a, b)   # the premise: one gid, reused
    assert a_ids["Uid"][0] != b_ids["Uid"][0], (a, b)
    assert b.errname(1) == "EACCES", b
    st = path.stat()
    assert st.st_gid == REUSED_GID and st.st_mode & 0o077 == 0, oct(st.st_mode)


# Two blocks of session gids above the default range (daemon/leases.py), leased by no other supervisor of the suite.
LEASED = ids.DEFAULT_SESSION_GIDS[1] + 1, ids.DEFAULT_SESSION_GIDS[1] + 2 * leases.BLOCK


@pytest.mark.timeout(60)
@case("session-gids-two-supervisors")
def test_two_root_supervisors_on_one_gid_range_never_share_a_gid(lab):
    """Attempt: a session under each of two root supervisors on one host
    and one `--session-gids` range, one uid for both, prlimits the other.
    Stopped by: each supervisor hands out only the block of the range it
    leases: the two sessions' gids differ, and prlimit is EPERM each way.
    A third supervisor on the range finds no free block and does not
    start; once the first has stopped, its block is free again."""
    share = lab.dir / "share"
    share.mkdir()
    os.chmod(share, 0o777)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    gids = f"{LEASED[0]}-{LEASED[1]}"

    def supervisor(side: str) -> Supervisor:
        mdir = lab.dir / side / "manifests"
        lab.manifest("probe", command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True,
                     user=CHILD_UID, directory=mdir,
                     sandbox={"profiles": ["system"], "read_only_noexec": [str(share), "/proc"]})
        return lab.supervisor(manifests=[mdir], socket_path=lab.dir / side / "run" / "socket",
                              state_root=lab.dir / side / "state", extra=["--session-gids", gids])

    one, two = supervisor("one").start(), supervisor("two").start()
    a = Running(one.client, "probe", [["ids"], ["prlimit_from", str(share / "b"), "NOFILE", 64, 64], ["sleep", 1]])
    b = Running(two.client, "probe", [["ids"], ["prlimit_from", str(share / "a"), "NOFILE", 64, 64], ["sleep", 1]])
    _tell(share / "a", a.pid)
    _tell(share / "b", b.pid)
    oa, ob = a.finish(), b.finish()
    gid_a, gid_b = int(oa[0]["value"]["Gid"][0]), int(ob[0]["value"]["Gid"][0])
    assert (gid_a, gid_b) == (LEASED[0], LEASED[0] + leases.BLOCK), (oa, ob)   # a block each, the lowest free
    assert oa[0]["value"]["Uid"] == ob[0]["value"]["Uid"], (oa, ob)           # the premise: one uid
    assert oa.errname(1) == ob.errname(1) == "EPERM", (oa, ob)
    for sv, gid in ((one, gid_a), (two, gid_b)):
        assert f"session gids {gid}-{gid + leases.BLOCK - 1}, leased of --session-gids {gids}" in sv.log()

    third = supervisor("three")
    refused = subprocess.run(third.argv, cwd=REPO, env=third.env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=20)
    assert refused.returncode == 2 and f"--session-gids {gids}: none of its 2 run(s)" in refused.stderr, refused
    assert not third.socket_path.exists()
    one.stop()
    third.start()
    o = attack(third.client, "probe", [["ids"]])
    assert int(o[0]["value"]["Gid"][0]) == gid_a, o


@pytest.mark.timeout(60)
@case("session-gid-held-by-leftover")
def test_a_session_gid_a_leftover_still_has_is_not_handed_out_again(lab):
    """Attempt: a session leaves a process behind that left its session
    (setsid: the session's end misses it), with the session's uid and gid;
    once later sessions have come round the range to that gid, it prlimits
    the session that got it. Stopped by: each round of the range begins
    with a look at every process's gids, and a gid a process still has is
    passed over: the later session gets another gid, prlimit is EPERM. Once
    the leftover is gone, the gid is handed out again."""
    share, files = lab.dir / "share", lab.dir / "files"
    for d in (share, files):
        d.mkdir()
        os.chmod(d, 0o777)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    lab.manifest("probe", command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True,
                 user=CHILD_UID, pool=0, sandbox={"profiles": ["system"], "read_only_noexec": [str(share), "/proc"],
                                                  "read_write_noexec": [str(files)]})
    first = LEASED[0]
    sv = lab.start(extra=["--session-gids", f"{first}-{first + 1}"])
    told, out = share / "target", files / "outcome"
    a = attack(sv.client, "probe", [["ids"], ["leave_session_prlimit_from", str(told), "NOFILE", 64, 64, str(out)]])
    leftover = a[1]["value"]
    try:
        assert int(a[0]["value"]["Gid"][0]) == first, a
        assert procfs.alive(leftover) and first in procfs.gids_of(leftover)   # the premise: it still has the gid, its session ended
        x = attack(sv.client, "probe", [["ids"]])
        assert int(x[0]["value"]["Gid"][0]) == first + 1, x   # the round comes back to `first` next
        b = Running(sv.client, "probe", [["ids"], ["sleep", 1]])
        _tell(told, b.pid)
        ob = b.finish()
        assert wait_until(out.exists, 10)
        assert int(ob[0]["value"]["Gid"][0]) == first + 1, ob   # passed over: the leftover has it
        assert ob[0]["value"]["Uid"] == a[0]["value"]["Uid"]      # the premise: one uid
        assert out.read_text() == "EPERM"
    finally:
        if procfs.alive(leftover):
            os.kill(leftover, signal.SIGKILL)
    assert wait_until(lambda: not procfs.gids_of(leftover), 5)   # reaped
    again = attack(sv.client, "probe", [["ids"]])
    assert int(again[0]["value"]["Gid"][0]) == first, again


@pytest.mark.timeout(30)
def test_a_block_a_live_process_has_a_gid_of_is_not_leased(lab):
    """What a supervisor that crashed left (a process with a session gid
    of its block) keeps that block from the next supervisor on the range,
    until it is gone: no lease is taken on a gid still in use."""
    lab.stock()
    gid = LEASED[0]
    holder = subprocess.Popen(["sleep", "60"], group=gid, env={"LLS_TEST_TAG": lab.tag})
    try:
        sv = lab.supervisor(extra=["--session-gids", f"{gid}-{gid}"])
        refused = subprocess.run(sv.argv, cwd=REPO, env=sv.env, stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=20)
        assert refused.returncode == 2 and "a process still has one of its gids" in refused.stderr, refused
    finally:
        holder.kill()
        holder.wait()
    sv.start()
    assert run(sv.client, "true").code == 0


@pytest.mark.timeout(40)
def test_same_uid_sessions_can_reschedule_each_other(rt):
    """Scheduling checks uids only: a session renices, pins and sets
    SCHED_IDLE on another session of its uid (not the supervisor's)."""
    path = rt.share / "sched-target"
    target = Running(rt.client, "sib", [["sleep", 2]])
    _tell(path, target.pid)
    o = attack(rt.client, "sib", [["sched_attack_from", str(path)]])
    target.finish()
    check_limit("sched-same-uid", o[0]["ok"] and o[0]["value"]["policy"] == os.SCHED_IDLE)


def _attacker_of_uid(lab: Any) -> Path:
    """The probe as manifest `attacker`, a session of CHILD_UID, and the
    directory it shares with the test (pids are told through it)."""
    share = lab.dir / "share"
    share.mkdir()
    os.chmod(share, 0o777)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    lab.manifest("attacker", command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True,
                 user=CHILD_UID, sandbox={"profiles": ["system"], "read_only_noexec": [str(share), "/proc"]})
    return share


@pytest.mark.timeout(60)
@case("warm-spare-tamper")
def test_a_warm_spare_tampered_by_its_uid_is_never_handed_out(lab):
    """Attempt: a session of uid 64100 reaches the warm spare of another
    manifest of that uid (a process started ahead for the next client):
    lowers its limits, stops it, renices, pins and idles it, or (the next
    spare) gives it a time slice of its own, so that the next client gets
    a crippled server. Stopped by: prlimit needs the spare's session gid
    (EPERM), the signal scope keeps SIGSTOP in the attacker's domain
    (EPERM); scheduling checks uids only (allowed, `sched-same-uid`), so
    the supervisor compares the spare's scheduling with the zygote's at
    hand-over: discarded, and the client gets a fresh server."""
    share = _attacker_of_uid(lab)
    lab.manifest("spare", command="/bin/cat", warm=1, user=CHILD_UID, sandbox={"profiles": ["system"]})
    sv = lab.start()
    assert wait_until(lambda: sv.client.stats()["warm"].get("spare"), 10), sv.log()
    [spare] = sv.client.stats()["warm"]["spare"]
    before = Path(f"/proc/{spare}/limits").read_text()
    _tell(share / "spare", spare)
    o = attack(sv.client, "attacker", [["prlimit", spare, "NOFILE", 3, 3], ["kill", spare, int(signal.SIGSTOP)],
                                       ["sched_attack_from", str(share / "spare")]])
    assert [o.errname(0), o.errname(1)] == ["EPERM", "EPERM"], o
    assert Path(f"/proc/{spare}/limits").read_text() == before
    assert o[2]["ok"] and o[2]["value"]["policy"] == os.SCHED_IDLE, o   # the premise: allowed
    child = sv.client.spawn("spare", stdio="pipes")
    assert child.pid != spare and not child.warm, (child.pid, spare)
    assert f"warm server {spare} discarded: its scheduling is" in sv.log()
    child.stdin.write(b"fresh\n")
    child.stdin.close()
    assert read_all(os.dup(child.stdout.fileno()))[0] == b"fresh\n"
    assert child.wait(10) == 0
    child.close()
    # The next spare: its time slice alone (sched_setattr, Linux 6.12), nothing a nice or policy shows.
    first = spare
    assert wait_until(lambda: sv.client.stats()["warm"].get("spare", [first]) not in ([], [first]), 10), sv.log()
    [spare] = sv.client.stats()["warm"]["spare"]
    _tell(share / "spare", spare)
    o = attack(sv.client, "attacker", [["slice_from", str(share / "spare"), 100_000_000]])
    assert o[0]["ok"] and o[0]["value"]["slice"] == 100_000_000, o   # the premise: allowed
    child = sv.client.spawn("spare", stdio="pipes")
    assert child.pid != spare and not child.warm, (child.pid, spare)
    assert f"warm server {spare} discarded: its scheduling is" in sv.log()
    child.kill()
    child.close()


@pytest.mark.timeout(60)
def test_a_warm_spares_child_rescheduled_by_its_uid_is_handed_out_so(lab):
    """Limit `warm-spare-threads`: a session of uid 64100 renices the
    process a warm spare started (as npx's server is npm's child); the
    hand-over compares the spare's own process only, so the client gets
    the spare with its child at nice 10."""
    share = _attacker_of_uid(lab)
    # sh forks cat (a command follows it): the spare's child reads the client's stdin.
    lab.manifest("launcher", command="/bin/sh", args=["-c", "cat; :"], warm=1, user=CHILD_UID,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"]})
    sv = lab.start()
    assert wait_until(lambda: sv.client.stats()["warm"].get("launcher"), 10), sv.log()
    [spare] = sv.client.stats()["warm"]["launcher"]
    assert wait_until(lambda: Path(f"/proc/{spare}/task/{spare}/children").read_text().split(), 10)
    [cat] = [int(pid) for pid in Path(f"/proc/{spare}/task/{spare}/children").read_text().split()]
    _tell(share / "child", cat)
    o = attack(sv.client, "attacker", [["sched_attack_from", str(share / "child")]])
    assert o[0]["ok"], o
    child = sv.client.spawn("launcher", stdio="pipes")
    try:
        check_limit("warm-spare-threads", child.warm and child.pid == spare
                    and os.sched_getscheduler(cat) == os.SCHED_IDLE and os.getpriority(os.PRIO_PROCESS, cat) == 10)
    finally:
        child.kill()
        child.close()


def _user_supervisor(lab: Any, uid: int) -> Supervisor:
    class AsUser(Supervisor):
        @property
        def argv(self) -> list[str]:
            return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *super().argv]
    base = lab.dir / "usersv"
    share = base / "share"
    share.mkdir(parents=True)
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    for d in (base, base / "state", base / "run"):
        d.mkdir(exist_ok=True)
        os.chown(d, uid, uid)
    lab.manifest("probe", command=PYTHON3, args=["-I", "-B", str(share / "probe.py")], client_args=True,
                 directory=base / "manifests", sandbox={"profiles": ["system"], "read_only_noexec": [str(share), "/proc"]})
    sv = AsUser(lab, manifests=[base / "manifests"], state_root=base / "state", socket_path=base / "run" / "socket",
                env={**os.environ, "LANDLOCK_SUPERVISOR_SOCKET": ""}, extra=["--allow-uid", "0"])
    lab.supervisors.append(sv)
    return sv.start()


@pytest.mark.timeout(40)
def test_user_supervisor_children_can_prlimit_the_user(lab):
    """Under a user's own supervisor every child has the user's uid and
    gid: it can change the limits of any process of that user (the MCP
    client included: RLIMIT_CPU ends it), the supervisor too, which puts
    back what it can (a soft limit up to its hard one) and logs it."""
    sv = _user_supervisor(lab, SUPERVISOR_UID)
    client = subprocess.Popen(["sleep", "60"], user=SUPERVISOR_UID, group=SUPERVISOR_UID, extra_groups=[],
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        nofile = _nofile(sv.pid)
        o = attack(sv.client, "probe", [["prlimit", client.pid, "NOFILE", 3, 3],
                                        ["prlimit", sv.pid, "NOFILE", 100, nofile[1]], ["sleep", 1.5]])
        check_limit("prlimit-user-supervisor", o[0]["ok"] and o[1]["ok"]
                    and _nofile(client.pid) == (3, 3))
        assert wait_until(lambda: _nofile(sv.pid) == nofile, 3), sv.log()
        assert "restored" in sv.log()
    finally:
        client.kill()
        client.wait()


# ---- the terminal -------------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_tiocsti_with_terminal_true(rt):
    """A manifest that says `terminal: true` takes a terminal as stdin: its
    child leads a session without one, adopts it (TIOCSCTTY) and pushes
    keystrokes into it (TIOCSTI), which the kernel allows while
    dev.tty.legacy_tiocsti is 1."""
    try:
        legacy = Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip()
    except OSError:
        legacy = "1"   # older kernels: TIOCSTI always works
    if legacy == "0":
        pytest.skip("machine setting: dev.tty.legacy_tiocsti is 0 (TIOCSTI needs CAP_SYS_ADMIN)")
    o, echoed = through_a_terminal(
        lambda slave: attack(rt.client, "tty", [["tiocsctty"], ["tiocsti", "id\n"]], stdin=slave))
    check_limit("tiocsti-terminal", o[0]["ok"] and o[1]["ok"] and b"id" in echoed)


@pytest.mark.timeout(30)
def test_ioctl_on_an_inherited_terminal(rt):
    """A terminal passed as stdin (to a manifest with `terminal: true`): its
    ioctls (window size, termios) change the client's terminal: Landlock's
    IOCTL_DEV is checked at open(), not on inherited fds."""
    master, slave = pty.openpty()
    try:
        o = attack(rt.client, "tty", [["tiocswinsz", 33, 111]], stdin=slave)
        rows, cols = struct.unpack("HHHH", fcntl.ioctl(master, termios.TIOCGWINSZ, b"\0" * 8))[:2]
    finally:
        os.close(master)
        os.close(slave)
    check_limit("ioctl-inherited", o[0]["ok"] and (rows, cols) == (33, 111))


# ---- scheduling ---------------------------------------------------------------------------------

@pytest.mark.timeout(40)
@case("realtime-inherit")
def test_no_realtime_children(lab):
    """Attempt: be born real-time (SCHED_FIFO), with a negative nice and the
    real-time I/O class, under a supervisor started so (chrt -f 10, nice
    -5, ionice -c1): a child could then starve the supervisor. Stopped by:
    the zygote sets SCHED_RESET_ON_FORK on itself and leaves the real-time
    I/O class: each child reads SCHED_OTHER, nice 0, a best-effort class."""
    class Realtime(Supervisor):
        @property
        def argv(self) -> list[str]:
            return ["chrt", "-f", "10", "nice", "-n", "-5", "ionice", "-c1", "-n0", *super().argv]
    share = lab.dir / "share"
    share.mkdir()
    shutil.copy(PROBE, share / "probe.py")
    os.chmod(share / "probe.py", 0o644)
    sandbox = {"profiles": ["system"], "read_only_noexec": [str(share)]}
    for name, extra in (("uid", {"user": CHILD_UID}), ("root", {"allow_root": True})):
        for pool in (0, 1):
            lab.manifest(f"{name}-{pool}", command=PYTHON3, args=["-I", "-B", str(share / "probe.py")],
                         client_args=True, sandbox=sandbox, pool=pool, **extra)
    sv = Realtime(lab, manifests=[lab.manifest_dir], state_root=lab.state_root, socket_path=lab.dir / "run" / "socket",
                  env={**os.environ, "LANDLOCK_SUPERVISOR_SOCKET": ""}, extra=[])
    lab.supervisors.append(sv)
    sv.start()
    assert os.sched_getscheduler(sv.pid) == os.SCHED_FIFO and os.getpriority(os.PRIO_PROCESS, sv.pid) == -5
    for name in ("uid-0", "uid-1", "root-0", "root-1"):
        for _ in range(2):   # a pool's first spawn is a fresh child, the second a pooled one
            o = attack(sv.client, name, [["scheduling"]])
            value = o[0]["value"]
            assert value["policy"] == os.SCHED_OTHER and value["nice"] >= 0 and value["ioprio_class"] != 1, (name, o)


# ---- connections --------------------------------------------------------------------------------

_HOARDER = r"""
import json, socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
held, codes = [], {}
for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(2)
    try:
        s.connect(path)
        try:
            s.send(json.dumps({"v": 1, "op": "ping"}).encode())
        except OSError:
            pass  # refused: the reason waits to be read
        try:
            data = s.recv(65536)
        except ConnectionResetError:  # closed with our ping unread: then the refusal reads
            data = s.recv(65536)
        reply = json.loads(data or b"{}")
    except OSError as e:
        codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
        s.close()
        continue
    code = reply.get("code", reply.get("event"))
    codes[code] = codes.get(code, 0) + 1
    if reply.get("event") == "pong":
        held.append(s)
    else:
        s.close()
print(json.dumps({"held": len(held), "codes": codes}), flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(60)
@case("connection-hoarding")
def test_connection_hoarding_at_the_fd_limit(lab):
    """Attempt: as another allowed uid, hold every connection the
    supervisor can take (its RLIMIT_NOFILE is 64 here), and spawn as many
    children as allowed, to lock the owner out or make a child run
    untracked. Stopped by: connections and fds kept for the owner
    (too_many_connections for others before the edge), per-uid caps; the
    owner still pings and spawns; the children never pass the limit and all
    end with their client; no internal error."""
    lab.stock()
    class Limited(Supervisor):
        @property
        def argv(self) -> list[str]:
            return ["prlimit", "--nofile=64:64", "--", *super().argv]
    sv = Limited(lab, manifests=[lab.manifest_dir], state_root=lab.state_root, socket_path=lab.dir / "run" / "socket",
                 env={**os.environ, "LANDLOCK_SUPERVISOR_SOCKET": ""},
                 extra=["--allow-uid", str(CHILD_UID), "--max-children", "12"])
    lab.supervisors.append(sv)
    sv.start()
    hoarder = subprocess.Popen([sys.executable, "-c", _HOARDER, str(sv.socket_path), "200"], user=CHILD_UID,
                               group=CHILD_UID, extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    kids = []
    try:
        line = json.loads(hoarder.stdout.readline())
        assert line["codes"].get("too_many_connections"), line
        assert line["held"] >= 10, line
        # The owner, with the hoard in place: ping and spawn; then children
        # until the fds or the children's limit say no.
        assert sv.client.ping()["pid"] == sv.pid
        assert run(sv.client, "true").code == 0
        refusals = []
        for _ in range(14):
            try:
                kids.append(spawn_bg(sv.client, "sleep", ["100"], timeout=3))
            except (SupervisorError, OSError, TimeoutError) as e:
                refusals.append(e)
        assert kids and len(kids) <= 12, refusals
        for e in refusals:   # a clear refusal, or a connection the supervisor could not take yet
            assert not isinstance(e, SupervisorError) or e.code in (
                "too_many_children", "spawn_failed", "too_many_connections"), e
        # Every child running is one the supervisor follows.
        assert len([p for p in processes_with_tag(lab.tag) if _comm(p) == "sleep"]) == len(kids)
    finally:
        hoarder.kill()
        hoarder.wait()
        for child, pipes in kids:
            child.close()
            pipes.close()
    assert wait_until(lambda: sv.client.stats()["children"] == 0, 10)
    assert wait_until(lambda: not processes_with_tag(lab.tag), 5), processes_with_tag(lab.tag)
    assert "internal error" not in sv.log()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
