"""Every failure is one line: each subcommand through a table of bad input,
bad environment and bad peers ends with one `landlock-supervisor: ...` line
naming what and where, a documented exit status (`landlock-supervisor
--help`: 1 the environment or the supervisor, 2 usage or input) and never
a traceback. A supervisor's own log lines (`landlock-supervisor[PID]: `)
may come before a serve's line; they are not its failure.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from svhelpers import PYTHON, REPO

USER_UID = 64051   # a uid nothing else uses (64000-64999 are the tests')
EXIT_FAILED, EXIT_USAGE = 1, 2
GARBAGE = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.recv(65536); c.send(sys.argv[2].encode())
    except OSError:
        pass
    c.close()
"""
# A peer that is no supervisor (or one of another version): what it sends to every request.
REPLIES = {"not-json": "\xff not json", "not-an-object": "[1]", "no-version": '{"event": "pong"}',
           "described-without-names": '{"v": 1, "event": "described"}'}


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "home"
        self.manifests = base / "manifests"
        for d in (self.home, self.manifests):
            d.mkdir(mode=0o755)
        os.chown(self.home, USER_UID, USER_UID)
        (self.manifests / "echo.yaml").write_text("command: /bin/echo\nuser: dynamic\n")
        (self.manifests / "broken.yaml").write_text("command: /bin/echo\nuser: dynamic\nargz: [x]\n")
        (self.manifests / "syntax.yaml").write_text("command: [unclosed\n")
        self.dead = base / "dead.sock"   # a killed supervisor's socket: nobody listens
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(str(self.dead))
        s.close()
        os.chmod(self.dead, 0o666)
        self.peers: list[subprocess.Popen[str]] = []

    def garbage(self, reply: str) -> Path:
        path = self.base / f"garbage-{len(self.peers)}.sock"
        proc = subprocess.Popen([PYTHON, "-c", GARBAGE, str(path), reply], stdout=subprocess.PIPE, text=True)
        self.peers.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.chmod(path, 0o666)
        return path

    def close(self) -> None:
        for proc in self.peers:
            proc.kill()
            proc.wait()


@pytest.fixture
def world() -> Iterator[World]:
    # (pytest's tmp_path is 0700: the plain uid reads here; not under /tmp, where learn refuses its --out)
    base = Path(tempfile.mkdtemp(prefix="llsv-oneline-", dir="/var/tmp"))
    base.chmod(0o755)
    w = World(base)
    try:
        yield w
    finally:
        w.close()
        shutil.rmtree(base, ignore_errors=True)


def _run(argv: list[str], uid: int, home: Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    base = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LOGNAME": "someone", "USER": "someone"}
    return subprocess.run([PYTHON, "-m", "supervisor", *argv], cwd=REPO, env={**base, **(env or {})},
                          user=uid or None, group=uid or None, extra_groups=None if uid == 0 else [],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)


def _one_line(r: subprocess.CompletedProcess[str], status: int, *parts: str) -> None:
    assert "Traceback" not in r.stderr, r.stderr
    ours = [line for line in r.stderr.splitlines() if line.startswith("landlock-supervisor:")]
    others = [line for line in r.stderr.splitlines()
              if not line.startswith(("landlock-supervisor:", "landlock-supervisor["))]
    assert len(ours) == 1 and not others, r.stderr
    assert r.returncode == status, r
    for part in parts:
        assert part in ours[0], (part, ours[0])


# (id, uid (0: root; else the plain user), argv (with {W}: the world's directory, {M}: its
# manifests, {DEAD}: a killed supervisor's socket, {G:reply}: a peer sending that reply), env,
# exit status, what the line names)
CASES: list[tuple[str, int, list[str], dict[str, str], int, list[str]]] = [
    # serve: paths, manifests, state
    ("serve-socket-unwritable", USER_UID, ["--socket", "/var/lib/llsv-nowhere/sock", "serve", "--manifests",
                                           "{M}/echo.yaml"], {}, EXIT_FAILED,
     ["not starting", "/var/lib/llsv-nowhere", "Permission denied"]),
    ("serve-state-root-unwritable", USER_UID, ["--socket", "{W}/home/s", "serve", "--manifests", "{M}/echo.yaml",
                                               "--state-root", "/var/lib/llsv-nowhere"], {}, EXIT_FAILED,
     ["not starting", "/var/lib/llsv-nowhere", "Permission denied"]),
    ("serve-manifests-missing", 0, ["--socket", "{W}/s", "serve", "--manifests", "{W}/nothing"], {}, EXIT_USAGE,
     ["not starting", "{W}/nothing: no such file or directory"]),
    ("serve-only-broken", 0, ["--socket", "{W}/s", "serve", "--manifests", "{M}/broken.yaml", "--state-root",
                              "{W}/state"], {}, EXIT_USAGE, ["not starting", "{M}/broken.yaml: argz: unknown key"]),
    # run: private mode's manifests and names
    ("run-private-unknown-name", 0, ["run", "--manifests", "{M}", "--state-root", "{W}/state", "ecko"], {},
     EXIT_USAGE, ["no manifest named 'ecko'", "did you mean 'echo'?", "there are: broken, echo"]),
    ("run-private-broken", 0, ["run", "--manifests", "{M}", "--state-root", "{W}/state", "broken"], {}, EXIT_USAGE,
     ["{M}/broken.yaml: argz: unknown key"]),
    ("run-private-syntax", 0, ["run", "--manifests", "{M}", "--state-root", "{W}/state", "syntax"], {}, EXIT_USAGE,
     ["{M}/syntax.yaml: not valid YAML"]),
    ("run-private-missing", 0, ["run", "--manifests", "{W}/nothing", "echo"], {}, EXIT_USAGE,
     ["{W}/nothing: no such file or directory"]),
    # (without a runtime directory serve and run meet at the fallback: tests/supervisor/test_socket_paths.py)
    ("run-no-supervisor", USER_UID, ["run", "echo"], {}, 1,
     ["cannot reach the supervisor at", f"/tmp/landlock-supervisor-{USER_UID}/socket"]),
    # check
    ("check-missing", 0, ["check", "{W}/nothing.yaml"], {}, EXIT_USAGE, ["1 manifest(s) do not load",
                                                                        "{W}/nothing.yaml"]),
    ("check-broken", USER_UID, ["check", "--manifests", "{M}"], {}, EXIT_USAGE,
     ["2 manifest(s) do not load", "{M}/broken.yaml", "{M}/syntax.yaml"]),
    # learn: what it is given
    ("learn-no-command", 0, ["learn", "--out", "{W}/x.yaml", "--", "{W}/no-such-server"], {}, EXIT_USAGE,
     ["{W}/no-such-server"]),
    ("learn-session-missing", 0, ["learn", "--out", "{W}/x.yaml", "--session", "{W}/nothing.jsonl", "--",
                                  "/bin/true"], {}, EXIT_USAGE, ["{W}/nothing.jsonl"]),
]
# Every client command against a killed supervisor, and against peers that are no supervisor.
for _cmd in (["ping"], ["list"], ["stats"], ["denials"], ["denials", "--follow"], ["run", "echo"]):
    _id = "-".join(c.strip("-") for c in _cmd)
    CASES.append((f"{_id}-killed-supervisor", USER_UID, ["--socket", "{DEAD}", *_cmd], {}, EXIT_FAILED,
                  ["cannot reach the supervisor at {DEAD}"]))
    for _name, _reply in REPLIES.items():
        if _name == "described-without-names" and _cmd != ["run", "echo"]:
            continue   # (a reply only `run` reads)
        CASES.append((f"{_id}-{_name}", 0, ["--socket", f"{{G:{_name}}}", *_cmd], {}, EXIT_FAILED,
                      ["the supervisor at", "sent a malformed reply"]))


def _fill(text: str, world: World) -> str:
    if text.startswith("{G:"):
        return str(world.garbage(REPLIES[text[3:-1]]))
    return (text.replace("{M}", str(world.manifests)).replace("{W}", str(world.base))
            .replace("{DEAD}", str(world.dead)))


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="switches to a plain uid")
@pytest.mark.parametrize("uid, argv, env, status, parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_failure_is_one_line(world: World, uid: int, argv: list[str], env: dict[str, str], status: int,
                                   parts: list[str]) -> None:
    r = _run([_fill(a, world) for a in argv], uid, world.home, env)
    _one_line(r, status, *(_fill(p, world) for p in parts))


@pytest.mark.timeout(60)
def test_run_of_an_unknown_name_lists_the_names(lab) -> None:
    """Against a daemon: the names it serves and the nearest one."""
    lab.stock()
    sv = lab.start()
    r = subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(sv.socket_path), "run", "slep", "1"],
                       cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    _one_line(r, EXIT_USAGE, "no manifest named 'slep' (did you mean 'sleep'?); there are: ")
    assert "cat, false, sh, sleep, true" in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_run_when_the_supervisor_is_killed(lab) -> None:
    """A supervisor killed under a running session: `run` ends with one line."""
    lab.stock()
    sv = lab.start()
    proc = subprocess.Popen([PYTHON, "-m", "supervisor", "--socket", str(sv.socket_path), "run", "sleep", "30"],
                            cwd=REPO, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        for _ in range(100):
            pids = [c["pid"] for c in sv.client.list()["children"] if c["manifest"] == "sleep"]
            if pids:
                break
            time.sleep(0.1)
        sv.proc.send_signal(signal.SIGKILL)
        sv.proc.wait(10)
        sv.stopped = True   # (killed: its socket stays, as a crashed supervisor's does)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        for pid in pids:   # (the server, should it outlive its supervisor)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "", err)
    _one_line(r, EXIT_FAILED, f"sleep: lost the supervisor at {sv.socket_path} while it ran")


def test_exit_statuses_are_documented() -> None:
    from supervisor import cli
    text = " ".join(subprocess.run([sys.executable, "-m", "supervisor", "--help"], cwd=REPO, capture_output=True,
                                   text=True, timeout=30).stdout.split())
    assert (cli.EXIT_USAGE, EXIT_USAGE) == (2, 2)
    for status in ("1 the environment or the supervisor failed", "2 usage or input", "3 confinement unavailable",
                   "126 the server could not be started"):
        assert status in text, text
