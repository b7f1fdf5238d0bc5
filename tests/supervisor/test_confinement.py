"""Children are confined: Landlock denies what the manifest does not grant,
as a dropped uid or as capability-less root; a request can narrow but never
widen; a confined child that reaches the supervisor's socket is refused."""
from __future__ import annotations

import glob
import json
import os

import pytest

import landlock
from supervisor.client import SupervisorError
from svhelpers import proc_status, request, run, sh

KERNEL_ABI = landlock.abi_version()

pytestmark = pytest.mark.enforcement


def _make_tree(base):
    """base/data/{granted,granted/inner,other}/file, world-readable, in
    world-traversable directories."""
    data = base / "data"
    for sub in ("granted", "granted/inner", "other"):
        (data / sub).mkdir(parents=True)
        os.chmod(data / sub, 0o755)
    os.chmod(data, 0o755)
    for sub in ("granted", "granted/inner", "other"):
        f = data / sub / "file"
        f.write_text(f"{sub}\n")
        os.chmod(f, 0o644)
    return data


@pytest.fixture
def tree(lab):
    return _make_tree(lab.dir)


@pytest.fixture(scope="module")
def narrowing(module_lab):
    """(supervisor, tree): sh may read the tree (no exec), NOFILE 256."""
    data = _make_tree(module_lab.dir)
    (data / "granted" / "escape").symlink_to("/etc")
    (module_lab.dir / "data-sibling").mkdir()
    _sh_manifest(module_lab, sandbox={"read_only_noexec": [str(data)], "rlimits": {"NOFILE": 256}})
    return module_lab.start(), data


def _sh_manifest(lab, name="sh", **fields):
    sandbox = {"profiles": ["system"], "read_only": ["/usr/bin"], "read_only_noexec": ["/proc"]}
    for key, value in fields.pop("sandbox", {}).items():
        sandbox[key] = sandbox.get(key, []) + value if isinstance(value, list) else value
    lab.manifest(name, command="/bin/sh", args=["-c"], client_args=True, sandbox=sandbox, **fields)


@pytest.mark.timeout(20)
def test_denied_read_fails_allowed_works(lab, tree):
    _sh_manifest(lab, sandbox={"read_only_noexec": [str(tree / "granted")]})
    svr = lab.start()
    ok = sh(svr.client, f"cat {tree}/granted/file")
    assert ok.code == 0 and ok.text == "granted\n", ok
    denied = sh(svr.client, f"cat {tree}/other/file")
    assert denied.code != 0 and b"Permission denied" in denied.err, denied
    # Write is not granted either, nor exec from a noexec grant.
    w = sh(svr.client, f"echo x > {tree}/granted/new")
    assert w.code != 0 and b"Permission denied" in w.err, w
    assert not (tree / "granted" / "new").exists()
    x = sh(svr.client, f"cp /bin/true {tree}/granted/t 2>/dev/null; {tree}/granted/file")
    assert x.code != 0
    assert ok.child.report.enforced


@pytest.mark.timeout(20)
@pytest.mark.parametrize("user,uid", [("nobody", 65534), (54321, 54321)])
def test_dropped_uid_is_confined(lab, tree, user, uid):
    _sh_manifest(lab, user=user, sandbox={"read_only_noexec": [str(tree / "granted")]})
    svr = lab.start()
    r = sh(svr.client, "id -u; id -g; cat /proc/self/status")
    assert r.code == 0, r
    lines = r.text.splitlines()
    assert int(lines[0]) == uid
    status = proc_status("\n".join(lines[2:]))
    assert status["Uid"].split() == [str(uid)] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert r.child.report.uid == uid
    # DAC lets this uid read both files (world-readable, world-traversable):
    # only Landlock tells them apart.
    assert sh(svr.client, f"cat {tree}/granted/file").text == "granted\n"
    denied = sh(svr.client, f"cat {tree}/other/file")
    assert denied.code != 0 and b"Permission denied" in denied.err, denied


@pytest.mark.timeout(20)
def test_root_without_capabilities(lab, tree):
    _sh_manifest(lab, allow_root=True, sandbox={"read_only_noexec": [str(tree / "granted")]})
    svr = lab.start()
    r = sh(svr.client, "cat /proc/self/status")
    assert r.code == 0, r
    status = proc_status(r.text)
    assert status["Uid"].split() == ["0"] * 4
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"] == "1"
    assert r.child.report.capabilities_dropped
    # Root, yet Landlock denies; and without CAP_DAC_OVERRIDE a 0600 file of
    # another owner is out of reach too.
    denied = sh(svr.client, f"cat {tree}/other/file")
    assert b"Permission denied" in denied.err, denied
    private = tree / "granted" / "private"
    private.write_text("p\n")
    os.chown(private, 54321, 54321)
    os.chmod(private, 0o600)
    assert b"Permission denied" in sh(svr.client, f"cat {private}").err
    chown = sh(svr.client, f"chown 1 {tree}/granted/file")
    assert chown.code != 0


@pytest.mark.timeout(20)
def test_child_cannot_signal_the_supervisor(lab):
    """Same uid (root, even), yet the Landlock signal scope keeps a confined
    child from signalling anything outside its domain: the supervisor above all."""
    _sh_manifest(lab)
    svr = lab.start()
    if KERNEL_ABI < 6:  # no signal scope: the Report must say so
        assert "scope_signal" in sh(svr.client, "true").child.report.downgraded
        return
    for sig in ("TERM", "HUP", "KILL"):
        r = sh(svr.client, f"kill -{sig} $PPID; echo $?")
        assert r.text.strip() != "0" and b"not permitted" in r.err, r
    assert svr.proc.poll() is None
    assert "reload" not in svr.log()
    # Its own process group it may signal.
    r = sh(svr.client, "sleep 10 & kill -TERM $!; wait $!; echo $?")
    assert r.text == "143\n", r
    assert svr.client.ping()["pid"] == svr.pid


@pytest.mark.timeout(20)
def test_cwd_and_umask(lab, tree):
    """The manifest's umask; a child with a session gid (a root supervisor's,
    the manifest naming no `group:`) masks the group bits as well: its gid
    goes to a later session."""
    grant = {"read_write_noexec": [str(tree / "granted")]}
    _sh_manifest(lab, cwd=str(tree / "granted"), umask="027", sandbox=grant)
    _sh_manifest(lab, "sh-group", cwd=str(tree / "granted"), umask="027", sandbox=grant,
                 **({"user": "root", "group": "root"} if os.geteuid() == 0 else {}))
    svr = lab.start()
    session_gid = os.geteuid() == 0
    for name, mask, mode in (("sh", "0077" if session_gid else "0027", "600" if session_gid else "640"),
                             ("sh-group", "0027", "640")):
        r = run(svr.client, name, [f"pwd; umask; echo x > new-{name}; stat -c %a new-{name}"])
        assert r.code == 0, r
        assert r.text.split() == [str(tree / "granted"), mask, mode], name


@pytest.mark.timeout(20)
def test_narrowing_confines_more(lab, tree):
    _sh_manifest(lab, sandbox={"read_only_noexec": [str(tree)]})
    svr = lab.start()
    wide = sh(svr.client, f"cat {tree}/granted/file {tree}/other/file")
    assert wide.code == 0 and wide.text == "granted\nother\n"
    narrow = {"read_only_noexec": ["/proc", str(tree / "granted")]}
    r = sh(svr.client, f"cat {tree}/granted/inner/file", narrow=narrow)
    assert r.code == 0 and r.text == "granted/inner\n", r
    r = sh(svr.client, f"cat {tree}/other/file", narrow=narrow)
    assert r.code != 0 and b"Permission denied" in r.err, r
    # Narrowing one class leaves the others as the manifest has them.
    r = sh(svr.client, "cat /proc/self/status >/dev/null && echo ok", narrow=narrow)
    assert r.text == "ok\n"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("narrow", [
    {"read_only_noexec": ["/etc"]},                            # outside the grants
    {"read_only_noexec": ["/"]},                               # a parent of a grant
    {"read_write_noexec": ["{tree}/granted"]},                 # read-only granted, write asked
    {"read_only": ["{tree}/granted"]},                         # noexec granted, exec asked
    {"read_only_noexec": ["{tree}/granted/../../.."]},         # climbing out
    {"read_only_noexec": ["{tree}/granted/escape"]},           # a symlink out
    {"read_only_noexec": ["{tree}-sibling"]},                  # a prefix, not a parent
    {"connect_tcp": [443]},                                    # a port not granted
    {"rlimits": {"NOFILE": 100000}},                           # above the manifest's limit
    {"unrestricted_network": True},                            # not a narrowing field
])
def test_widening_is_refused(narrowing, narrow):
    svr, tree = narrowing
    narrow = json.loads(json.dumps(narrow).replace("{tree}", str(tree)))
    with pytest.raises(SupervisorError) as e:
        sh(svr.client, "echo should not run", narrow=narrow)
    assert e.value.code == "bad_spec", e.value
    assert svr.client.stats()["children"] == 0


@pytest.mark.timeout(20)
@pytest.mark.parametrize("narrow", [
    {"read_only_noexec": ["/a\u0000b"]},
    {"read_only_noexec": "/etc"},
    {"read_only_noexec": [17]},
    {"connect_tcp": [{}]},
    {"connect_tcp": "443"},
    {"rlimits": {"NOFILE": [1, 2]}},
    {"rlimits": {"NOSUCH": 1}},
    {"rlimits": []},
    ["read_only"],
    "read_only",
])
def test_malformed_narrowing_is_refused(narrowing, narrow):
    svr, _ = narrowing
    null = os.open(os.devnull, os.O_RDWR)
    try:
        reply = request(str(svr.socket_path), {"op": "spawn", "manifest": "sh", "args": ["echo no"],
                                               "narrow": narrow}, [null, null, null])
    finally:
        os.close(null)
    assert reply["event"] == "error" and reply["code"] in ("bad_spec", "bad_request"), reply
    assert svr.client.ping()["pid"] == svr.pid
    assert svr.client.stats()["children"] == 0


@pytest.mark.timeout(20)
def test_narrowing_lowers_rlimits(narrowing):
    svr, _ = narrowing
    assert sh(svr.client, "ulimit -n").text == "256\n"
    assert sh(svr.client, "ulimit -n", narrow={"rlimits": {"NOFILE": 64}}).text == "64\n"


PROBE = r"""
import array, json, os, socket, sys
def recv(s):
    try:
        return s.recv(65536)
    except ConnectionResetError:  # closed with our request unread; the reply follows
        return s.recv(65536)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(json.dumps({"connect": e.errno})); sys.exit(0)
req = json.dumps({"v": 1, "op": "spawn", "manifest": "sh", "args": ["echo escaped"]}).encode()
try:  # refused at accept: the refusal may be waiting while the send fails
    s.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
except BrokenPipeError:
    pass
data = recv(s)
print(json.dumps({"reply": json.loads(data) if data else None}))
s2 = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s2.connect(sys.argv[1])
try:
    s2.send(json.dumps({"v": 1, "op": "ping"}).encode())
except BrokenPipeError:
    pass
data = recv(s2)
print(json.dumps({"ping": json.loads(data) if data else None}))
print(json.dumps({"ppid": os.getppid()}))
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("grant_socket", [False, True])
def test_confined_child_cannot_obtain_a_spawn(lab, grant_socket):
    """connect() to a pathname socket is not restricted before ABI 9: the
    supervisor must refuse a peer that descends from it. From ABI 9 only
    connect_unix grants it (a writable directory does not)."""
    socket_dir = lab.dir / "run"
    sandbox = {"profiles": ["system"], "read_only": sorted(glob.glob("/usr/lib/python3*"))}
    if grant_socket:
        sandbox["read_write_noexec"] = [str(socket_dir)]
        sandbox["connect_unix"] = [str(socket_dir / "socket")]
    lab.manifest("py", command="/usr/bin/python3", args=["-I", "-c", PROBE], client_args=True,
                 sandbox=sandbox)
    _sh_manifest(lab)
    svr = lab.supervisor()
    socket_dir.mkdir(mode=0o700)
    svr.start()
    r = run(svr.client, "py", [str(svr.socket_path)])
    assert r.code == 0, r
    out = [json.loads(line) for line in r.text.splitlines()]
    if "connect" in out[0]:  # ABI 9: FS_RESOLVE_UNIX stopped it already
        assert not grant_socket and KERNEL_ABI >= 9, out
        return
    assert out[0]["reply"]["event"] == "error", out
    assert out[0]["reply"]["code"] == "refused_peer", out
    assert out[1]["ping"]["code"] == "refused_peer", out
    assert b"escaped" not in r.out
    stats = svr.client.stats()
    assert stats["refused"] >= 2 and stats["spawned"] == 1


@pytest.mark.timeout(30)
def test_grandchild_of_a_confined_child_is_refused(lab):
    """Also a process that double-forked away from its session (reparented
    to the supervisor, the subreaper)."""
    sandbox = {"profiles": ["system"], "read_only": sorted(glob.glob("/usr/lib/python3*")) + ["/usr/bin"]}
    lab.manifest("py", command="/bin/sh", args=["-c"], client_args=True, sandbox=sandbox)
    _sh_manifest(lab)
    probe = lab.dir / "probe.py"
    probe.write_text(PROBE)
    os.chmod(probe, 0o644)
    lab.manifest("py", command="/bin/sh", args=["-c"], client_args=True,
                 sandbox={**sandbox, "read_only_noexec": [str(probe)],
                          "connect_unix": [str(lab.dir / "run" / "socket")]})
    svr = lab.start()
    # The subshell exits at once: the probe is reparented to the supervisor
    # (a subreaper) and leads a session of its own.
    script = (f"(setsid sh -c 'sleep 0.3; exec /usr/bin/python3 -I {probe} {svr.socket_path}' &); sleep 0.1")
    r = run(svr.client, "py", [script])
    assert r.code == 0, r
    out = [json.loads(line) for line in r.text.splitlines()]
    assert out and out[0].get("reply", {}).get("code") == "refused_peer", (r, out)
    assert out[-1]["ppid"] == svr.pid
