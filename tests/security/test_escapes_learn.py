"""`landlock-supervisor learn` learning a hostile server (issue 19).

learn runs outside every sandbox (as the user, or as root) while the server
it learns is an attacker (tests/security/learnt_server.py, stdlib, offline).
Each case is learnt as a dedicated unprivileged uid (64100: the server runs
as that uid too) and as root (the server runs as its dynamic uid). Rows:
docs/security.md (escape catalogue).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sechelpers import HERE, IDENTITIES, Identity, case

from supervisor.manifests import manifest as manifests
from supervisor.manifests import document as manifest_yaml

pytestmark = [pytest.mark.enforcement, pytest.mark.skipif(not os.path.exists("/usr/bin/strace"),
                                                          reason="learn needs strace")]
LEARN_TIMEOUT = 90
PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec")


@dataclass
class World:
    """What the learning run meets: the --write directory (work), a
    directory outside every write (outside, /var/tmp), files to read under
    hostile names (readable), a canary no grant may reach, and the file a
    planted link aims at (victim: the user's own, or root's)."""
    ident: Identity
    base: Path
    home: Path
    state: Path
    work: Path
    outside: Path
    readable: Path
    canary: Path
    victim: Path
    server: Path

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.home)}

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        who = {"user": self.ident.uid, "group": self.ident.uid, "extra_groups": []} if self.ident.uid else {}
        return subprocess.run(argv, capture_output=True, text=True, timeout=LEARN_TIMEOUT, cwd=self.base,
                              env=self.env(), stdin=subprocess.DEVNULL, **who)


def _dir(path: Path, mode: int, uid: int = 0) -> Path:
    path.mkdir(parents=True)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


@pytest.fixture(params=IDENTITIES, ids=[i.name for i in IDENTITIES])
def world(lab, request) -> Iterator[World]:
    ident: Identity = request.param
    base = _dir(lab.dir / "learn", 0o755)
    home = _dir(base / "home", 0o700, ident.uid)
    victim = (home if ident.uid else _dir(base / "rootonly", 0o700)) / ".profile"
    victim.write_text("# the user's profile\n")
    os.chown(victim, ident.uid, ident.uid)
    os.chmod(victim, 0o600)
    srv = _dir(base / "srv", 0o755)
    shutil.copy(HERE / "learnt_server.py", srv / "learnt_server.py")
    os.chmod(srv / "learnt_server.py", 0o644)
    canary = _dir(base / "canary", 0o755)
    (canary / "secret").write_text("canary\n")
    os.chmod(canary / "secret", 0o644)
    outside = Path(tempfile.mkdtemp(prefix="llsv-learn-outside-", dir="/var/tmp"))
    os.chmod(outside, 0o777)
    try:
        yield World(ident, base, home, _dir(base / "state", 0o755, ident.uid), _dir(base / "work", 0o777),
                    outside, _dir(base / "readable", 0o755), canary, victim, srv / "learnt_server.py")
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def learn_argv(w: World, out: Path, arguments: dict[str, object]) -> list[str]:
    return [sys.executable, "-m", "supervisor", "learn", "--state-root", str(w.state), "--name", "hostile",
            "--out", str(out), "--write", str(w.work), "--rounds", "3", "--timeout", "20",
            "--call", "attack", json.dumps(arguments), "--", "/usr/bin/python3", "-I", "-B", str(w.server)]


@case("learn-out-link")
@pytest.mark.timeout(LEARN_TIMEOUT + 30)
def test_learn_never_writes_through_a_link_the_server_planted(world: World) -> None:
    """The README's own example: --out inside the --write directory. The
    server plants `<out>.<pid>.tmp` -> the victim for each of its ancestors'
    pids (learn's among them)."""
    before = world.victim.read_text()
    out = world.work / "my.yaml"
    result = world.run(learn_argv(world, out, {"out": str(out), "victim": str(world.victim)}))
    assert world.victim.read_text() == before, f"learn wrote through the link:\n{world.victim.read_text()}"
    assert not os.path.islink(out)
    # Refused before the first round: --out lies in a grant the server may write.
    assert result.returncode == 2, result.stderr
    assert f"--out {out}" in result.stderr and str(world.work) in result.stderr, result.stderr
    assert not out.exists() and not [p for p in world.work.iterdir() if p.name.startswith("my.yaml.")]


# Names a file system takes and YAML or a terminal does not: line breaks of
# every kind either honours, YAML's indicators, terminal escapes, bytes
# that are no UTF-8, and a line that, were it YAML, would grant the canary.
def _payload(canary: Path, br: str) -> bytes:
    return f'x{br}    - "{str(canary).replace("/", chr(92) + "x2f")}"{br}#'.encode()


def hostile_names(canary: Path) -> list[bytes]:
    return [b"nl\nx", b"cr\rx", "nel\u0085x".encode(), "ls\u2028x".encode(), "ps\u2029x".encode(), b'dq"x',
            b"sq'x", b"#x", b"c: x", b"- x", b"{x", b"*x", b"&x", b"${HOME}x", b"\x1b[31mesc\x1b]0;t\x07", b"bad\xffutf8",
            *(_payload(canary, br) for br in ("\n", "\r", "\u0085", "\u2028", "\u2029"))]


# What learn itself does (learn/command.py's run), the proposal shown: the
# text it writes, the grants it proposed, the summary it prints.
DRIVER = r"""
import json, sys
from supervisor.learn import learner
from supervisor.learn.session import requests
a = json.loads(sys.argv[1])
opts = learner.Options(command=a["command"], name="hostile", session=requests([("attack", a["call"])], None),
                       writes=[a["work"]], state_root=a["state"], rounds=3, timeout=20)
one = learner.Learner(opts)
try:
    text, p, validated = one.learn()
    summary = learner.report.summary(one, p, validated, 0.0)
finally:
    one.close()
print(json.dumps({"text": text, "grants": [[g.cls, g.path] for g in p.grants], "connect_unix": list(p.connect_unix),
                  "refused": list(p.refused), "summary": summary}))
"""


def _printable(line: str) -> bool:
    return all(c.isprintable() for c in line)


@case("learn-hostile-names")
@pytest.mark.timeout(LEARN_TIMEOUT + 30)
def test_file_names_the_server_chose_stay_one_token(world: World) -> None:
    names = hostile_names(world.canary)
    for name in names:
        d = os.path.join(os.fsencode(world.readable), name)
        os.mkdir(d, 0o755)
        with open(os.path.join(d, b"f"), "wb") as f:
            f.write(b"read me\n")
        os.chmod(os.path.join(d, b"f"), 0o644)
    call = {"names": [n.hex() for n in names], "work": str(world.work), "outside": str(world.outside),
            "readable": str(world.readable), "comm": "\n- x\x1b[2J\u0085#".encode().hex()}
    result = world.run([sys.executable, "-c", DRIVER, json.dumps(
        {"command": ["/usr/bin/python3", "-I", "-B", str(world.server)], "call": json.dumps(call),
         "work": str(world.work), "state": str(world.state)})])
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout)
    text, summary = got["text"], got["summary"]
    # Every line of the manifest and of the summary is one line, printable.
    bad = [line for line in text.split("\n") if not _printable(line)]
    assert not bad, f"raw control characters or line breaks in the manifest: {bad[:5]}"
    bad = [line for line in summary if not _printable(line)]
    assert not bad, f"raw control characters in learn's summary: {bad[:5]}"
    # Its reply, a failed call's message, is quoted escaped in the summary and the manifest's header.
    quoted = 'tools/call attack (request 3, tool error): "\\x1b]0;owned\\x07\\x1b[2J\\nlearn: validated\\u2028"'
    assert f"  FAILED: {quoted}" in summary and f"# FAILED in the last run: {quoted}" in text, summary
    # The manifest says exactly what was proposed, and no name added a grant.
    doc = manifest_yaml.parse("learnt", text.encode())
    proposed: dict[str, list[str]] = {}
    for cls, path in got["grants"]:
        proposed.setdefault(cls, []).append(path)
    assert {cls: doc["sandbox"].get(cls) for cls in PATH_CLASSES if cls in doc["sandbox"]} == proposed
    assert (doc["sandbox"].get("connect_unix") or []) == got["connect_unix"]
    granted = [p for paths in proposed.values() for p in paths]
    assert not [p for p in granted if p == str(world.canary) or p.startswith(str(world.canary) + "/")], granted
    written = world.base / "hostile.yaml"
    written.write_text(text)
    spec = manifests.load(written, state_root=str(world.state), as_root=world.ident.uid == 0).spec
    assert not [r for r in spec.path_rules if str(world.canary) in r[1]], spec.path_rules
    # Each name the server read under is granted as itself, or refused and listed.
    for name in names:
        path = os.path.join(str(world.readable), os.fsdecode(name))
        try:
            nameable = b"${" not in name   # (the loader would expand it)
            name.decode()
        except UnicodeDecodeError:
            nameable = False
        if not nameable:
            assert path not in granted and any(path in key for key in got["refused"]), got["refused"]
            continue
        assert path in granted, f"{name!r}: not granted as itself: {granted}"
    if os.environ.get("LLSV_SHOW"):
        print(text, *summary, sep="\n")
