"""The state layout, dynamic users, the root gating and the namespaces of a
root supervisor (issue 11, findings 1, 3 and 6)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from multiprocessing import Pool

import pytest
from svhelpers import PYTHON, REPO, run

from supervisor.manifests import ids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root supervisor's behaviour")

# Prints what a server without a passwd entry of its own would ask for.
WHO = """
import getpass, json, os, pwd, sys
out = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
       "env": {k: os.environ.get(k) for k in ("HOME", "USER", "LOGNAME", "STATE_DIR")},
       "getuser": getpass.getuser()}
try:
    out["pw_name"] = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    out["pw_name"] = None
path = os.environ.get("MEMORY_FILE_PATH")
if path:
    try:
        out["memory"] = open(path).read()
    except OSError as e:
        out["memory"] = e.strerror
print(json.dumps(out))
"""


def who_manifest(lab, name, **fields):
    fields.setdefault("user", "dynamic")
    fields.setdefault("state_dir", True)
    return lab.manifest(name, command="/usr/bin/python3", args=["-I", "-c", WHO],
                        sandbox={"profiles": ["system", "python"], **fields.pop("sandbox", {})}, **fields)


def who(client, name):
    r = run(client, name)
    assert r.code == 0, r
    return json.loads(r.out)


def table(lab):
    return {name: str(uid) for name, uid in ids.Table(str(lab.state_root)).names().items()}


@pytest.mark.timeout(30)
def test_root_manifests_refused_without_the_option_others_load(lab):
    lab.manifest("rooty", command="/bin/true")                 # allow_root: true
    named = lab.manifest("named-root", command="/bin/true", user="root")
    who_manifest(lab, "dyn")
    sv = lab.supervisor()
    sv.allow_root = False
    sv.start()
    assert sorted(sv.client.list()["manifests"]) == ["dyn"]
    lines = [line for line in sv.log().splitlines() if "refused" in line]
    assert len(lines) == 2, sv.log()
    for path in (lab.manifest_dir / "rooty.yaml", named):
        assert sum(str(path) in line and "--allow-root-servers" in line for line in lines) == 1, lines


@pytest.mark.timeout(30)
def test_user_root_is_root_with_the_option(lab):
    lab.manifest("named-root", command="/bin/true", user="root")
    sv = lab.start()
    assert sorted(sv.client.list()["manifests"]) == ["named-root"]


@pytest.mark.timeout(40)
def test_dynamic_user_gets_a_stable_uid_home_user_and_a_passwd_entry(lab):
    who_manifest(lab, "dyn")
    who_manifest(lab, "dyn2")
    sv = lab.start()
    first, second = who(sv.client, "dyn"), who(sv.client, "dyn2")
    lo, hi = ids.DEFAULT_DYNAMIC_UIDS
    glo, ghi = ids.DEFAULT_SESSION_GIDS
    assert lo <= first["uid"] <= hi and glo <= first["gid"] <= ghi, first   # a session gid, as without `group:`
    assert second["uid"] != first["uid"], (first, second)
    state_dir = str(lab.state_root / "servers" / "dyn" / "state")
    assert first["env"] == {"HOME": state_dir, "USER": "llsv-dyn", "LOGNAME": "llsv-dyn", "STATE_DIR": None}, first
    assert first["cwd"] == state_dir
    assert first["getuser"] == "llsv-dyn" and first["pw_name"] == "llsv-dyn", first
    assert table(lab) == {"dyn": str(first["uid"]), "dyn2": str(second["uid"])}
    area = os.lstat(lab.state_root / "servers" / "dyn")
    assert area.st_uid == 0 and stat.S_IMODE(area.st_mode) == 0o755
    st = os.lstat(state_dir)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (first["uid"], first["uid"], 0o700)
    # The host's /etc/passwd is untouched.
    with open("/etc/passwd") as f:
        assert "llsv-" not in f.read()
    sv.stop()
    # Stable across restarts, whatever the order of the manifests: aa-new loads first now.
    (lab.manifest_dir / "dyn2.yaml").unlink()
    who_manifest(lab, "aa-new")
    sv = lab.start()
    assert who(sv.client, "dyn")["uid"] == first["uid"]
    assert who(sv.client, "aa-new")["uid"] not in (first["uid"], second["uid"])


def _assign(args):
    root, name = args
    return ids.Table(root).assign([name])[name]


@pytest.mark.timeout(30)
def test_table_never_hands_one_uid_to_two_keys(tmp_path):
    """Four processes at once, for two state roots with the same names: one
    uid per (state root, name), whatever the order."""
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    keys = [(root, f"m{i}") for i in range(12) for root in roots]
    with Pool(4) as pool:
        got = pool.map(_assign, keys)
    assert len(set(got)) == 24
    for root in roots:
        again = ids.Table(root).assign([f"m{i}" for i in range(12)])
        assert [again[name] for r, name in keys if r == root] == [uid for (r, _), uid in zip(keys, got) if r == root]


@pytest.mark.timeout(30)
def test_earlier_tables_carried_into_the_host_table(lab, tmp_path):
    """A state root's own `dynamic-users` (an earlier version's) is carried
    in with its uids at the first start; a uid it names is never given to
    another key, and the host table is where the supervisor looks from then on."""
    hi = ids.DEFAULT_DYNAMIC_UIDS[1]   # the suite's table hands out the range from its start
    kept, lo = hi - 7, hi - 8
    lab.state_root.mkdir()
    (lab.state_root / ids.OLD_TABLE).write_text(f"dyn {kept}\nunused {lo}\n")
    who_manifest(lab, "dyn")
    sv = lab.start()
    assert who(sv.client, "dyn")["uid"] == kept
    sv.stop()
    assert table(lab) == {"dyn": str(kept), "unused": str(lo)}
    # Another state root's manifests, of those very names, get other uids.
    other = ids.Table(str(tmp_path / "other")).assign(["dyn", "unused"])
    assert kept not in other.values() and lo not in other.values()
    (lab.state_root / ids.OLD_TABLE).unlink()
    sv = lab.start()
    assert who(sv.client, "dyn")["uid"] == kept
    # check reads the host table too: the uid the manifest has; none yet for a new name.
    who_manifest(lab, "zz-new")
    out = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", "--state-root", str(lab.state_root),
                          "--manifests", str(lab.manifest_dir)], cwd=REPO, capture_output=True, text=True,
                         timeout=30)
    got = {e["name"]: e.get("dynamic_uid") for e in json.loads(out.stdout)["manifests"]}
    assert got == {"dyn": kept, "zz-new": None}, out.stderr


def test_host_table_written_by_root_only_and_never_through_a_link(tmp_path):
    """The table lies in a directory only root may write and is replaced by
    rename; a link in its place is not followed, a directory others may
    write is refused."""
    directory = tmp_path / "ids"
    t = ids.Table(str(tmp_path / "root"), path=str(directory / "table"))
    uid = t.assign(["fs"])["fs"]
    st = os.lstat(directory / "table")
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert f"{uid} fs {tmp_path / 'root'}\n" in (directory / "table").read_text()   # (the host's default root's too)
    assert sorted(os.listdir(directory)) == ["table", "table.lock"]   # no temp file left
    victim = tmp_path / "victim"
    victim.write_text("x")
    os.rename(directory / "table", tmp_path / "saved")
    os.symlink(victim, directory / "table")
    with pytest.raises(OSError):
        t.assign(["other"])
    assert victim.read_text() == "x" and os.path.islink(directory / "table")
    os.unlink(directory / "table")
    os.rename(tmp_path / "saved", directory / "table")
    os.chmod(directory, 0o777)
    with pytest.raises(ids.IdError, match="only the supervisor's user may write"):
        t.assign(["fs"])
    with pytest.raises(ids.IdError):
        t.peek("fs")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("planted", ["others may write it", "uid 0", "a fifo", "another owner"])
def test_an_earlier_table_that_could_be_planted_is_refused(tmp_path, planted):
    """A state root may lie where others can write (`--state-root` is any
    directory): its old `dynamic-users` is carried only if it is root's and
    only root's, names no uid 0, and a FIFO in its place does not hang the
    supervisor."""
    root = tmp_path / "root"
    root.mkdir()
    old = root / ids.OLD_TABLE
    if planted == "a fifo":
        os.mkfifo(old, 0o600)
    else:
        old.write_text("fs 0\n" if planted == "uid 0" else "fs 1879048999\n")
        os.chmod(old, 0o666 if planted == "others may write it" else 0o644)
        if planted == "another owner":
            os.chown(old, 64199, 64199)
    t = ids.Table(str(root), path=str(tmp_path / "ids" / "table"))
    with pytest.raises(ids.IdError):
        t.assign(["fs"])


def test_ranges_checked():
    with pytest.raises(ids.IdError, match="overlap"):
        ids.check_ranges((1879048192, 1879113727), (1879113727, 1879179263))
    with pytest.raises(ids.IdError, match="DynamicUser"):
        ids.check_ranges((61000, 61500), ids.DEFAULT_SESSION_GIDS)
    with pytest.raises(ids.IdError, match="test suites"):
        ids.check_ranges(ids.DEFAULT_DYNAMIC_UIDS, (64500, 64600))
    known = min(i for i in ids.known_ids() if i > 0)
    with pytest.raises(ids.IdError, match="known to NSS"):
        ids.check_ranges((known, known), ids.DEFAULT_SESSION_GIDS)
    with pytest.raises(ids.IdError):
        ids.parse_range("0-10", "--dynamic-uids")
    ids.check_ranges(ids.DEFAULT_DYNAMIC_UIDS, ids.DEFAULT_SESSION_GIDS)


@pytest.mark.timeout(20)
def test_serve_refuses_a_range_in_systemds(lab):
    lab.manifest("t", command="/bin/true")
    r = subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(lab.dir / "s"), "serve", "--manifests",
                        str(lab.manifest_dir), "--state-root", str(lab.state_root),
                        "--dynamic-uids", "61184-61200"], cwd=REPO, capture_output=True, text=True, timeout=15)
    assert r.returncode == 2 and "DynamicUser" in r.stderr, r


@pytest.mark.timeout(40)
def test_old_layout_moved_nothing_lost_no_link_followed(lab):
    """servers/<name> was the state dir itself, root-owned (an allow_root
    server), with its memory file, a cache, and a link a server planted."""
    old = lab.state_root / "servers" / "mem"
    (old / "npm-cache" / "_cacache").mkdir(parents=True)
    (old / "npm-cache" / "_cacache" / "index").write_text("cached")
    (old / "memory.jsonl").write_text('{"entity": "kept"}\n')
    os.chmod(old / "memory.jsonl", 0o600)
    secret = lab.dir / "secret"
    secret.mkdir(mode=0o700)
    os.symlink(secret, old / "uv-cache")
    who_manifest(lab, "mem", env={"MEMORY_FILE_PATH": "${STATE_DIR}/memory.jsonl"})
    sv = lab.start()
    got = who(sv.client, "mem")
    assert got["memory"] == '{"entity": "kept"}\n', got
    area = lab.state_root / "servers" / "mem"
    assert os.lstat(area).st_uid == 0 and stat.S_IMODE(os.lstat(area).st_mode) == 0o755
    assert (area / "npm-cache" / "_cacache" / "index").read_text() == "cached"
    assert os.lstat(area / "state" / "memory.jsonl").st_uid == got["uid"]
    assert os.path.islink(area / "state" / "uv-cache") and not (area / "uv-cache").exists()
    assert os.lstat(secret).st_uid == 0 and stat.S_IMODE(os.lstat(secret).st_mode) == 0o700
    assert "new layout" in sv.log()


@pytest.mark.timeout(40)
@pytest.mark.parametrize("planted", ["link-to-secret", "dangling", "foreign-dir"])
def test_hostile_state_entry_refuses_that_manifest_only(lab, planted):
    area = lab.state_root / "servers" / "victim"
    area.mkdir(parents=True)
    secret = lab.dir / "secret"
    secret.mkdir(mode=0o700)
    if planted == "link-to-secret":
        os.symlink(secret, area / "state")
    elif planted == "dangling":
        os.symlink("/nonexistent/x", area / "state")
    else:
        (area / "state").mkdir()
        os.chown(area / "state", 64999, 64999)
    who_manifest(lab, "victim")
    who_manifest(lab, "bystander")
    sv = lab.start()
    assert sorted(sv.client.list()["manifests"]) == ["bystander"]
    assert "victim.yaml: refused" in sv.log()
    assert os.lstat(secret).st_uid == 0 and os.lstat(area).st_uid == 0
    sv.signal(1)   # a reload meets it again: still refused, still serving
    assert who(sv.client, "bystander")["uid"] > 0


@pytest.mark.timeout(30)
def test_a_manifest_inside_a_writable_grant_is_refused_alone_and_warned_about(lab):
    """A server that may write where a manifest lies (its own, another's)
    could rewrite it before the next load: serve refuses that manifest,
    naming the grant, and serves the others; check warns."""
    kept = lab.dir / "kept"
    kept.mkdir()
    writer = who_manifest(lab, "writer", sandbox={"read_write_noexec": [str(kept)]})
    own = who_manifest(lab, "own", directory=kept, sandbox={"read_write_noexec": [str(kept)]})
    other = who_manifest(lab, "other", directory=kept)
    sv = lab.supervisor(manifests=[lab.manifest_dir, kept]).start()
    assert sorted(sv.client.list()["manifests"]) == ["writer"]
    for path in (own, other):
        assert f"{path}: refused: it lies inside " in sv.log() and f"writable grant {kept}" in sv.log(), sv.log()
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", str(writer), str(own), str(other),
                        "--state-root", str(lab.state_root)], cwd=REPO, capture_output=True, text=True, timeout=30)
    warned = {m["name"]: [w for w in m["warnings"] if "that server can rewrite it" in w]
              for m in json.loads(r.stdout)["manifests"]}
    assert not warned["writer"] and warned["own"] and warned["other"], warned
    assert f"its file {other} lies inside " in warned["other"][0] and str(kept) in warned["other"][0]


@pytest.mark.timeout(30)
def test_children_live_in_the_supervisors_ipc_namespace(lab):
    lab.manifest("sleep", command="/bin/sleep", args=["5"])
    sv = lab.start()
    r_in, r_out = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    child = sv.client.spawn("sleep", stdin=null, stdout=r_out, stderr=r_out)
    try:
        theirs = os.readlink(f"/proc/{child.pid}/ns/ipc")
        assert theirs != os.readlink("/proc/self/ns/ipc")
        assert theirs == os.readlink(f"/proc/{sv.pid}/ns/ipc")
    finally:
        child.kill()
        child.wait(5)
        child.close()
        for fd in (r_in, r_out, null):
            os.close(fd)


@pytest.mark.timeout(30)
def test_check_warns(lab):
    """check warns for a grant inside a writable grant (the manifest's own
    included), for a server that runs as the supervisor's uid, and for a
    kernel that still allows TIOCSTI."""
    import json
    import subprocess
    from svhelpers import PYTHON, REPO
    tree = lab.dir / "tree"
    (tree / "inner").mkdir(parents=True)
    path = lab.manifest("nested", command="/bin/true", sandbox={
        "profiles": ["system"], "read_write_noexec": [str(tree)], "read_only": [str(tree / "inner")]})
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", str(path), "--state-root",
                        str(lab.state_root)], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    warnings = report["manifests"][0]["warnings"]
    assert any(f"{tree / 'inner'} lies inside its own writable {tree}" in w for w in warnings), warnings
    assert any("supervisor's own uid" in w for w in warnings), warnings
    with open("/proc/sys/dev/tty/legacy_tiocsti") as f:
        legacy = f.read().strip() == "1"
    assert legacy == any("legacy_tiocsti" in w for w in report["kernel"]["warnings"]), report["kernel"]


@pytest.mark.timeout(30)
def test_check_shows_inherit_env(lab):
    """check names each manifest's inherit_env and which of them its own
    environment has: the supervisor's (daemon) or the client's (private)
    decides what the server gets."""
    import json
    import subprocess
    from svhelpers import PYTHON, REPO
    path = lab.manifest("inherits", command="/bin/true", inherit_env=["PATH", "LLSV_SURELY_UNSET"])
    env = {k: v for k, v in os.environ.items() if k != "LLSV_SURELY_UNSET"}
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", str(path), "--state-root",
                        str(lab.state_root)], cwd=REPO, capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["manifests"][0]["inherit_env"] == {"PATH": True, "LLSV_SURELY_UNSET": False}
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", str(path), "--state-root", str(lab.state_root)],
                       cwd=REPO, capture_output=True, text=True, timeout=30, env=env)
    assert "set in check's environment: PATH; unset: LLSV_SURELY_UNSET" in r.stdout, r.stdout


@pytest.mark.timeout(30)
def test_npx_and_uvx_profiles_bound_the_registry_and_name_the_ca_bundle(lab, monkeypatch):
    """The npx and uvx profiles bound npm's and uv's retries and timeouts,
    and point node and uv at the system CA bundle when a CA was added
    locally; a value the manifest sets or inherits wins over theirs."""
    from supervisor.manifests import manifest, profiles
    monkeypatch.setattr(profiles, "local_ca_bundle", lambda: "/etc/ssl/certs/ca-certificates.crt")
    bin_dir = lab.dir / "bin"
    bin_dir.mkdir()
    for tool in ("npx", "uvx"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "npm_config_fetch_retries": "7"}

    def load(tool: str, **fields) -> dict[str, str]:
        path = lab.manifest(tool, command=str(bin_dir / tool), state_dir=True,
                            sandbox={"profiles": ["system", tool]}, **fields)
        return dict(manifest.load(path, env=env, state_root=str(lab.state_root), as_root=False).env)

    npx = load("npx")
    assert npx["npm_config_fetch_retries"] == "1" and npx["npm_config_fetch_timeout"] == "10000"
    assert npx["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/ca-certificates.crt"
    npx = load("npx", inherit_env=["npm_config_fetch_retries", "NODE_EXTRA_CA_CERTS"],
               env={"npm_config_fetch_timeout": "20000"})
    assert "npm_config_fetch_retries" not in npx      # inherited: the supervisor's 7 at spawn
    assert npx["npm_config_fetch_timeout"] == "20000"
    assert npx["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/ca-certificates.crt"   # inherited but unset here
    uvx = load("uvx")
    assert (uvx["UV_HTTP_RETRIES"], uvx["UV_HTTP_TIMEOUT"], uvx["UV_HTTP_CONNECT_TIMEOUT"]) == ("1", "10", "5")
    assert uvx["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    monkeypatch.setattr(profiles, "local_ca_bundle", lambda: None)
    assert "SSL_CERT_FILE" not in load("uvx")       # no local CA: uv's own list is the same
