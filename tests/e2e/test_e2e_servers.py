"""The five real MCP servers of examples/, each in its two launches, through a
real supervisor: they work confined, and the kernel stops what their
manifests do not grant even where the server itself would go ahead."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from supervisor.manifests import ids
from supervisor.manifests import manifest as manifests

sys.path.insert(0, os.path.dirname(__file__))
from e2ehelpers import ALL, EXAMPLES, SECRET_MARKER, Server, World  # noqa: E402

SERVER_INFO = {"filesystem": "secure-filesystem-server", "memory": "memory-server",
               "everything": "mcp-servers/everything", "time": "mcp-time", "git": "mcp-git"}
SOME_TOOLS = {"filesystem": {"read_text_file", "write_file", "list_allowed_directories"},
              "memory": {"create_entities", "read_graph"},
              "everything": {"echo", "get-env", "gzip-file-as-resource"},
              "time": {"get_current_time", "convert_time"},
              "git": {"git_status", "git_log", "git_commit"}}


def base(name: str) -> str:
    return name.split("-")[0]


def server(world: World, name: str) -> Server:
    """The session's shared server NAME. The filesystem server is also told,
    by client arguments, that `secret` is one of its directories: the manifest
    does not grant it."""
    return world.server(name, [str(world.secret)] if name == "filesystem" else [])


def manifest_of(world: World, name: str) -> manifests.Manifest:
    """The example manifest as the supervisor loaded it (same environment)."""
    return manifests.load(EXAMPLES / f"{name}.yaml", env=world.env(), state_root=str(world.state))


def spec_of(world: World, name: str) -> Any:
    return manifest_of(world, name).spec


def check(condition: bool, s: Server, message: str) -> None:
    assert condition, f"{s.name}: {message}\n{s.stderr()}"


# ---- every example server works -------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_initialize(world: World, name: str) -> None:
    s = server(world, name)
    check(s.info.get("serverInfo", {}).get("name") == SERVER_INFO[base(name)], s, f"initialize: {s.info}")
    check(s.info.get("protocolVersion") == "2024-11-05", s, f"initialize: {s.info}")
    check(s.child.report.abi > 0 and s.child.report.capabilities_dropped, s, f"report: {s.child.report}")


@pytest.mark.parametrize("name", ALL)
def test_tools_list(world: World, name: str) -> None:
    s = server(world, name)
    tools = set(s.tools())
    check(SOME_TOOLS[base(name)] <= tools, s, f"tools/list: {sorted(tools)}")


@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "filesystem"])
def test_filesystem_reads_a_granted_file(world: World, name: str) -> None:
    s = server(world, name)
    error, text = s.call("read_text_file", {"path": str(world.projects / "notes.txt")})
    check(not error and text == "hello from an allowed project\n", s, f"read_text_file: {text!r}")


@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "memory"])
def test_memory_keeps_its_graph_in_its_state_dir(world: World, name: str) -> None:
    s = server(world, name)
    entity = {"name": f"e2e-{name}", "entityType": "test", "observations": ["created through the supervisor"]}
    error, text = s.call("create_entities", {"entities": [entity]})
    check(not error, s, f"create_entities: {text}")
    error, text = s.call("read_graph")
    check(not error and f"e2e-{name}" in text, s, f"read_graph: {text}")
    # The file is where the manifest says, in this server's own state dir.
    stored = world.state_dir(name) / "memory.jsonl"
    check(stored.exists() and f"e2e-{name}" in stored.read_text(), s, f"{stored} lacks the entity")
    for other in ("memory", "memory-npx"):
        if other != name and (world.state_dir(other) / "memory.jsonl").exists():
            check(f"e2e-{name}" not in (world.state_dir(other) / "memory.jsonl").read_text(), s,
                  f"{other}'s memory holds {name}'s entity")


@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "everything"])
def test_everything_echo(world: World, name: str) -> None:
    s = server(world, name)
    error, text = s.call("echo", {"message": "through the supervisor"})
    check(not error and text == "Echo: through the supervisor", s, f"echo: {text!r}")


@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "time"])
def test_time_get_current_time(world: World, name: str) -> None:
    s = server(world, name)
    error, text = s.call("get_current_time", {"timezone": "UTC"})
    check(not error and json.loads(text)["timezone"] == "UTC", s, f"get_current_time: {text!r}")


@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "git"])
def test_git_status(world: World, name: str) -> None:
    s = server(world, name)
    error, text = s.call("git_status", {"repo_path": str(world.repo)})
    check(not error and "On branch main" in text, s, f"git_status: {text!r}")


# ---- the server's environment is the manifest's -----------------------------

@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "everything"])
def test_environment_holds_none_of_the_supervisors(world: World, name: str) -> None:
    s = server(world, name)
    error, text = s.call("get-env")
    check(not error, s, f"get-env: {text}")
    env = json.loads(text)
    check(SECRET_MARKER not in text and "SUPERVISOR_SECRET" not in env, s, f"the marker leaked: {sorted(env)}")
    # Nothing of the supervisor's environment but what the manifest inherits.
    inherited = set(manifest_of(world, name).inherit_env)
    supervisor_env = world.env()
    leaked = sorted(k for k, v in env.items() if supervisor_env.get(k) == v and k not in inherited)
    check(not leaked, s, f"supervisor variables leaked: {leaked}")
    if name == "everything":
        # node runs the server itself: exactly inherit_env [PATH] + env {NODE_ENV}
        # (+ HOME, USER, LOGNAME of a dynamic user under a root supervisor)
        extra = {"HOME", "USER", "LOGNAME"} if os.geteuid() == 0 else set()
        check(set(env) == {"PATH", "NODE_ENV"} | extra, s, f"environment: {env}")
    else:
        # npm adds its npm_* variables; HOME is the state dir (the npx profile)
        check(env.get("HOME") == str(world.state_dir(name)) and env.get("npm_config_offline") == "true",
              s, f"environment: {env}")


# ---- the kernel says no -------------------------------------------------------

@pytest.mark.enforcement
def test_filesystem_told_a_directory_the_manifest_does_not_grant(world: World) -> None:
    s = server(world, "filesystem")
    error, text = s.call("list_allowed_directories")
    check(str(world.secret) in text, s, f"the server was to believe it may use {world.secret}: {text}")
    path = world.secret / "id_ed25519"
    error, text = s.call("read_text_file", {"path": str(path)})
    check(error and f"EACCES: permission denied, open '{path}'" in text, s, f"read_text_file: {text!r}")
    error, text = s.call("write_file", {"path": str(world.secret / "planted"), "content": "x"})
    check(error and "EACCES" in text and not (world.secret / "planted").exists(), s, f"write_file: {text!r}")
    error, text = s.call("list_directory", {"path": str(world.secret)})
    check(error and "EACCES" in text, s, f"list_directory: {text!r}")


@pytest.mark.enforcement
def test_filesystem_npx_narrowed_to_one_project(world: World) -> None:
    """A client narrows the grant to projects/sub: the server still serves all
    of projects (its argument), the kernel only sub."""
    rw = [p for p in spec_of(world, "filesystem-npx").read_write_noexec if p != str(world.projects)]
    narrow = {"read_write_noexec": [*rw, str(world.projects / "sub")]}
    with world.spawn("filesystem-npx", narrow=narrow) as s:
        s.initialize()
        error, text = s.call("read_text_file", {"path": str(world.projects / "sub" / "inner.txt")})
        check(not error and text == "inside the narrowed grant\n", s, f"read_text_file sub: {text!r}")
        path = world.projects / "notes.txt"
        error, text = s.call("read_text_file", {"path": str(path)})
        check(error and f"EACCES: permission denied, open '{path}'" in text, s, f"read_text_file: {text!r}")


@pytest.mark.enforcement
def test_memory_cannot_write_outside_its_state_dir(world: World) -> None:
    """tests/e2e/manifests/memory-outside.yaml: memory.yaml with MEMORY_FILE_PATH outside."""
    with world.spawn("memory-outside") as s:
        s.initialize()
        error, text = s.call("create_entities", {"entities": [
            {"name": "escapee", "entityType": "test", "observations": []}]})
        check(error and "EACCES: permission denied" in text, s, f"create_entities: {text!r}")
    assert not (world.outside / "memory.jsonl").exists()


@pytest.mark.enforcement
def test_memory_npx_without_its_state_dir_cannot_write(world: World) -> None:
    """Narrowed to no writable state dir, the same server's writes fail: it
    is the manifest's grant, nothing else, that lets memory-npx write."""
    state = str(world.state_dir("memory-npx"))
    rw = [p for p in spec_of(world, "memory-npx").read_write_noexec if p != state]
    with world.spawn("memory-npx", narrow={"read_write_noexec": rw}) as s:
        s.initialize()
        error, text = s.call("create_entities", {"entities": [
            {"name": "unwritable", "entityType": "test", "observations": []}]})
        check(error and "EACCES: permission denied" in text, s, f"create_entities: {text!r}")


@pytest.mark.enforcement
@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "everything"])
def test_everything_cannot_connect_to_an_unlisted_port(world: World, listeners: Any, name: str) -> None:
    s = server(world, name)
    error, text = s.call("gzip-file-as-resource", {"name": "ok.gz", "data": "data:text/plain;base64,aGkK"})
    check(not error, s, f"gzip of a data: URI (no network): {text!r}")
    unlisted = listeners[1]
    before = unlisted.accepted
    error, text = s.call("gzip-file-as-resource", {"name": "x.gz", "data": f"http://127.0.0.1:{unlisted.port}/x"})
    check(error and "fetch failed" in text, s, f"gzip of http://127.0.0.1:{unlisted.port}: {text!r}")
    assert unlisted.accepted == before, "the connection reached the listener"


@pytest.mark.enforcement
def test_probe_reads_writes_connects_only_as_granted(world: World, listeners: Any) -> None:
    """The probe (a python3 with the `python` profile; see PROBE_MANIFEST)."""
    granted, unlisted = listeners
    accepted = granted.accepted, unlisted.accepted
    ops = [f"read:{world.projects / 'notes.txt'}", f"read:{world.secret / 'id_ed25519'}",
           f"write:{world.state_dir('probe') / 'ok'}", f"write:{world.outside / 'planted'}",
           f"write:{world.projects / 'planted'}", f"connect:{granted.port}", f"connect:{unlisted.port}", "env"]
    status, out = world.run("probe", ops)
    assert status == 0, out
    result = json.loads(out)
    assert result == {ops[0]: "ok", ops[1]: "EACCES", ops[2]: "ok", ops[3]: "EACCES", ops[4]: "EACCES",
                      ops[5]: "ok", ops[6]: "EACCES", "env": result["env"]}, result
    assert (granted.accepted, unlisted.accepted) == (accepted[0] + 1, accepted[1])
    # Python may coerce the C locale (PEP 538): LC_CTYPE is its own doing.
    # HOME, USER, LOGNAME: a dynamic user's, under a root supervisor.
    extra = {"HOME", "USER", "LOGNAME"} if os.geteuid() == 0 else set()
    assert set(result["env"]) - {"LC_CTYPE"} == {"PROBE"} | extra, result["env"]
    assert not (world.outside / "planted").exists() and not (world.projects / "planted").exists()


@pytest.mark.enforcement
@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "time"])
def test_time_zone_data_not_granted(world: World, name: str) -> None:
    """Narrowed to one zone file (UTC): the server reads its zone data itself,
    and any other zone is EACCES."""
    zoneinfo = "/usr/share/zoneinfo"
    ro = [p for p in spec_of(world, name).read_only_noexec if p != zoneinfo and not p.startswith(zoneinfo + "/")]
    with world.spawn(name, narrow={"read_only_noexec": [*ro, f"{zoneinfo}/Etc/UTC"]}) as s:
        s.initialize()
        error, text = s.call("get_current_time", {"timezone": "UTC"})
        check(not error, s, f"get_current_time UTC: {text!r}")
        error, text = s.call("get_current_time", {"timezone": "Pacific/Chatham"})
        check(error and f"Permission denied: '{zoneinfo}/Pacific/Chatham'" in text, s,
              f"get_current_time Pacific/Chatham: {text!r}")


@pytest.mark.enforcement
@pytest.mark.parametrize("name", [n for n in ALL if base(n) == "git"])
def test_git_repository_whose_config_reaches_outside(world: World, name: str) -> None:
    """repo/nested lies inside --repository, so the server's own check passes;
    its .git/config includes a file in `secret`, which the manifest does not grant."""
    s = server(world, name)
    error, text = s.call("git_status", {"repo_path": str(world.repo / "nested")})
    check(error and "Permission denied" in text and str(world.secret) in text, s, f"git_status nested: {text!r}")
    # A path outside --repository: the server's own check, for comparison.
    error, text = s.call("git_status", {"repo_path": str(world.secret)})
    check(error and "outside the allowed repository" in text, s, f"git_status outside: {text!r}")


# ---- a dynamic user has no account outside the supervisor ------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor gives dynamic uids")
def test_dynamic_user_is_known_to_node_and_python(world: World) -> None:
    status, out = world.run("whoami")
    assert status == 0, out
    got = json.loads(out)
    uid = ids.Table(str(world.state)).names()["whoami"]
    assert got["node"]["uid"] == uid and got["node"]["username"] == "llsv-whoami", got
    assert got["python"] == f"llsv-whoami {uid}", got


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor gives dynamic uids")
@pytest.mark.parametrize("name", ["git"])   # one: git-uvx, another uid, could not read its objects after
def test_git_commit_as_a_dynamic_user(world: World, name: str) -> None:
    s = server(world, name)
    path = world.repo / f"added-by-{name}.txt"
    path.write_text("committed by a server without an account\n")
    os.chmod(path, 0o666)
    error, text = s.call("git_add", {"repo_path": str(world.repo), "files": [path.name]})
    check(not error, s, f"git_add: {text!r}")
    error, text = s.call("git_commit", {"repo_path": str(world.repo), "message": f"from {name}"})
    check(not error and "committed" in text.lower(), s, f"git_commit: {text!r}")
    error, text = s.call("git_log", {"repo_path": str(world.repo)})
    check(not error and f"from {name}" in text, s, f"git_log: {text!r}")
