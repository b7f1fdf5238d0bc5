"""`landlock-supervisor learn` on a small MCP server written here: the
manifest it writes loads, works through a private supervisor, grants the
writes learning allowed and no other."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from supervisor import ids
from supervisor import manifest as manifests
from supervisor.learn import session
from supervisor.private import start

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


def save(path: Path) -> list[str]:
    return ["--call", "save", json.dumps({"path": str(path), "text": "hi"})]


def test_learns_a_manifest_that_serves_the_session(lab, tiny) -> None:
    server, out = tiny
    result = learn(lab, "--name", "tiny", "--out", str(lab.dir / "tiny.yaml"), "--write", str(out),
                   *save(out / "a.txt"), "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    assert "learn: tiny: 2 runs" in result.stderr and "0 denials" in result.stderr
    text = (lab.dir / "tiny.yaml").read_text()
    loaded = manifests.load(lab.dir / "tiny.yaml", state_root=str(lab.dir / "state"))
    assert loaded.spec.read_write_noexec[:1] == (str(out),) or str(out) in loaded.spec.read_write_noexec
    assert "/root" not in text.replace('"/root/', "") and "/home" not in text
    assert f'"{server.parent}"' in text   # the script's directory, read only
    # The learned manifest, served: the call works, a write elsewhere is denied.
    with start([str(lab.dir / "tiny.yaml")], state_root=str(lab.dir / "state"), only="tiny") as client:
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
    assert [o.ok for o in outcomes] == [True] * 4
    assert outcomes[2].detail == "" and "Permission denied" in outcomes[3].detail
    assert (out / "b.txt").read_text() == "x" and not (lab.dir / "elsewhere.txt").exists()


def test_a_write_outside_what_learning_allowed_is_proposed_not_granted(lab, tiny) -> None:
    server, _ = tiny
    target = Path(tempfile.mkdtemp(dir="/var/tmp"))   # not under /tmp, which learning lets it write
    os.chmod(target, 0o777)
    try:
        result = learn(lab, "--name", "tiny2", *save(target / "x.txt"), "--", "/usr/bin/python3", str(server))
        assert not (target / "x.txt").exists()
    finally:
        shutil.rmtree(target)
    assert result.returncode == 0, result.stderr
    assert f"learn again with --write {target / 'x.txt'}" in result.stderr
    sandbox = result.stdout.split("sandbox:")[1].split("# Writes it attempted")[0]
    assert str(target) not in sandbox
    assert f"#   {target / 'x.txt'}: " in result.stdout


def test_a_relative_state_root_is_the_one_learn_was_given(lab, tiny) -> None:
    """`--state-root state` once made learn walk up from "state" to / for
    ever (its exclusion's ancestors), growing until the OOM killer came."""
    server, _ = tiny
    result = learn(lab, "--state-root", "state", "--name", "tiny", "--out", str(lab.dir / "rel.yaml"),
                   "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    loaded = manifests.load(lab.dir / "rel.yaml", state_root=str(lab.dir / "state"))
    assert loaded.uid == ids.Table(str(lab.dir / "state")).assign(["tiny"])["tiny"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a dynamic uid is a root supervisor's")
def test_learn_runs_the_server_as_the_uid_serve_will_give_it(lab, tiny) -> None:
    """learn takes the dynamic uid in the host's table under the real state
    root, and its scratch supervisor runs the server as that uid: no key of
    the scratch state root is recorded (it would hold a uid for good)."""
    server, out = tiny
    result = learn(lab, "--name", "tiny", "--out", str(lab.dir / "tiny.yaml"), "--write", str(out),
                   *save(out / "mine.txt"), "--", "/usr/bin/python3", str(server))
    assert result.returncode == 0, result.stderr
    uid = ids.Table(str(lab.dir / "state")).names()["tiny"]
    assert (out / "mine.txt").stat().st_uid == uid
    table = Path(os.environ[ids.TABLE_ENV]).read_text()
    assert "landlock-learn-" not in table, table


@pytest.mark.parametrize("args,message", [
    (["--write", "/", "--", "/usr/bin/true"], "never /"),
    (["--write", "/root", "--", "/usr/bin/true"], "a home directory, or a directory holding one"),
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


def test_a_plain_user_learns_as_itself_never_as_root(lab, tiny) -> None:
    server, out = tiny
    uid = 64150
    home = lab.dir / "userhome"
    home.mkdir()
    os.chown(home, uid, uid)
    os.chown(lab.dir, uid, uid)   # its state root and manifest go here
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "learn", "--state-root", str(lab.dir / "ustate"), "--name", "tiny",
         "--out", str(lab.dir / "u.yaml"), "--write", str(out), *save(out / "u.txt"), "--", "/usr/bin/python3",
         str(server)],
        capture_output=True, text=True, timeout=50, cwd=lab.dir, env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        user=uid, group=uid, extra_groups=[])
    assert result.returncode == 0, result.stderr
    text = (lab.dir / "u.yaml").read_text()
    assert "user: dynamic" not in text and f"uid {uid}" in text
    assert (out / "u.txt").stat().st_uid == uid   # the learning run wrote it as that user, not as root
