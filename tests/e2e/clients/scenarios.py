"""What each example server is asked by the client tests, and what must come back.

A scenario: the client arguments of the config (after NAME), the roots the
client announces, and the calls, each with the expected isError and a text
the result must hold. Where the server has a tool that reaches outside its
grant, one call is a kernel denial, and the call after it shows the session
alive. memory and time have none: nothing a client asks of them leaves
their grant (their state file, the zone data).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL = ("filesystem", "filesystem-npx", "memory", "memory-npx", "everything", "everything-npx",
       "time", "time-uvx", "git", "git-uvx")
SERVER_INFO = {"filesystem": "secure-filesystem-server", "memory": "memory-server",
               "everything": "mcp-servers/everything", "time": "mcp-time", "git": "mcp-git"}
SOME_TOOLS = {"filesystem": {"read_text_file", "list_allowed_directories"},
              "memory": {"create_entities", "read_graph"},
              "everything": {"echo", "gzip-file-as-resource"},
              "time": {"get_current_time", "convert_time"},
              "git": {"git_status", "git_log"}}


def base(name: str) -> str:
    return name.split("-")[0]


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any]
    error: bool                  # isError expected
    text: tuple[str, ...]        # substrings the result's text must hold
    denial: bool = False         # the kernel's

    def spec(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


@dataclass
class Scenario:
    name: str
    client_args: list[str] = field(default_factory=list)
    roots: list[str] | None = None
    settle: dict[str, Any] | None = None   # repeated until its text holds "until"
    calls: list[Call] = field(default_factory=list)

    @property
    def has_denial(self) -> bool:
        return any(c.denial for c in self.calls)


def scenario(name: str, ident: Any, port: int, tag: str) -> Scenario:
    """NAME's scenario in IDENT's world; `port` is a listener nobody grants;
    `tag` tells sessions apart (memory entities)."""
    projects, secret, repo = ident.projects, ident.secret, ident.repo
    notes, key = str(projects / "notes.txt"), str(secret / "id_ed25519")
    b = base(name)
    if b == "filesystem":
        calls = [Call("read_text_file", {"path": notes}, False, ("hello from an allowed project",)),
                 Call("read_text_file", {"path": key}, True, (f"EACCES: permission denied, open '{key}'",),
                      denial=True),
                 Call("list_allowed_directories", {}, False, (str(projects), str(secret)))]
        if name == "filesystem":
            # The server is told, by a client argument, that secret is its own.
            return Scenario(name, client_args=[str(secret)], calls=calls)
        # filesystem-npx takes no client arguments: the client's roots say it.
        return Scenario(name, roots=[str(projects), str(secret)], calls=calls,
                        settle={"tool": "list_allowed_directories", "arguments": {}, "until": str(secret)})
    if b == "memory":
        entity = f"client-{tag}-{name}"
        return Scenario(name, calls=[
            Call("create_entities", {"entities": [{"name": entity, "entityType": "test",
                                                   "observations": ["through landlock-supervisor run"]}]},
                 False, (entity,)),
            Call("read_graph", {}, False, (entity,))])
    if b == "everything":
        return Scenario(name, calls=[
            Call("echo", {"message": "through run"}, False, ("Echo: through run",)),
            Call("gzip-file-as-resource", {"name": "x.gz", "data": f"http://127.0.0.1:{port}/x"}, True,
                 ("fetch failed",), denial=True),
            Call("echo", {"message": "still here"}, False, ("Echo: still here",))])
    if b == "time":
        return Scenario(name, calls=[
            Call("get_current_time", {"timezone": "UTC"}, False, ('"timezone": "UTC"',)),
            Call("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
                 False, ("Asia/Tokyo", "21:00"))])
    if b == "git":
        nested = str(repo / "nested")
        return Scenario(name, calls=[
            Call("git_status", {"repo_path": str(repo)}, False, ("On branch main",)),
            # nested's .git/config includes a file in secret: the server's own
            # check passes (inside --repository), the kernel says no.
            Call("git_status", {"repo_path": nested}, True, ("Permission denied", str(secret)), denial=True),
            Call("git_log", {"repo_path": str(repo)}, False, ("first",))])
    raise KeyError(name)


def session_spec(ident: Any, mode: str, sc: Scenario) -> dict[str, Any]:
    """One session of a driver's SPEC: the config entry plus roots and calls."""
    config = ident.config(mode, sc.name, sc.client_args)
    return {**config, "roots": sc.roots, "settle": sc.settle, "calls": [c.spec() for c in sc.calls]}


def check_session(sc: Scenario, result: dict[str, Any], where: str) -> None:
    """Assert a driver's result for one session against its scenario."""
    assert "error" not in result, f"{where}: {result.get('stage')}: {result['error']}"
    assert result.get("server") == SERVER_INFO[base(sc.name)], f"{where}: initialize: {result}"
    tools = set(result.get("tools") or ())
    assert SOME_TOOLS[base(sc.name)] <= tools, f"{where}: tools/list: {sorted(tools)}"
    calls = result.get("calls") or []
    assert len(calls) == len(sc.calls), f"{where}: calls: {calls}"
    for want, got in zip(sc.calls, calls):
        ok = got["isError"] == want.error and all(t in got["text"] for t in want.text)
        assert ok, (f"{where}: {want.tool} {want.arguments}: wanted isError={want.error} and {want.text}, "
                    f"got isError={got['isError']}: {got['text'][:500]!r}")
