"""`landlock-supervisor learn` on four real MCP servers that have no manifest
in examples/ (issue 13, "the proof"), and on two launched as MCP client
configs usually do, by npx and uvx; then the learned manifests in use.

The servers (scripts/install-servers; examples/servers.md): two node, two
Python; two of them write a file they are given, one in a directory of its
own (sqlite, which creates its journal beside the database), one a single
file (the knowledge graph). Each is learnt once, as a user would do it: a
real tool call, `--write` for what it writes, a HOME of the test's own whose
`.ssh/id_test` anyone may read (only Landlock can deny it).

`npx -y PACKAGE@VERSION` and `uvx PACKAGE==VERSION` start offline, from the
installer's caches copied into their areas of the state root (seed_caches:
where their profiles put the caches, and learn copies the area for its
runs). Offline is what a user would ask for: npx by npm_config_offline in
the user's environment, passed on with `--inherit-env` (the client config
gives it to `run` too); uvx by `--env UV_OFFLINE=1` in the manifest. Then,
per server:

- learn exits 0 and its manifest loads (`check`, and supervisor.manifests.manifest);
- the official Python SDK (.clients; tests/e2e/clients/driver.py) starts
  `landlock-supervisor run --manifests DIR NAME` in private mode as its stdio
  server: initialize, tools/list and the tool calls succeed, confined;
- the secret stays denied: a process confined by the learned Spec (as the
  manifest's own uid) gets EACCES; sqlite, asked to ATTACH it, cannot open it;
- the manifest grants nothing under HOME but the --write path, and neither
  HOME nor a directory holding it;
- it names no path of learn's scratch directory nor of the state root; the
  npx and uvx ones keep their caches where their profiles put them.

The learn runs go in parallel, and one driver process runs the sessions
(the SDK's import is its cost): a module fixture each.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import landlock
from supervisor.manifests import ids
from supervisor.manifests import manifest as manifests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "clients"))  # clienthelpers, any import mode
from clienthelpers import CLIENTS, HERE as CLIENTS_HERE, PATH, SUPERVISOR, clients_problem  # noqa: E402
from e2ehelpers import SERVERS, npx_dir_for, seed_caches, servers_env, servers_problem  # noqa: E402

from supervisor.learn.learner import SCRATCH_PARENT  # noqa: E402

_PROBLEM = servers_problem() or clients_problem()
pytestmark = [
    pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or ""),
    pytest.mark.skipif(os.geteuid() != 0, reason="learn as root gives the server a dynamic uid: run as root "
                                                  "(scripts/test does)"),
    pytest.mark.timeout(180),
]

LEARN_TIMEOUT = 150.0   # all the learn runs, in parallel
PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix")


@dataclass(frozen=True)
class Home:
    """The test's world: a HOME with a secret, the manifests directory learn
    writes to, the state root learn and run share (one table of dynamic
    users: the server runs as the uid it was learnt as, and its files stay
    its own)."""
    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def secret(self) -> Path:
        return self.home / ".ssh" / "id_test"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def env(self) -> dict[str, str]:
        """What a user's shell, or an MCP client, gives its commands; and the
        suite's table of dynamic uids (tests/conftest.py), never the host's."""
        return {"HOME": str(self.home), "LOGNAME": "root", "USER": "root", "PATH": PATH, "SHELL": "/bin/sh",
                "TERM": "xterm-256color", ids.TABLE_ENV: os.environ[ids.TABLE_ENV]}


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]
    text: str                   # what the result's text must hold
    error: bool = False         # isError expected

    def spec(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


@dataclass(frozen=True)
class Target:
    name: str
    server: str                                  # serverInfo.name
    argv: Callable[[Home], list[str]]
    learn_calls: Callable[[Home], list[Call]]    # the session learn drives
    run_calls: Callable[[Home], list[Call]]      # what the SDK client asks through the supervisor
    write: Callable[[Home], Path] | None = None  # --write
    readable: Callable[[Home], Path] = field(default=lambda h: SERVERS)  # a positive control for the probe
    options: tuple[str, ...] = ()                # more of learn's options (--env, --inherit-env)
    env: dict[str, str] = field(default_factory=dict)   # the user's, for learn and in the client config


NODE_MODULES = SERVERS / "node" / "node_modules"
VENV1 = SERVERS / "venv-mcp1" / "bin"
THOUGHT = {"thought": "one step is enough", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": False}
ENTITY = {"name": "learnt", "entityType": "test", "observations": ["written while learning"]}


def _db(h: Home) -> Path:
    return h.home / "data" / "notes.db"


def _graph(h: Home) -> Path:
    return h.home / "kg" / "memory.jsonl"


# Launched by npx (name -> package) and uvx, their caches seeded in their areas.
VERSIONS = servers_env()
NPX = {"sequential-thinking-npx": "@modelcontextprotocol/server-sequential-thinking"}
UVX = ("time-uvx",)
LAUNCHED = {**{n: ("npx", "npm-cache") for n in NPX}, **{n: ("uvx", "uv-cache") for n in UVX}}   # profile, cache


def _cache(h: Home, name: str) -> Path:
    return h.state / "servers" / name / LAUNCHED[name][1]


TARGETS = (
    Target("sequential-thinking", "sequential-thinking-server",
           lambda h: ["node", str(NODE_MODULES / "@modelcontextprotocol/server-sequential-thinking/dist/index.js")],
           lambda h: [Call("sequentialthinking", THOUGHT, '"thoughtHistoryLength": 1')],
           lambda h: [Call("sequentialthinking", THOUGHT, '"thoughtHistoryLength": 1')],
           readable=lambda h: NODE_MODULES / "@modelcontextprotocol/server-sequential-thinking/package.json"),
    Target("knowledge-graph", "@itseasy21/mcp-knowledge-graph",
           lambda h: ["/usr/bin/node", str(NODE_MODULES / "@itseasy21/mcp-knowledge-graph/dist/index.js"),
                      "--memory-path", str(_graph(h))],
           lambda h: [Call("create_entities", {"entities": [ENTITY]}, '"learnt"')],
           lambda h: [Call("read_graph", {}, "written while learning"),
                      Call("add_observations", {"observations": [{"entityName": "learnt",
                                                                   "contents": ["added through the supervisor"]}]},
                           "added through the supervisor")],
           write=_graph, readable=_graph),
    Target("calculator", "calculator",
           lambda h: [str(VENV1 / "mcp-server-calculator")],
           lambda h: [Call("calculate", {"expression": "6*7"}, "42")],
           lambda h: [Call("calculate", {"expression": "2**10 - 24"}, "1000")],
           readable=lambda h: VENV1 / "mcp-server-calculator"),
    Target("sqlite", "sqlite",
           lambda h: [str(VENV1 / "mcp-server-sqlite"), "--db-path", str(_db(h))],
           lambda h: [Call("create_table", {"query": "CREATE TABLE IF NOT EXISTS notes (body TEXT)"}, "Table created"),
                      Call("write_query", {"query": "INSERT INTO notes VALUES ('while learning')"},
                           "'affected_rows': 1"),
                      Call("read_query", {"query": "SELECT body FROM notes"}, "while learning")],
           lambda h: [Call("write_query", {"query": "INSERT INTO notes VALUES ('through the supervisor')"},
                           "'affected_rows': 1"),
                      Call("read_query", {"query": "SELECT body FROM notes ORDER BY rowid"},
                           "'while learning'}, {'body': 'through the supervisor'}]"),
                      # The server opens what it is asked to; the kernel does not let it.
                      Call("write_query", {"query": f"ATTACH DATABASE '{h.secret}' AS stolen"},
                           f"Database error: unable to open database: {h.secret}")],
           write=lambda h: _db(h).parent, readable=_db),
    Target("sequential-thinking-npx", "sequential-thinking-server",
           lambda h: ["npx", "-y", f"{NPX['sequential-thinking-npx']}@{VERSIONS['SEQTHINK_VER']}"],
           lambda h: [Call("sequentialthinking", THOUGHT, '"thoughtHistoryLength": 1')],
           lambda h: [Call("sequentialthinking", THOUGHT, '"thoughtHistoryLength": 1')],
           readable=lambda h: (_cache(h, "sequential-thinking-npx") / "_npx"
                               / npx_dir_for(NPX["sequential-thinking-npx"]).name / "package.json"),
           options=("--inherit-env", "npm_config_offline"), env={"npm_config_offline": "true"}),
    Target("time-uvx", "mcp-time",
           lambda h: [str(SERVERS / "venv" / "bin" / "uvx"), f"mcp-server-time=={VERSIONS['TIME_VER']}",
                      "--local-timezone", "UTC"],
           lambda h: [Call("get_current_time", {"timezone": "Europe/Paris"}, '"timezone": "Europe/Paris"')],
           lambda h: [Call("convert_time", {"source_timezone": "UTC", "time": "12:00",
                                            "target_timezone": "Asia/Tokyo"}, "T21:00:00+09:00")],
           readable=lambda h: _cache(h, "time-uvx") / "CACHEDIR.TAG",
           options=("--env", "UV_OFFLINE=1", "--env", "UV_PYTHON=/usr/bin/python3")),
)
NAMES = [t.name for t in TARGETS]
BY_NAME = {t.name: t for t in TARGETS}


# ---- the world and the learn runs ------------------------------------------------

def build(h: Home) -> None:
    """HOME with a secret anyone may read (DAC lets every uid in: a denial is
    Landlock's), the directory sqlite writes in and the knowledge graph's
    file (both writable by the dynamic uid the server gets)."""
    h.root.chmod(0o755)
    for d in (h.home, h.secret.parent, h.manifests, h.state):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    h.secret.write_text("-----BEGIN OPENSSH PRIVATE KEY----- (not really)\n")
    h.secret.chmod(0o644)
    _db(h).parent.mkdir()
    _db(h).parent.chmod(0o777)
    _graph(h).parent.mkdir()
    _graph(h).parent.chmod(0o755)
    _graph(h).touch()
    _graph(h).chmod(0o666)
    seed_caches(h.state, NPX, UVX)


def learn_argv(h: Home, t: Target) -> list[str]:
    argv = [str(SUPERVISOR), "learn", "--name", t.name, "--out", str(h.manifests / f"{t.name}.yaml"),
            "--state-root", str(h.state)]
    for c in t.learn_calls(h):
        argv += ["--call", c.tool, json.dumps(c.arguments)]
    if t.write is not None:
        argv += ["--write", str(t.write(h))]
    return [*argv, *t.options, "--", *t.argv(h)]


@dataclass
class Learnt:
    argv: list[str]
    status: int | None
    out: str
    err: str
    seconds: float

    def describe(self) -> str:
        return (f"`{' '.join(self.argv)}` exited {self.status} after {self.seconds:.1f} s\n"
                f"--- stdout:\n{self.out[-3000:]}\n--- stderr:\n{self.err[-3000:]}")

    @property
    def summary(self) -> str:
        """What learn printed on stderr: its rounds, grants and refusals."""
        return f"--- learn's summary:\n{self.err[-1500:]}"


@pytest.fixture(scope="module")
def world() -> Iterator[Home]:
    # Not under /tmp: learn refuses to keep a manifest where the server may write.
    h = Home(Path(tempfile.mkdtemp(prefix="llsv-learn-", dir="/var/tmp")))
    try:
        build(h)
        yield h
    finally:
        if not os.environ.get("LLSV_KEEP_E2E"):
            shutil.rmtree(h.root, ignore_errors=True)


@pytest.fixture(scope="module")
def learnt(world: Home) -> dict[str, Learnt]:
    """The learn runs, side by side; each one's outcome."""
    started = {}
    for t in TARGETS:
        argv = learn_argv(world, t)
        out, err = (open(world.root / f"learn-{t.name}.{s}", "w+") for s in ("out", "err"))
        p = subprocess.Popen(argv, env={**world.env(), **t.env}, cwd=str(world.home), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, start_new_session=True)
        started[t.name] = (argv, p, out, err, time.monotonic())
    deadline = time.monotonic() + LEARN_TIMEOUT
    results = {}
    for name, (argv, p, out, err, t0) in started.items():
        try:
            status: int | None = p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            status = None
        seconds = time.monotonic() - t0
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read())
            f.close()
        results[name] = Learnt(argv, status, texts[0], texts[1], seconds)
    return results


def learnt_ok(learnt: dict[str, Learnt], name: str) -> Learnt:
    one = learnt[name]
    assert one.status == 0, one.describe()
    return one


def load(h: Home, name: str) -> manifests.Manifest:
    """The learned manifest as `run` loads it (same environment and state root)."""
    return manifests.load(h.manifests / f"{name}.yaml", env=h.env(), state_root=str(h.state))


@pytest.fixture(scope="module")
def sessions(world: Home, learnt: dict[str, Learnt]) -> dict[str, Any]:
    """One SDK driver process, one session per learned server (those whose
    learn run succeeded): `landlock-supervisor run` in private mode."""
    names = [n for n in NAMES if learnt[n].status == 0]
    spec = {"timeout": 30, "sessions": {
        n: {"command": str(SUPERVISOR),
            "args": ["run", "--manifests", str(world.manifests), "--state-root", str(world.state), n],
            # The SDK passes only the config's env: the suite's uid table with it
            # (as env() gives learn), else the private supervisor takes uids in
            # the host's and runs the server as another uid than learn did.
            "env": {**BY_NAME[n].env, ids.TABLE_ENV: os.environ[ids.TABLE_ENV]}, "roots": None, "calls": [c.spec() for c in BY_NAME[n].run_calls(world)]}
        for n in names}}
    path = world.root / "sessions.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(CLIENTS / "py" / "bin" / "python"), str(CLIENTS_HERE / "driver.py"), str(path)],
                       env=world.env(), cwd=str(world.home), capture_output=True, timeout=30 + 30 * len(names))
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0 and p.stdout.strip(), f"the SDK driver exited {p.returncode}:\n{err[-3000:]}"
    results: dict[str, Any] = json.loads(p.stdout)
    for r in results.values():
        r["client_stderr"] = err[-1500:]
    return results


# ---- learn ------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_learn_exits_0_and_writes_a_manifest(learnt: dict[str, Learnt], world: Home, name: str) -> None:
    one = learnt_ok(learnt, name)
    path = world.manifests / f"{name}.yaml"
    assert path.is_file() and path.read_text().lstrip(), f"{path} missing or empty\n{one.describe()}"


@pytest.mark.parametrize("name", NAMES)
def test_learned_manifest_loads(learnt: dict[str, Learnt], world: Home, name: str) -> None:
    learnt_ok(learnt, name)
    m = load(world, name)
    assert m.name == name and m.dynamic and m.uid is not None, f"{name}: {m}"
    p = subprocess.run([str(SUPERVISOR), "check", "--manifests", str(world.manifests / f"{name}.yaml"),
                        "--state-root", str(world.state)],
                       env=world.env(), capture_output=True, timeout=30)
    assert p.returncode == 0, f"check: {p.returncode}\n{p.stdout.decode()}\n{p.stderr.decode()}"


# ---- the learned manifest at work -------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_learned_server_works_through_the_supervisor(learnt: dict[str, Learnt], sessions: dict[str, Any],
                                                     world: Home, name: str) -> None:
    one = learnt_ok(learnt, name)
    t = BY_NAME[name]
    got = sessions[name]
    where = f"{name} through `run`\n{one.summary}\n--- client stderr:\n{got['client_stderr']}"
    assert "error" not in got, f"{got.get('stage')}: {got['error']}\n{where}"
    assert got["server"] == t.server, f"initialize: {got}\n{where}"
    assert {c.tool for c in t.run_calls(world)} <= set(got["tools"]), f"tools/list: {got['tools']}\n{where}"
    assert len(got["calls"]) == len(t.run_calls(world)), f"calls: {got['calls']}\n{where}"
    for want, call in zip(t.run_calls(world), got["calls"]):
        assert call["isError"] == want.error and want.text in call["text"], \
            f"{want.tool} {want.arguments}: wanted {want.text!r}, got {call}\n{where}"
    assert got["leftover"] == [], f"left running after the client closed: {got['leftover']}"


def test_writers_wrote_where_they_were_told(learnt: dict[str, Learnt], sessions: dict[str, Any],
                                           world: Home) -> None:
    """What the servers wrote, learning and then confined, is in their files
    (learn replays the session in each of its runs: as many rows)."""
    learnt_ok(learnt, "sqlite")
    learnt_ok(learnt, "knowledge-graph")
    with sqlite3.connect(f"file:{_db(world)}?mode=ro", uri=True) as db:
        rows = [r[0] for r in db.execute("SELECT body FROM notes ORDER BY rowid")]
    assert rows[-1] == "through the supervisor" and set(rows[:-1]) == {"while learning"}, rows
    graph = _graph(world).read_text()
    assert "written while learning" in graph and "added through the supervisor" in graph, graph


# ---- what stays denied ------------------------------------------------------------

def confined_open(run_confined: Callable[..., Any], spec: landlock.Spec, path: Path) -> int:
    """0 if a child confined by spec (its uid included) can open path for
    reading, else the errno (the `run_confined` fixture: tests/conftest.py)."""
    r = run_confined(spec, lambda: os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
    assert r.report is not None, f"landlock.apply of {spec} failed: {r.error!r}"
    return int(r.errno)


@pytest.mark.parametrize("name", NAMES)
def test_secret_in_home_stays_denied(learnt: dict[str, Learnt], world: Home, name: str,
                                    run_confined: Callable[..., Any]) -> None:
    one = learnt_ok(learnt, name)
    spec = load(world, name).spec
    control = BY_NAME[name].readable(world)
    got = confined_open(run_confined, spec, control)
    assert got == 0, (f"the learned spec, as uid {spec.user}, does not let {control} be read: "
                      f"{errno.errorcode.get(got, got)} (owner uid {control.stat().st_uid})\n{one.summary}")
    got = confined_open(run_confined, spec, world.secret)
    assert got == errno.EACCES, f"{world.secret}: {errno.errorcode.get(got, got)}, not EACCES\n{one.summary}"


@pytest.mark.parametrize("name", NAMES)
def test_nothing_under_home_but_what_the_server_needs(learnt: dict[str, Learnt], world: Home, name: str) -> None:
    """Neither HOME nor a directory above it; under HOME only the --write path."""
    one = learnt_ok(learnt, name)
    m = load(world, name)
    t = BY_NAME[name]
    home = str(world.home)
    allowed = str(t.write(world)) if t.write else None
    wrong = []
    for cls in PATH_CLASSES:
        for p in getattr(m.spec, cls):
            if home == p or home.startswith(p.rstrip("/") + "/"):
                wrong.append(f"{cls}: {p} (holds HOME)")
            elif p.startswith(home + "/") and not (allowed and (p == allowed or p.startswith(allowed + "/"))):
                wrong.append(f"{cls}: {p}")
    assert not wrong, f"{name} grants under {home}: {wrong}\n{Path(m.source).read_text()}\n{one.summary}"
    assert m.state_dir is None or not m.state_dir.startswith(home + "/"), m.state_dir


# ---- what the manifest holds ------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_no_path_of_the_scratch_nor_of_the_state_root(learnt: dict[str, Learnt], world: Home, name: str) -> None:
    """learn ran the server in its scratch directory, with a copy of its
    area: the manifest says `${STATE_DIR}` and its profiles, never where."""
    one = learnt_ok(learnt, name)
    text = (world.manifests / f"{name}.yaml").read_text()
    for where in (f"{SCRATCH_PARENT}/landlock-learn-", str(world.state)):
        assert where not in text, f"{name}'s manifest names {where}:\n{text}\n{one.summary}"


@pytest.mark.parametrize("name", LAUNCHED)
def test_npx_and_uvx_keep_their_caches_where_their_profiles_put_them(learnt: dict[str, Learnt], world: Home,
                                                                     name: str) -> None:
    one = learnt_ok(learnt, name)
    text = (world.manifests / f"{name}.yaml").read_text()
    launcher = LAUNCHED[name][0]
    assert launcher in yaml.safe_load(text)["sandbox"]["profiles"], f"no {launcher} profile:\n{text}"
    cache = str(_cache(world, name))
    assert cache in load(world, name).spec.read_write, f"{cache} not read_write (its profile's)\n{one.summary}"


@pytest.mark.parametrize("name", NAMES)
def test_learn_fits_its_share_of_the_budget(learnt: dict[str, Learnt], name: str) -> None:
    """The learn e2e tests fit in 3 minutes: the six runs, side by side, in
    well under that (the rest is one SDK session each)."""
    one = learnt_ok(learnt, name)
    assert one.seconds < 120, one.describe()
