"""State layout, root gating and SysV IPC (issue 11, findings 1 and 3).

Each case runs the attacker (probe.py) as a confined child of a real
supervisor, as a dedicated uid and as capability-less root where it
applies. Rows: docs/security.md (escape catalogue and Limits).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import stat

import pytest

from sechelpers import (AS_ROOT, AS_UID, CHILD_UID, IDENTITIES, PROBE, PYTHON3, attack, case, check_limit,
                        probe_manifest)
from svhelpers import spawn_bg, wait_until

from supervisor.client import NoSuchManifest

pytestmark = pytest.mark.enforcement
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
IPC_CREAT, IPC_RMID = 0o1000, 0


def _world(lab, ident, name="npxlike"):
    """bin/ (probe.py, a copy of true), secret/ (world-readable, no rule),
    and a manifest whose cache is granted read_write beside its state dir,
    as the npx profile grants npm-cache."""
    bin_dir = lab.dir / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir(mode=0o755)
        shutil.copy(PROBE, bin_dir / "probe.py")
        shutil.copy("/bin/true", bin_dir / "true")
        os.chmod(bin_dir / "probe.py", 0o644)
        secret = lab.dir / "secret"
        secret.mkdir(mode=0o755)
        (secret / "key").write_text("the secret")
        os.chmod(secret / "key", 0o644)
    area = lab.state_root / "servers" / name
    probe_manifest(lab, name, bin_dir / "probe.py", user=ident.uid or None, state_dir=True,
                   sandbox={"profiles": ["system"], "read_only_noexec": [str(bin_dir)],
                            "read_write": [str(area / "npm-cache")]})
    return area, lab.dir / "secret"


def _reload(sv):
    before = sv.log().count("reloaded")
    sv.signal(signal.SIGHUP)
    assert wait_until(lambda: sv.log().count("reloaded") > before, 5), sv.log()


@case("state-symlink-swap")
@pytest.mark.timeout(40)
@pytest.mark.parametrize("ident", IDENTITIES, ids=[i.name for i in IDENTITIES])
def test_state_symlink_swap(lab, ident):
    area, secret = _world(lab, ident)
    sv = lab.start()
    cache, state = str(area / "npm-cache"), str(area / "state")
    o = attack(sv.client, "npxlike", [["rename", cache, cache + ".away"], ["rmdir", cache],
                                      ["symlink", str(secret), str(area / "uv-cache")],
                                      ["write_file", state + "/ok", "mine"], ["read", cache + "/key"]])
    assert [o.errname(i) for i in range(5)] == ["EACCES", "EACCES", "EACCES", None, "ENOENT"], o
    assert os.path.isdir(cache) and not os.path.islink(cache)
    # Had the swap happened (someone else did it): the next reload refuses the
    # manifest, follows and chowns nothing, and the supervisor keeps serving.
    os.rename(cache, cache + ".away")
    os.symlink(secret, cache)
    _reload(sv)
    with pytest.raises(NoSuchManifest):
        attack(sv.client, "npxlike", [["read", cache + "/key"]])
    assert "npxlike.yaml: refused" in sv.log()
    assert os.lstat(secret).st_uid == 0 and os.lstat(secret / "key").st_uid == 0
    sv.stop()
    lab.manifest("true", command="/bin/true")   # (with nothing else to serve it would not start)
    assert "true" in lab.start().client.list()["manifests"]   # and it starts with the link there


@case("broken-reload-keeps-grant")
@pytest.mark.timeout(40)
def test_a_broken_reload_keeps_no_grant(lab):
    """A manifest whose secret directory was granted is narrowed with a typo
    and reloaded: it is withdrawn, not kept in its old, wider version; fixed,
    it serves the narrowed grant."""
    _, secret = _world(lab, AS_UID, "narrowed")   # (bin/ and secret/; its manifest is replaced below)
    bin_dir = lab.dir / "bin"
    wide = {"profiles": ["system"], "read_only_noexec": [str(bin_dir), str(secret)]}
    path = probe_manifest(lab, "narrowed", bin_dir / "probe.py", user=CHILD_UID, sandbox=wide)
    sv = lab.start()
    assert attack(sv.client, "narrowed", [["read", str(secret / "key")]])[0]["ok"]
    probe_manifest(lab, "narrowed", bin_dir / "probe.py", user=CHILD_UID,
                   sandbox={"profiles": ["system"], "read_only_noexec": str(bin_dir)})   # a list without its [ ]
    _reload(sv)
    with pytest.raises(NoSuchManifest, match=f"manifest 'narrowed' is not served: {path}: sandbox.read_only_noexec"):
        attack(sv.client, "narrowed", [["read", str(secret / "key")]])
    probe_manifest(lab, "narrowed", bin_dir / "probe.py", user=CHILD_UID,
                   sandbox={"profiles": ["system"], "read_only_noexec": [str(bin_dir)]})
    _reload(sv)
    assert attack(sv.client, "narrowed", [["read", str(secret / "key")]]).errname(0) == "EACCES"


@case("dynamic-uid-state-roots")
@pytest.mark.timeout(40)
def test_dynamic_uids_of_two_state_roots(lab):
    """Attempt: two root supervisors with different state roots (a daemon
    and a root `run --manifests --state-root ...`) each run a `user:
    dynamic` manifest `filesystem`; the second's server reads the first's
    0600 file in its state directory (which its manifest grants it:
    Landlock allows, DAC decides) and lowers its limits. Stopped by: one
    host-wide table of dynamic uids, keyed by (state root, manifest name):
    the two servers have two uids (and no state root's table is consulted
    alone): EACCES, EPERM."""
    bin_dir = lab.dir / "bin"
    bin_dir.mkdir(mode=0o755)
    shutil.copy(PROBE, bin_dir / "probe.py")
    os.chmod(bin_dir / "probe.py", 0o644)
    first_state = lab.dir / "state-1" / "servers" / "filesystem" / "state"
    svs = []
    for n, reads in ((1, []), (2, [str(first_state)])):
        mdir = lab.dir / f"manifests-{n}"
        lab.manifest("filesystem", command=PYTHON3, args=["-I", "-B", str(bin_dir / "probe.py")], client_args=True,
                     directory=mdir, user="dynamic", state_dir=True,
                     sandbox={"profiles": ["system"], "read_only_noexec": [str(bin_dir), "/proc", *reads]})
        svs.append(lab.start(manifests=[mdir], state_root=lab.dir / f"state-{n}",
                             socket_path=lab.dir / f"run-{n}" / "socket"))
    secret = str(first_state / "secret")
    victim, pipes = spawn_bg(svs[0].client, "filesystem", [json.dumps([["write_file", secret, "theirs", "600"],
                                                                       ["sleep", 10]])])
    try:
        assert wait_until(lambda: os.path.exists(secret), 5)
        o = attack(svs[1].client, "filesystem", [["ids"], ["read", secret], ["prlimit", victim.pid, "NOFILE", 3, 3]])
    finally:
        with victim:
            victim.signal(signal.SIGKILL)
            victim.wait(10)
        pipes.close()
    assert [o.errname(1), o.errname(2)] == ["EACCES", "EPERM"], o
    assert o[0]["value"]["Uid"][0] != str(os.stat(secret).st_uid), o


@case("allow-root-refused")
@pytest.mark.timeout(30)
def test_allow_root_refused_without_the_option(lab):
    _world(lab, AS_ROOT, "as-root")
    _world(lab, AS_UID, "as-uid")
    sv = lab.supervisor()
    sv.allow_root = False
    sv.start()
    probe = str(lab.dir / "bin" / "probe.py")
    with pytest.raises(NoSuchManifest):
        attack(sv.client, "as-root", [["read", probe]])
    assert attack(sv.client, "as-uid", [["read", probe]])[0]["ok"]
    lines = [line for line in sv.log().splitlines() if "as-root.yaml" in line]
    assert len(lines) == 1 and "--allow-root-servers" in lines[0], lines


@pytest.mark.timeout(30)
def test_allow_root_chmod(lab):
    """With --allow-root-servers, capability-less root still owns root's
    files: chmod needs ownership, not a capability, and Landlock does not
    handle metadata. A root-owned copy of a binary outside every grant
    becomes set-uid root."""
    _world(lab, AS_ROOT)
    target = lab.dir / "foreign-copy"
    shutil.copy("/bin/true", target)
    os.chmod(target, 0o755)
    sv = lab.start()
    o = attack(sv.client, "npxlike", [["chmod", str(target), "4755"]])
    check_limit("allow-root-chmod", o[0]["ok"] and bool(os.stat(target).st_mode & stat.S_ISUID))


@case("sysv-ipc-host")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("ident", IDENTITIES, ids=[i.name for i in IDENTITIES])
def test_sysv_ipc_of_the_host(lab, ident):
    key = 0x11C5A000 + os.getpid() % 4096
    shmid = _libc.shmget(key, 4096, IPC_CREAT | 0o666)   # world-readable: the namespace is what stops it
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        addr = _libc.shmat(shmid, None, 0)
        ctypes.memmove(addr, b"host secret", 11)
        _world(lab, ident)
        sv = lab.start()
        o = attack(sv.client, "npxlike", [["shm_read", key]])
        assert o.errname(0) == "ENOENT", o
    finally:
        _libc.shmctl(shmid, IPC_RMID, None)


@pytest.mark.timeout(30)
def test_servers_share_one_ipc_namespace(lab):
    """The zygote keeps no CAP_SYS_ADMIN: one IPC namespace for every server."""
    _world(lab, AS_UID, "one")
    _world(lab, AS_ROOT, "two")
    sv = lab.start()
    key = 0x11C5B000 + os.getpid() % 4096
    made = attack(sv.client, "one", [["shm_create", key, "from one"]])
    assert made[0]["ok"], made
    o = attack(sv.client, "two", [["shm_read", key]])
    check_limit("ipc-shared-between-servers", o[0]["ok"] and o[0]["value"] == "from one")


@pytest.mark.timeout(30)
def test_executable_caches_persist(lab):
    """One session puts a program in its (executable) cache; the next
    session of the same manifest runs it."""
    area, _ = _world(lab, AS_UID)
    sv = lab.start()
    tool = str(area / "npm-cache" / "tool")
    first = attack(sv.client, "npxlike", [["copy", str(lab.dir / "bin" / "true"), tool, "755"]])
    assert first[0]["ok"], first
    second = attack(sv.client, "npxlike", [["exec", tool]])
    check_limit("executable-caches-persist", second[0]["ok"] and second[0]["value"]["status"] == 0)
    assert os.stat(tool).st_uid == CHILD_UID
