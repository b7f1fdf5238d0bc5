"""`landlock-supervisor learn` on a small MCP server written here: the
manifest it writes loads, works through a private supervisor, grants the
writes learning allowed and no other."""
from __future__ import annotations

import json
import os
import random
import shutil
import stat
import string
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.manifests import ids
from supervisor.manifests import manifest as manifests
from supervisor.learn import session
from supervisor.client.private import start

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="learn needs strace")

SERVER = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    result = {}
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "tiny", "version": "1"}}
    elif msg["method"] == "tools/list":
        result = {"tools": [{"name": "save", "inputSchema": {"type": "object"}}]}
    elif msg["method"] == "tools/call":
        args = msg["params"]["arguments"]
        try:
            with open(args["path"], "w") as f:
                f.write(args["text"])
            result = {"content": [{"type": "text", "text": "saved"}]}
        except OSError as e:
            result = {"content": [{"type": "text", "text": str(e)}], "isError": True}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
'''


def learn(lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "learn", "--state-root", str(lab.dir / "state"),
                           *args], capture_output=True, text=True, timeout=50, cwd=lab.dir)


@pytest.fixture
def tiny(lab) -> tuple[Path, Path]:
    # Not beside the state root: python lists its script's directory, and
    # learn never grants a directory holding a supervisor's state root.
    (lab.dir / "srv").mkdir(mode=0o755)
    server = lab.dir / "srv" / "tiny.py"
    server.write_text(SERVER)
    out = lab.dir / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    os.chmod(server, 0o644)
    return server, out


@pytest.fixture
def kept() -> Iterator[Path]:
    """Where learnt manifests go: not under /tmp, which learning lets the server write."""
    directory = Path(tempfile.mkdtemp(prefix="llsv-learnt-", dir="/var/tmp"))
    os.chmod(directory, 0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def save(path: Path) -> list[str]:
    return ["--call", "save", json.dumps({"path": str(path), "text": "hi"})]


def test_learns_a_manifest_that_serves_the_session(lab, tiny, kept) -> None:
    server, out = tiny
    result = learn(lab, "--name", "tiny", "--out", str(kept / "tiny.yaml"), "--write", str(out),
                   *save(out / "a.txt"), "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    assert "learn: tiny: 2 runs" in result.stderr and "0 denials" in result.stderr
    text = (kept / "tiny.yaml").read_text()
    loaded = manifests.load(kept / "tiny.yaml", state_root=str(lab.dir / "state"))
    assert loaded.spec.read_write_noexec[:1] == (str(out),) or str(out) in loaded.spec.read_write_noexec
    assert "/root" not in text.replace('"/root/', "") and "/home" not in text
    assert f'"{server.parent}"' in text   # the script's directory, read only
    # The learned manifest, served: the call works, a write elsewhere is denied.
    with start([str(kept / "tiny.yaml")], state_root=str(lab.dir / "state"), only="tiny") as client:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        child = client.spawn("tiny", stdin=in_r, stdout=out_w, stderr=2)
        os.close(in_r)
        os.close(out_w)
        with child:
            plan = session.requests([("save", json.dumps({"path": str(out / "b.txt"), "text": "x"})),
                                     ("save", json.dumps({"path": str(lab.dir / "elsewhere.txt"), "text": "x"}))],
                                    None)
            outcomes = session.drive(in_w, out_r, plan, 10)
            os.close(in_w)
    assert [o.ok for o in outcomes] == [True, True, True, False]
    assert outcomes[2].detail == "" and "Permission denied" in outcomes[3].detail
    assert outcomes[3].failure == session.TOOL_ERROR and outcomes[3].call == "tools/call save"
    assert (out / "b.txt").read_text() == "x" and not (lab.dir / "elsewhere.txt").exists()


def test_a_write_outside_what_learning_allowed_is_proposed_not_granted(lab, tiny) -> None:
    server, _ = tiny
    # Not under /tmp, which learning lets it write; a name of letters only: a
    # made-up one (mkdtemp's) is a temporary name, never proposed.
    target = Path("/var/tmp") / ("llsv-out-" + "".join(random.choices(string.ascii_lowercase, k=12)))
    target.mkdir(mode=0o777)
    os.chmod(target, 0o777)
    try:
        result = learn(lab, "--name", "tiny2", *save(target / "x.txt"), "--", "/usr/bin/python3", str(server))
        assert not (target / "x.txt").exists()
    finally:
        shutil.rmtree(target)
    assert result.returncode == 5, result.stderr   # the call failed: the manifest lacks what it needed
    assert f"learn again with --write {target / 'x.txt'}" in result.stderr
    assert "  FAILED: tools/call save (request 3, tool error): \"[Errno 13] Permission denied" in result.stderr
    sandbox = result.stdout.split("sandbox:")[1].split("# Writes it attempted")[0]
    assert str(target) not in sandbox
    assert f"#   {target / 'x.txt'}: " in result.stdout


def test_a_relative_state_root_is_the_one_learn_was_given(lab, tiny, kept) -> None:
    """`--state-root state` once made learn walk up from "state" to / for
    ever (its exclusion's ancestors), growing until the OOM killer came."""
    server, _ = tiny
    result = learn(lab, "--state-root", "state", "--name", "tiny", "--out", str(kept / "rel.yaml"),
                   "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    loaded = manifests.load(kept / "rel.yaml", state_root=str(lab.dir / "state"))
    assert loaded.uid == ids.Table(str(lab.dir / "state")).assign(["tiny"])["tiny"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a dynamic uid is a root supervisor's")
def test_learn_runs_the_server_as_the_uid_serve_will_give_it(lab, tiny, kept) -> None:
    """learn takes the dynamic uid in the host's table under the real state
    root, and its scratch supervisor runs the server as that uid: no key of
    the scratch state root is recorded (it would hold a uid for good)."""
    server, out = tiny
    result = learn(lab, "--name", "tiny", "--out", str(kept / "tiny.yaml"), "--write", str(out),
                   *save(out / "mine.txt"), "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    uid = ids.Table(str(lab.dir / "state")).names()["tiny"]
    assert (out / "mine.txt").stat().st_uid == uid
    table = Path(os.environ[ids.TABLE_ENV]).read_text()
    assert "landlock-learn-" not in table, table


@pytest.mark.parametrize("args,message", [
    (["--write", "/", "--", "/usr/bin/true"], "the whole filesystem"),
    (["--write", "/root", "--", "/usr/bin/true"], "a whole home directory"),
    (["--write", "/home", "--", "/usr/bin/true"], "a directory holding home directories"),
    (["--write", "/root/.ssh", "--", "/usr/bin/true"], "a location holding secrets"),
    ([], "no command"),
    (["--", "no-such-program-here"], "not an executable file"),
    (["--call", "x", "{not json", "--", "/usr/bin/true"], "not JSON"),
])
def test_usage_errors_say_why_in_one_line(lab, args: list[str], message: str) -> None:
    result = learn(lab, *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_server_that_never_answers_fails_with_its_stderr(lab) -> None:
    result = learn(lab, "--timeout", "2", "--", "/usr/bin/python3", "-c", "import sys; print('boom', file=sys.stderr)")
    assert result.returncode == 1 and "did not answer initialize" in result.stderr and "boom" in result.stderr


def test_a_plain_user_learns_as_itself_never_as_root(lab, tiny, kept) -> None:
    server, out = tiny
    uid = 64150
    home = lab.dir / "userhome"
    home.mkdir()
    os.chown(home, uid, uid)
    os.chown(lab.dir, uid, uid)   # its state root goes here
    os.chown(kept, uid, uid)      # and its manifest here
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "learn", "--state-root", str(lab.dir / "ustate"), "--name", "tiny",
         "--out", str(kept / "u.yaml"), "--write", str(out), *save(out / "u.txt"), "--", "/usr/bin/python3",
         str(server)],
        capture_output=True, text=True, timeout=50, cwd=lab.dir, env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        user=uid, group=uid, extra_groups=[])
    assert result.returncode == 0, result.stderr
    text = (kept / "u.yaml").read_text()
    assert "user: dynamic" not in text and f"uid {uid}" in text
    assert (out / "u.txt").stat().st_uid == uid   # the learning run wrote it as that user, not as root


def test_out_where_the_server_may_write_or_through_a_link_is_refused_before_the_run(lab, tiny, kept) -> None:
    server, out = tiny
    os.symlink(kept, lab.dir / "link")
    for where, message in ((out / "m.yaml", f"lies inside {out}, which the server may write"),
                           (Path("/tmp/m.yaml"), "lies inside /tmp"),
                           (lab.dir / "link" / "m.yaml", "a symbolic link on the way")):
        result = learn(lab, "--out", str(where), "--write", str(out), "--", "/usr/bin/python3", str(server))
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not where.exists()
    assert not list(kept.iterdir())


def test_out_is_replaced_never_followed(lab, tiny, kept) -> None:
    """A link at --out (someone else's) is replaced by the manifest; its
    target is left as it was, and nothing else is left beside it."""
    server, _ = tiny
    victim = lab.dir / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, kept / "m.yaml")
    result = learn(lab, "--name", "tiny", "--out", str(kept / "m.yaml"), "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "mine\n" and not (kept / "m.yaml").is_symlink()
    assert (kept / "m.yaml").read_text().startswith("# tiny: learned") and os.listdir(kept) == ["m.yaml"]


def test_out_inside_a_grant_of_the_learnt_manifest_is_refused(lab, tiny, kept) -> None:
    """Its own state directory: the server could rewrite the manifest it is served by."""
    server, _ = tiny
    state = kept / "state" / "servers" / "tiny" / "state"
    state.mkdir(parents=True)
    result = learn(lab, "--state-root", str(kept / "state"), "--name", "tiny", "--out", str(state / "m.yaml"),
                   "--", "/usr/bin/python3", str(server))
    assert result.returncode == 2 and f"lies inside {state}, which the learnt manifest" in result.stderr, \
        result.stderr
    assert not list(state.iterdir())


def test_the_area_is_copied_without_following_a_link(tmp_path, monkeypatch) -> None:
    """learn copies servers/<name> (as root) from the state root the server
    writes: links stay links, a directory swapped for one meanwhile, FIFOs
    and set-id bits are left out, a hard-linked file is the same file."""
    from supervisor.learn import area
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("root's\n")
    src = tmp_path / "area"
    (src / "state" / "sub").mkdir(parents=True)
    (src / "state" / "sub" / "kept").write_text("its own\n")
    (src / "state" / "tool").write_text("#!/bin/sh\n")
    os.chmod(src / "state" / "tool", 0o4755)
    os.symlink(secret, src / "npm-cache")
    os.mkfifo(src / "state" / "fifo")
    os.link(secret / "key", src / "state" / "hardlink")
    os.symlink(secret, src / "state" / "swapped")
    real_stat = os.stat

    def swapping(name, *args, **kw):   # lstat saw a directory; the open meets the link
        return real_stat(secret) if name == "swapped" else real_stat(name, *args, **kw)

    monkeypatch.setattr(area.os, "stat", swapping)
    assert area.copy(str(src), str(tmp_path / "copy"), 64123)
    monkeypatch.undo()
    copy = tmp_path / "copy"
    assert os.readlink(copy / "npm-cache") == str(secret)
    assert (copy / "state" / "sub" / "kept").read_text() == "its own\n"
    assert sorted(os.listdir(copy / "state")) == ["hardlink", "sub", "tool"]
    assert os.stat(copy / "state" / "hardlink").st_ino == os.stat(secret / "key").st_ino
    assert stat.S_IMODE(os.stat(copy / "state" / "tool").st_mode) == 0o755
    assert not area.copy(str(src / "npm-cache"), str(tmp_path / "none"), 64123)   # a link at the top: nothing
    assert not (tmp_path / "none").exists()


def test_the_area_copied_is_bounded(tmp_path, monkeypatch) -> None:
    """A sparse file costs its server nothing and would cost learn its size
    in full: past MAX_BYTES the copy stops with one clear error."""
    from supervisor.learn import area
    src = tmp_path / "area" / "state"
    src.mkdir(parents=True)
    with open(src / "sparse", "wb") as f:
        f.truncate(2 << 20)
    monkeypatch.setattr(area, "MAX_BYTES", 1 << 20)
    with pytest.raises(OSError, match="learn copies no more of it"):
        area.copy(str(tmp_path / "area"), str(tmp_path / "copy"), 64123)
    assert not (tmp_path / "copy" / "state" / "sparse").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the dynamic user's trace directories are chowned as root")
def test_trace_directories_are_made_in_roots_scratch(lab) -> None:
    """The chown of a trace directory is safe because the scratch directory
    holding it is root's 0755: no server can put a link in its place."""
    from supervisor.learn import learner
    one = learner.Learner(learner.Options(command=["/usr/bin/true"], state_root=str(lab.dir / "state")))
    try:
        st = os.lstat(one.scratch)
        assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)) == (0, 0o755, True)
        trace = os.lstat(one.trace_dir(1))
        assert (trace.st_uid, stat.S_IMODE(trace.st_mode)) == (one.uid, 0o700) and one.uid != 0
        assert os.lstat(one.private).st_uid == 0 and stat.S_IMODE(os.lstat(one.private).st_mode) == 0o700
    finally:
        one.close()
    assert not os.path.exists(one.scratch) and shutil.rmtree.avoids_symlink_attacks   # removed through fds


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_out_directory_opened_with_no_link_on_the_way(tmp_path, monkeypatch, openat2: bool) -> None:
    """destination.open_directory, with openat2 and with its component walk
    (kernels before 5.6): a link anywhere on the way is refused."""
    import errno
    from landlock import syscalls
    from supervisor.learn import destination
    if not openat2:
        def missing(*args: object) -> int:
            raise OSError(errno.ENOSYS, "openat2")
        monkeypatch.setattr(syscalls, "openat2", missing)
    (tmp_path / "real" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "link")
    fd = destination.open_directory(str(tmp_path / "real" / "sub"))
    assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "real" / "sub"))
    os.close(fd)
    for path in (tmp_path / "link" / "sub", tmp_path / "link"):
        with pytest.raises(destination.Refused, match="a symbolic link on the way"):
            destination.open_directory(str(path))
    where = destination.Destination(str(tmp_path / "real" / "sub" / "m.yaml"))
    where.write("text\n")
    where.close()
    assert os.listdir(tmp_path / "real" / "sub") == ["m.yaml"]
