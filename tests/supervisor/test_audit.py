"""Denials as they happen, from Landlock's audit records: the `audit` group.

These switch the host's audit on (it is host state: the `host_audit`
fixture puts every setting back in a finally), so they run after every
other test (tests/conftest.py orders them last). The kernel keeps audit
"ever enabled" until reboot: every process's system calls stay slower.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from landlock import audit
from supervisor.daemon import audit_settings
from supervisor.client import Client

sys.path.insert(0, os.path.dirname(__file__))
from svhelpers import PYTHON, REPO, accounted, counted, lost_any, reported_lost, run, spawn_bg, wait_until  # noqa: E402

# Not `enforcement`: what these need of the host is a machine setting, and
# their fixture says which one when a skip is all it can do.
pytestmark = [pytest.mark.audit, pytest.mark.timeout(120)]

FLOOD = "import os\nfor _ in range({n}):\n    try:\n        os.close(os.open('/etc/hostname', 0))\n" \
        "    except PermissionError:\n        pass\n"
# Enough to last while spawns are tried: where the supervisor set the queue's
# wait to 0, nothing slows the flooding child down (100,000 could end before
# the first spawn; 400,000 last ~5 s on the 2-vCPU VM, 1,000,000 took 14 s).
FLOODED = 400_000
DISTINCT = "import os\nfor p in {paths!r}:\n    try:\n        os.listdir(p)\n    except PermissionError:\n        pass\n"


def _python(lab: Any, **fields: Any) -> None:
    lab.manifest("py", command="/usr/bin/python3", args=["-I", "-S", "-c"], client_args=True, **fields)


def _collect(client: Client, name: str, args: list[str], timeout: float = 60) -> tuple[Any, list[dict[str, Any]]]:
    result = run(client, name, args, timeout=timeout)
    return result, list(result.child.denied)


def _all_received(child: Any, client: Client) -> None:
    """For a test that needs every record: skips where some did not come
    (lost under load and reported, or audit switched off under the test)."""
    counts = counted(child, client)
    if not accounted(counts, client):
        pytest.skip(f"records lost under load, and reported: {counts}")


def _run_lines(proc: Any, client: Client) -> list[str]:
    """`run`'s own lines about sh; skips where it says the kernel's count is
    missing: audit switched off under the test, or records lost (reported)."""
    lines = [l for l in proc.stderr.splitlines() if l.startswith("landlock-supervisor: sh: ")]
    missing = [l for l in lines if "the kernel's count of its denials is missing: " in l]
    if missing:
        off = "audit is off" in missing[0] or not lost_any(reported_lost(client))
        reason = "machine setting changed under the test" if off else "records lost under load, and reported"
        pytest.skip(f"{reason}: {missing[0]}")
    return lines


def test_detail_each_denial_reaches_its_client_with_the_line_that_allows_it(lab: Any, host_audit: Any) -> None:
    lab.stock()
    sv = lab.start(extra=["--audit", "detail"])
    result, denied = _collect(sv.client, "sh", ["cat /etc/hostname; cat /etc/hostname; exit 3"])
    assert result.code == 3
    assert result.child.denials == {"mode": "detail"}
    _all_received(result.child, sv.client)
    assert result.child.denial_counts["received"] >= 2
    reads = [e for e in denied if e["object"] == "/etc/hostname"]
    assert len(reads) == 1, denied   # the second read is counted, not told again
    event = reads[0]
    assert event["rights"] == ["fs.read_file"] and event["kind"] == "path"
    assert event["allow"] == "read_only_noexec: [/etc/hostname]"
    assert event["process"]["comm"] == "cat" and event["pid"] == result.child.pid
    sv.stop()
    now = audit.status().enabled
    if now != 1:   # the suite relies on it too (supervisor.daemon.audit_settings): left on, unless another program switched it
        pytest.skip(f"machine setting changed under the test: audit enabled={now}, {host_audit.enabled} before")


def test_count_mode_is_the_default_where_audit_is_on(lab: Any, host_audit: Any) -> None:
    audit_settings.hold({"enabled": 1})
    try:
        _count_mode(lab)
    finally:
        audit_settings.release()


def _count_mode(lab: Any) -> None:
    lab.stock()
    lab.manifest("pooled", command="/bin/sh", args=["-c"], client_args=True, pool=1,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"], "read_only_noexec": ["/proc"]})
    sv = lab.start()
    # The pool fills at its first spawn: the second is a pooled child, confined (and marked) before it waited.
    for i, name in enumerate(("sh", "pooled", "pooled")):
        if i == 2:
            assert wait_until(lambda: sv.client.stats()["pooled"].get("pooled") == 1, 10)
        result, denied = _collect(sv.client, name, ["cat /etc/hostname /etc/hostname; ls /var/log; true"])
        if result.child.denials["mode"] == "off" and "audit is off" in result.child.denials.get("reason", ""):
            pytest.skip(f"machine setting changed under the test: {result.child.denials['reason']}")
        assert result.child.denials == {"mode": "count"}
        assert denied == []   # nothing after exec is logged
        counts = counted(result.child, sv.client)
        if counts["kernel"] is None:   # its record lost under load: and that is said
            assert accounted(counts, sv.client) is False
            continue
        assert counts["kernel"] == 3, (name, counts)   # the canary not among them


def test_concurrent_sessions_each_get_their_own_denials_only(lab: Any, host_audit: Any) -> None:
    lab.stock()
    sv = lab.start(extra=["--audit", "detail"])
    files = []
    for i in range(4):
        (lab.dir / f"f{i}").write_text("not granted\n")
        files.append(str(lab.dir / f"f{i}"))
    results: dict[str, Any] = {}

    def one(path: str) -> None:
        results[path] = _collect(Client(str(sv.socket_path)), "sh", [f"sleep 0.3; cat {path}; sleep 0.3"])

    threads = [threading.Thread(target=one, args=(p,)) for p in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for path in files:
        result, denied = results[path]
        _all_received(result.child, sv.client)
        objects = {e["object"] for e in denied}
        assert path in objects, (path, denied)
        assert not objects & (set(files) - {path}), (path, objects)
        assert all(e["pid"] == result.child.pid for e in denied)


def test_a_flood_is_deduplicated_and_the_supervisor_stays_responsive(lab: Any, host_audit: Any) -> None:
    lab.stock()
    _python(lab)
    sv = lab.start(extra=["--audit", "detail"])
    child, pipes = spawn_bg(sv.client, "py", [FLOOD.format(n=FLOODED)])
    try:
        time.sleep(0.3)
        answered = []
        while child.poll() is None:
            started = time.monotonic()
            assert run(sv.client, "true", timeout=10).code == 0
            answered.append(time.monotonic() - started)
        if not answered:   # quick where its denials are not logged: audit switched off under the test?
            _all_received(child, sv.client)
        assert answered, "the flood ended before a spawn could be tried"
        assert max(answered) < 5, answered   # in time, not fast: a benchmark measures speed
        assert child.wait(60) == 0
        counts = counted(child, sv.client)
        hostname = [e for e in child.denied if e["object"] == "/etc/hostname"]
        assert len(hostname) == (1 if counts["received"] else 0)   # told once, if any record came
        assert set(sv.client.denials()["lost"]) == {"kernel", "reader_overflows", "unattributed"}
        # The kernel counts every one; what the reader did not get is said, not hidden.
        accounted(counts, sv.client)   # (its own record may be lost in the flood: and that is said)
        if counts["kernel"] is not None:
            assert FLOODED <= counts["kernel"] < FLOODED + 10, counts   # (and what python itself was denied)
    finally:
        pipes.close()


def test_distinct_denials_are_rate_limited_and_counted(lab: Any, host_audit: Any) -> None:
    lab.stock()
    _python(lab)
    sv = lab.start(extra=["--audit", "detail"])
    paths = ["/usr/share/doc/" + p for p in sorted(os.listdir("/usr/share/doc"))[:300]]
    n = len(paths)
    result, denied = _collect(sv.client, "py", [DISTINCT.format(paths=paths)])
    counts = counted(result.child, sv.client)
    if not accounted(counts, sv.client) and counts["received"] <= 2 * 50:
        pytest.skip(f"records lost under load, and reported: too few left to pass the rate limit: {counts}")
    assert counts["shown"] == len(denied) < n
    assert counts["hidden"] > 0   # over the rate: counted, and said in the summary
    assert counts["hidden"] + counts["shown"] + counts["suppressed"] <= counts["received"]   # the rest: repeats


def test_denials_command_lists_and_follows(lab: Any, host_audit: Any) -> None:
    lab.stock()
    sv = lab.start(extra=["--audit", "detail"])
    follow = subprocess.Popen([PYTHON, "-m", "supervisor", "denials", "--socket", str(sv.socket_path), "--follow",
                               "--json"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        _all_received(run(sv.client, "sh", ["cat /etc/hostname"]).child, sv.client)
        line = follow.stdout.readline()   # the reply first
        assert '"event": "denials"' in line
        line = follow.stdout.readline()
        assert '"/etc/hostname"' in line and '"denied"' in line
    finally:
        follow.terminate()
        follow.wait(10)
    out = subprocess.run([PYTHON, "-m", "supervisor", "denials", "--socket", str(sv.socket_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert "sh: denied fs.read_file /etc/hostname" in out.stdout


def test_run_keeps_each_denial_for_denials_session(lab: Any, host_audit: Any) -> None:
    lab.stock()
    sv = lab.start(extra=["--audit", "detail"])
    journal = lab.dir / "client-state"
    # cat's own complaint silenced: the server writes to the same stderr as
    # `run`, and two writers can interleave within a line.
    proc = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "--state-root",
                           str(journal), "sh", "cat /etc/hostname 2>/dev/null; cat /etc/hostname 2>/dev/null; exit 1"],
                          cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert proc.returncode == 1
    lines = _run_lines(proc, sv.client)
    assert lines and "--session " in lines[0], proc.stderr
    session = lines[0].split("--session ")[1].split()[0]
    pointer = f"`landlock-supervisor denials --session {session} --state-root {journal}`"
    assert lines == [f"landlock-supervisor: sh: access denied; what and how to allow it: {pointer}",
                     f"landlock-supervisor: sh: the kernel denied 2 access(es); 1 shown; read them with {pointer}"], \
        proc.stderr
    out = subprocess.run([PYTHON, "-m", "supervisor", "denials", "--session", session, "--state-root", str(journal)],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    shown = out.stdout.splitlines()
    assert shown[0] == ("pid " + shown[0].split()[1] + " sh: denied fs.read_file /etc/hostname (pid "
                        f"{shown[0].split('(pid ')[1].split()[0]} cat): allow with "
                        "`read_only_noexec: [/etc/hostname]`"), out.stdout
    assert shown[1:] == ["sh: the kernel denied 2 access(es); 1 shown"], out.stdout
    assert os.stat(journal / "denials").st_mode & 0o777 == 0o700
    assert os.stat(journal / "denials" / f"{session}.jsonl").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", ["detail", "count"])
def test_run_reports_a_denial_that_was_the_childs_last_act(lab: Any, host_audit: Any, mode: str) -> None:
    # `exited` goes out as soon as the child is reaped; the denial's record
    # (detail) or the kernel's count (count, from the `deallocated` record
    # ~50 ms later) comes after it, in `settled`: `run` waits for that.
    lab.stock()
    sv = lab.start(extra=["--audit", mode])
    journal = lab.dir / "client-state"
    proc = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "--state-root",
                           str(journal), "sh", "exec cat /etc/hostname 2>/dev/null"], cwd=REPO, capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert proc.returncode == 1
    lines = _run_lines(proc, sv.client)
    if not lines:   # count mode, its canary's and its domain's records lost: and that is said
        lost = reported_lost(sv.client)
        assert lost_any(lost), (proc.stderr, lost)
        pytest.skip(f"records lost under load, and reported: {lost}")
    assert lines[-1].startswith("landlock-supervisor: sh: the kernel denied 1 access(es)"), proc.stderr
    if mode == "count":
        return
    # The denial line is kept for `denials --session`; the count and the pointer are on stderr.
    assert lines[0].startswith("landlock-supervisor: sh: access denied; what and how to allow it: "), proc.stderr
    session = lines[0].split("--session ")[1].split()[0]
    out = subprocess.run([PYTHON, "-m", "supervisor", "denials", "--session", session, "--state-root", str(journal)],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert " sh: denied fs.read_file /etc/hostname (pid " in out.stdout.splitlines()[0], out.stdout


def test_exited_comes_before_the_kernels_count_and_settled_after(lab: Any, host_audit: Any) -> None:
    lab.stock()
    sv = lab.start(extra=["--audit", "count"])
    result = run(sv.client, "sh", ["cat /etc/hostname; exit 0"])
    early = result.child.exited["denials"]
    assert early["final"] is False and early["kernel"] is None, early   # not waited for
    settled = result.child.settled
    assert settled is not None and settled["pid"] == result.child.pid
    counted(result.child, sv.client)
    if settled["denials"]["kernel"] is None:   # lost under load, and reported
        pytest.skip(f"the kernel's count did not come: {settled['why']}")
    assert settled["denials"]["kernel"] == 1 and result.child.denial_counts == settled["denials"]


def test_a_client_that_never_reads_keeps_its_child_and_gets_its_exit(lab: Any, host_audit: Any) -> None:
    lab.stock()
    listing = lab.dir / "paths"
    listing.write_text("\n".join(f"/usr/share/doc/{p}" for p in sorted(os.listdir("/usr/share/doc"))))
    _python(lab, sandbox={"profiles": ["system"], "read_only_noexec": [str(listing)]})
    sv = lab.start(extra=["--audit", "detail"])
    script = (f"import os, time\npaths = open({str(listing)!r}).read().split()\n"
              "def deny(paths):\n    for p in paths:\n        try:\n            os.listdir(p)\n"
              "        except PermissionError:\n            pass\n"
              "deny(paths)\ntime.sleep(4)\ndeny(p + '/.' for p in paths)\n")
    child, pipes = spawn_bg(sv.client, "py", [script])
    try:
        # Nothing read for the whole run: what did not fit is counted as hidden.
        assert wait_until(lambda: not os.path.exists(f"/proc/{child.pid}"), 30)
        assert child.wait(30) == 0
        counts = counted(child, sv.client)
        assert counts["shown"] == len(child.denied)
        if not accounted(counts, sv.client) and counts["received"] <= 2 * 50:
            pytest.skip(f"records lost under load, and reported: too few left to pass the rate limit: {counts}")
        assert counts["hidden"] > 0
    finally:
        pipes.close()


def test_a_manifest_reading_everything_still_has_its_canary(lab: Any, host_audit: Any) -> None:
    # The canary is a write (fs.write_file) to a file of its own: a
    # manifest that may read everything is denied it all the same.
    lab.manifest("reads_all", command="/bin/sh", args=["-c"], client_args=True,
                 sandbox={"profiles": ["system"], "read_only": ["/"]})
    sv = lab.start(extra=["--audit", "detail"])
    target = lab.dir / "w"
    target.mkdir()
    result, denied = _collect(sv.client, "reads_all", [f"echo x > {target}/f; true"])
    _all_received(result.child, sv.client)
    assert [(e["rights"], e["object"]) for e in denied] == [(["fs.make_reg"], str(target))], denied
    assert denied[0]["allow"] == f"read_write_noexec: [{target}]"


_AS_OTHER = """
import json, os, sys
from supervisor.client import Client
client = Client(sys.argv[1])
null = os.open(os.devnull, os.O_RDWR)
child = client.spawn("sh", ["cat /etc/hostname; exit 0"], stdin=null, stdout=null, stderr=null)
child.wait(30)
counts = child.settle()
print(json.dumps({"denied": list(child.denied), "counts": counts, "settled": child.settled,
                  "recent": client.denials()["recent"]}))
"""


def test_another_uid_gets_its_own_denials_and_sees_no_one_elses(lab: Any, host_audit: Any) -> None:
    lab.stock()
    uid = 64151
    sv = lab.start(extra=["--audit", "detail", "--allow-uid", str(uid)])
    run(sv.client, "sh", ["cat /etc/hosts; true"])   # the owner's session, denied another file
    out = subprocess.run([PYTHON, "-c", _AS_OTHER, str(sv.socket_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=60, user=uid, group=uid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    if got["counts"]["received"] < (got["counts"]["kernel"] or 1):
        why = got["settled"].get("why") if got["settled"] else None
        reason = "records lost under load, and reported" if lost_any(reported_lost(sv.client)) else \
            "machine setting changed under the test"
        pytest.skip(f"{reason}: {got['counts']} ({why})")
    assert [e["object"] for e in got["denied"]] == ["/etc/hostname"]
    assert got["counts"]["received"] >= 1
    assert {e["object"] for e in got["recent"]} == {"/etc/hostname"}   # not the owner's /etc/hosts
    owner = {e["object"] for e in sv.client.denials()["recent"]}
    assert {"/etc/hostname", "/etc/hosts"} <= owner


_WARM_AS_OTHER = """
import json, signal, sys
from supervisor.client import Client
client = Client(sys.argv[1])
follow = client.follow_denials()
next(follow)   # the reply: followed from here
child = client.spawn("wdenied", stdio="pipes")
child.stdin.close()
child.wait(30)
signal.alarm(10)   # (a follower told nothing waits for ever)
followed = next(follow)
print(json.dumps({"warm": child.warm, "pid": child.pid, "denied": list(child.denied), "exited": child.exited,
                  "recent": client.denials()["recent"], "followed": followed}))
"""


def test_a_warm_servers_denials_before_its_hand_over_are_its_clients(lab: Any, host_audit: Any) -> None:
    """Denied while it waited (nobody's yet): told to the client that gets
    it, after `spawned`, counted in its `exited`, its uid's to read with
    `denials` from then on, and told to its uid's `denials --follow` at the
    hand-over (supervisor/daemon/warm.py). The client is another uid than
    the supervisor's owner, who sees everything anyway."""
    uid = 64151
    lab.manifest("wdenied", command="/bin/sh", args=["-c", "cat /etc/hostname 2>/dev/null; exec cat"], warm=1,
                 user=65534, sandbox={"profiles": ["system"], "read_only": ["/usr/bin"]})
    sv = lab.start(extra=["--audit", "detail", "--allow-uid", str(uid)])
    assert wait_until(lambda: sv.client.stats()["warm"].get("wdenied"), 10), sv.log()
    time.sleep(0.5)   # its denial's record read while it waits
    out = subprocess.run([PYTHON, "-c", _WARM_AS_OTHER, str(sv.socket_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, user=uid, group=uid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["warm"]
    reads = [e for e in got["denied"] if e["object"] == "/etc/hostname"]
    assert len(reads) == 1 and reads[0]["pid"] == got["pid"], got["denied"]
    assert got["exited"]["denials"]["received"] >= 1, got["exited"]
    assert [e["object"] for e in got["recent"] if e["pid"] == got["pid"]] == ["/etc/hostname"], got["recent"]
    assert (got["followed"]["object"], got["followed"]["pid"]) == ("/etc/hostname", got["pid"]), got["followed"]


# A `-a never,task` rule (Fedora's and RHEL's shipped rules have one): the
# tasks it matches get no audit context, so their Landlock records come
# without a SYSCALL record (no pid, no comm) and without an EOE. Here it
# matches only this test's supervisor's descendants, by a login uid of
# their own (the task filter sees the forking task's credentials): the
# other programs on the host keep theirs.
_LOGINUID = 64177
_AUDIT_ADD_RULE, _AUDIT_DEL_RULE = 1011, 1012
_NEVER_TASK = struct.pack("=3I64I64I64I64II", 1, 0, 1,            # AUDIT_FILTER_TASK, AUDIT_NEVER, one field
                          *[0xFFFFFFFF] * 64,                     # every syscall
                          9, *[0] * 63, _LOGINUID, *[0] * 63,     # AUDIT_LOGINUID == _LOGINUID
                          0x40000000, *[0] * 63, 0)               # AUDIT_EQUAL; no strings


@pytest.mark.parametrize("mode", ["detail", "count"])
def test_denials_without_syscall_records_still_reach_the_client_and_exits_come(lab: Any, host_audit: Any,
                                                                               mode: str) -> None:
    lab.stock()
    sv = lab.supervisor(extra=["--audit", mode])
    # The supervisor under a login uid of its own: what it forks matches the rule.
    sv.prefix = ["/bin/sh", "-c", f'echo {_LOGINUID} >/proc/self/loginuid && exec "$@"', "sh"]
    audit._request(_AUDIT_ADD_RULE, _NEVER_TASK)
    try:
        sv.start()
        results = [run(sv.client, "sh", ["cat /etc/hostname; exit 4"], timeout=30) for _ in range(3)]
    finally:
        audit._request(_AUDIT_DEL_RULE, _NEVER_TASK)
    for result in results:
        assert result.code == 4 and result.child.exited is not None
        assert result.child.settled is not None and result.child.settled["pid"] == result.child.pid
        assert result.child.denials == {"mode": mode}
        counts = counted(result.child, sv.client)
        if mode == "count":   # the kernel's count, from the domain its canary named
            assert counts["kernel"] in (None, 1) and not result.child.denied, counts   # None: lost, and reported
            continue
        if not accounted(counts, sv.client):
            continue   # lost under load, and reported
        assert counts["received"] == counts["kernel"] == 1, counts
        # Its denial told, attributed by its domain (the session's pid); the
        # process that was denied unnamed (no SYSCALL record: the rule held), none made up.
        reads = [e for e in result.child.denied if e["object"] == "/etc/hostname"]
        assert len(reads) == 1 and reads[0]["rights"] == ["fs.read_file"], result.child.denied
        assert reads[0]["pid"] == result.child.pid and reads[0]["process"] is None, reads[0]
    assert sv.client.ping() is not None   # still serving
