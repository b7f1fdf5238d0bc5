"""Every way a Python user installs the project, each in a fresh venv outside
the checkout, from a clean copy of it, offline from one wheelhouse built per
run (PyYAML and python-prctl compiled once): `pip install .`, `pip install
-e .` (setuptools' import hook), its compat mode, a wheel, `pipx install`
and `uv tool install` of that wheel, and `./scripts/setup`. In each, as root
and as a plain uid, from an unrelated working directory: landlock-exec
(flags and the Go wrapper protocol), check, serve with run (daemon; as
root, of a warm server too) and denials, run (private), learn, and a
proxy's supervisor.start().

All of them run in every mode, no subset: 1.5-2.5 minutes on 2 shared
cores, ~20 s of it the wheelhouse with pip's cache warm (`-m install`
selects this group alone; scripts/bench_installs.py times `run` in each)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.manifests import ids

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "supervisor"))
from test_learn import SERVER  # noqa: E402  (the tiny MCP server learn drives)

pytestmark = [pytest.mark.install,
              pytest.mark.skipif(os.geteuid() != 0, reason="installs as root and runs as a plain uid too")]

USER_UID = 64052   # a uid nothing else uses (64000-64999 are the tests')
SYSTEM_PYTHON = "/usr/bin/python3"   # scripts/setup's, and a new user's
TOOLS = Path(sys.executable).parent   # pipx and uv: the test extras (scripts/setup)
STEP_TIMEOUT = 180
MODES = ["pip install .", "pip install -e .", "pip install -e . compat", "wheel", "pipx", "uv tool",
         "scripts/setup"]
_IGNORED = shutil.ignore_patterns(".venv", ".servers", ".clients", ".git", "__pycache__", "*.egg-info", "build")


@dataclass
class House:
    base: Path
    src: Path          # the clean copy
    wheelhouse: Path
    wheel: Path        # ours, built once
    manifests: Path
    warm: Path         # a manifest keeping a warm server: a root supervisor's only
    server: Path       # learn's tiny MCP server


@dataclass
class Installed:
    bin: Path          # where landlock-supervisor and landlock-exec are
    python: Path       # the interpreter they run on: a proxy's


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", STEP_TIMEOUT)
    return subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def _offline(base: Path, wheelhouse: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "PIPX_", "VIRTUAL_ENV"))}
    return {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            # uv's (pipx uses uv where it finds it)
            "UV_OFFLINE": "1", "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wheelhouse), "UV_PYTHON_DOWNLOADS": "never",
            "UV_CACHE_DIR": str(base / "uv-cache")}


class NoWheelhouse(Exception):
    """No index nor cache to build the wheelhouse from."""


@contextlib.contextmanager
def built_house() -> Iterator[House]:
    """A clean copy, its wheelhouse and what the entry points take, in a
    directory of /var/tmp removed afterwards (scripts/bench_installs.py too;
    not /tmp, where learn refuses to write its --out)."""
    base = Path(tempfile.mkdtemp(prefix="llsv-install-", dir="/var/tmp"))
    os.chmod(base, 0o755)   # (the plain uid runs what is installed here)
    try:
        src = base / "src"
        shutil.copytree(REPO, src, ignore=_IGNORED, symlinks=True)
        wheelhouse = base / "wheelhouse"
        # The one step that reaches an index (or pip's cache): everything
        # the installs below take, our own wheel and the test extras included.
        try:
            r = _run([sys.executable, "-m", "pip", "wheel", "-q", "--use-pep517", "--retries", "2", "--timeout", "60",
                      "-w", str(wheelhouse), f"{src}[test]", "pip", "setuptools", "wheel"], timeout=480)
        except subprocess.TimeoutExpired:
            raise NoWheelhouse("pip wheel took over 480 s (no index reachable?)") from None
        if r.returncode != 0:
            raise NoWheelhouse(f"no index nor cache? {r.stderr.strip()[-300:]}")
        wheel, = wheelhouse.glob("landlock_supervisor-*.whl")
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "echo.yaml").write_text(
            "command: /bin/echo\nargs: [confined]\nclient_args: true\nallow_root: true\npool: 0\n"
            "sandbox: {profiles: [system]}\n")
        warm = base / "warm.yaml"
        warm.write_text("command: /bin/cat\nuser: nobody\nwarm: 1\nsandbox: {profiles: [system]}\n")
        server = base / "srv" / "tiny.py"
        server.parent.mkdir()
        server.write_text(SERVER)
        yield House(base, src, wheelhouse, wheel, manifests, warm, server)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def house() -> Iterator[House]:
    with contextlib.ExitStack() as stack:
        try:
            built = stack.enter_context(built_house())
        except NoWheelhouse as e:
            pytest.skip(f"no wheelhouse could be built: {e}")
        yield built


def install(house: House, mode: str) -> Installed:
    where = house.base / mode.replace(" ", "_").replace("/", "_").replace(".", "dot")
    where.mkdir()
    env = _offline(house.base, house.wheelhouse)
    if mode == "scripts/setup":
        checkout = where / "checkout"
        shutil.copytree(house.src, checkout, symlinks=True)
        _check(_run([str(checkout / "scripts" / "setup")], env=env))
        return Installed(checkout / ".venv" / "bin", checkout / ".venv" / "bin" / "python")
    if mode == "pipx":
        env.update(PIPX_HOME=str(where / "home"), PIPX_BIN_DIR=str(where / "bin"), PIPX_MAN_DIR=str(where / "man"))
        _check(_run([str(TOOLS / "pipx"), "install", "--python", SYSTEM_PYTHON, str(house.wheel)], env=env))
        return _tool(where / "bin")
    if mode == "uv tool":
        env.update(UV_TOOL_DIR=str(where / "tools"), UV_TOOL_BIN_DIR=str(where / "bin"))
        _check(_run([str(TOOLS / "uv"), "tool", "install", "--python", SYSTEM_PYTHON, str(house.wheel)], env=env))
        return _tool(where / "bin")
    venv = where / "venv"
    _check(_run([SYSTEM_PYTHON, "-m", "venv", str(venv)], env=env))
    what = {"pip install .": [str(house.src)],
            "pip install -e .": ["-e", str(house.src)],
            "pip install -e . compat": ["-e", str(house.src), "--config-settings", "editable_mode=compat"],
            "wheel": [str(house.wheel)]}[mode]
    _check(_run([str(venv / "bin" / "pip"), "install", "-q", *what], env=env, cwd=where))
    hooks = list(venv.glob("lib/python3*/site-packages/__editable___*_finder.py"))
    assert bool(hooks) is (mode == "pip install -e ."), hooks   # the import hook, in its mode alone
    return Installed(venv / "bin", venv / "bin" / "python")


def _tool(bin_dir: Path) -> Installed:
    """pipx's and uv's bin directories hold links into the tool's own venv."""
    venv_bin = (bin_dir / "landlock-supervisor").resolve().parent
    return Installed(bin_dir, venv_bin / "python")


def _check(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"{r.args}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


@dataclass
class As:
    """Who runs the entry points: root, or a plain uid with a home of its own."""
    uid: int
    home: Path
    env: dict[str, str]

    def run(self, argv: list[str], env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
        user = {} if self.uid == 0 else {"user": self.uid, "group": self.uid, "extra_groups": []}
        return _run(argv, env={**self.env, **(env or {})}, cwd="/", **user, **kw)

    def popen(self, argv: list[str]) -> subprocess.Popen[str]:
        user = {} if self.uid == 0 else {"user": self.uid, "group": self.uid, "extra_groups": []}
        return subprocess.Popen(argv, env=self.env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, **user)  # type: ignore[call-overload]


def _as(house: House, uid: int) -> As:
    home = Path(tempfile.mkdtemp(prefix=f"home-{uid}-", dir=house.base))
    os.chown(home, uid, uid)
    # An MCP client's environment, as the SDKs start servers: no XDG_RUNTIME_DIR.
    # And the suite's table of dynamic uids (tests/conftest.py): root's learn and
    # supervisors here would otherwise take uids in the host's, for good.
    env = {"HOME": str(home), "LOGNAME": "someone", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "TERM": "dumb",
           "USER": "someone", ids.TABLE_ENV: os.environ[ids.TABLE_ENV]}
    return As(uid, home, env)


def _warm_server(who: As, exe: str, socket: Path) -> int:
    """The pid of the warm server of house.warm, once one is ready."""
    for _ in range(200):
        r = who.run([exe, "--socket", str(socket), "stats"])
        _check(r)
        pids = json.loads(r.stdout)["warm"].get("warm")
        if pids:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError("no warm server ready in 10 s")


def _exercise(inst: Installed, who: As, house: House) -> None:
    exe = str(inst.bin / "landlock-supervisor")
    state = str(who.home / "state")
    # Root's would be the host's /var/lib/landlock-supervisor; a user's is under HOME.
    root_args = ["--allow-root-servers", "--state-root", state] if who.uid == 0 else []
    warm_args = ["--manifests", str(house.warm)] if who.uid == 0 else []
    # landlock-exec, flags and the Go package's wrapper protocol.
    r = who.run([str(inst.bin / "landlock-exec"), "--rox", "/usr,/lib,/lib64", "--ro", "/etc/hostname", "--",
                 "cat", "/etc/hostname"])
    assert r.returncode == 0 and r.stdout == Path("/etc/hostname").read_text(), r
    go_spec = json.dumps({"ReadOnlyPaths": ["/usr", "/lib", "/lib64", "/etc/hostname"]})
    r = who.run([str(inst.bin / "landlock-exec"), "--", "sh", "-c", "cat /etc/hostname && ! cat /etc/passwd"],
                env={"MCPPROXY_SANDBOX_SPEC": go_spec})
    assert r.returncode == 0 and "Permission denied" in r.stderr, r
    # check.
    r = who.run([exe, "check", "--manifests", str(house.manifests)])
    assert r.returncode == 0, r
    # serve, then run and denials against it.
    socket = who.home / "run" / "socket"
    serve = who.popen([exe, "--socket", str(socket), "serve", "--manifests", str(house.manifests), *warm_args,
                       *root_args])
    try:
        r = who.run([exe, "ping", "--socket", str(socket)])   # (it may still be starting: ping waits)
        for _ in range(100):
            if r.returncode == 0 or serve.poll() is not None:
                break
            r = who.run([exe, "ping", "--socket", str(socket)])
        assert r.returncode == 0, (r, serve.poll())
        r = who.run([exe, "run", "--socket", str(socket), "echo", "daemon"])
        assert (r.returncode, r.stdout) == (0, "confined daemon\n"), r
        if warm_args:   # a warm server handed over, relayed by run (supervisor/client/relay.py)
            ready = _warm_server(who, exe, socket)
            r = who.run([exe, "run", "--socket", str(socket), "warm"], input="relayed\n")
            assert (r.returncode, r.stdout) == (0, "relayed\n") and "Traceback" not in r.stderr, r
            assert _warm_server(who, exe, socket) != ready, "run's session was not the warm server"
        r = who.run([exe, "denials", "--socket", str(socket)])
        assert r.returncode == 0 and "Traceback" not in r.stderr, r
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=20)
    assert serve.returncode == 0 and "Traceback" not in err, err
    assert "non-root uid can write" not in err, err   # every install here is root's
    # run, private.
    r = who.run([exe, "run", *root_args, "--manifests", str(house.manifests), "echo", "private"])
    assert (r.returncode, r.stdout) == (0, "confined private\n") and "Traceback" not in r.stderr, r
    # learn: the tiny server under strace, then its manifest validated by confined runs.
    out = who.home / "tiny.yaml"
    r = who.run([exe, "learn", "--state-root", state, "--name", "tiny", "--out", str(out), "--", "/usr/bin/python3",
                 str(house.server)])
    assert r.returncode == 0 and "0 denials" in r.stderr and "Traceback" not in r.stderr, r
    # A proxy's supervisor.start(), on the interpreter the install runs on.
    proxy = ("import os, supervisor, sys\n"
             "r, w = os.pipe()\n"
             f"with supervisor.start({str(house.manifests)!r}, state_root={state!r}, extra_args={root_args[:1]!r})"
             " as client:\n"
             "    with client.spawn('echo', ['proxy'], stdin=0, stdout=w, stderr=2) as child:\n"
             "        os.close(w)\n"
             "        status = child.wait()\n"
             "    print(os.read(r, 100).decode() + str(status), end='')\n")
    r = who.run([str(inst.python), "-c", proxy])
    assert (r.returncode, r.stdout) == (0, "confined proxy\n0"), r


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_every_entry_point_works(house: House, mode: str) -> None:
    inst = install(house, mode)
    # Root and the plain uid at once: two homes, state roots and supervisors,
    # nothing shared but the install and the host (the suite's time: each waits
    # on its processes more than it runs).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for exercised in [pool.submit(_exercise, inst, _as(house, uid), house) for uid in (0, USER_UID)]:
            exercised.result()
