"""The official TypeScript SDK and the MCP Inspector CLI (0.15 and 2.12) start
one plain (node) and one npx server through `landlock-supervisor run`, in
daemon and private mode, as root and as a plain user (the SDK also of a
root daemon's warm servers), on the node of
scripts/install-clients (the npm registry's node 22 when the system's is
older), first on the client's PATH as its user would have it.

The TypeScript SDK holds one session per server: initialize, tools/list, a
real call, a kernel denial, another call. The Inspector CLI makes one request
per process (each its own session): tools/list, then a real call and the
denial at once; the
config's env goes as its `-e K=V` options, the server's arguments with no
`--` (the Inspector takes it as its own end of options)."""
from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from clienthelpers import HERE, PATH, TIMEOUT, Identity, clients_env, run_client  # noqa: E402
from scenarios import Call, check_session, scenario, session_spec  # noqa: E402

MODES = [("root", "daemon"), ("root", "private"), ("user", "daemon"), ("user", "private")]
SDK_MODES = [*MODES, ("root-warm", "daemon")]   # (warm servers: the SDK's session, relayed by `run`)
SERVERS = ("filesystem", "everything-npx")    # one plain node server, one npx server
INSPECTORS = {"0.15": "@modelcontextprotocol/inspector-cli/build/cli.js",
              "2.12": "@modelcontextprotocol/inspector/clients/launcher/build/index.js"}


def node_env(ident: Identity) -> dict[str, str]:
    node = clients_env()["NODE"]
    return ident.client_env(path=f"{os.path.dirname(node)}:{PATH}")


# ---- the TypeScript SDK ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind,mode", SDK_MODES, ids=[f"{k}-{m}" for k, m in SDK_MODES])
def test_typescript_sdk(identities: Any, unlisted: Any, kind: str, mode: str) -> None:
    ident: Identity = identities[kind]()
    warm = ident.warm_servers(SERVERS) if kind == "root-warm" else {}
    tag = f"{kind}-{mode}-ts"
    scenarios = {n: scenario(n, ident, unlisted.port, tag) for n in SERVERS}
    spec = {"timeout": TIMEOUT, "sessions": {n: session_spec(ident, mode, sc) for n, sc in scenarios.items()}}
    path = ident.dir / f"{tag}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    env = clients_env()
    before = unlisted.accepted
    p = run_client(ident, [env["NODE"], str(HERE / "driver.cjs"), env["NODE_MODULES"], str(path)],
                   node_env(ident), timeout=120)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0 and p.stdout.strip(), f"the TypeScript driver exited {p.returncode}:\n{err[-3000:]}"
    results = json.loads(p.stdout)
    assert results["_sdk"] == env["TS_SDK_VER"]
    for name, sc in scenarios.items():
        check_session(sc, results[name], f"{kind}/{mode}/{name} TypeScript SDK (stderr: {err[-1500:]})")
    assert unlisted.accepted == before
    assert ident.daemon_children() == []
    assert ident.leftovers() == []
    if warm:
        # Each server's warm one was handed over (gone now), but filesystem's: the client passes it arguments.
        after = ident.warm_servers(SERVERS)
        assert {n: warm[n] == after[n] for n in SERVERS} == {n: bool(scenarios[n].client_args) for n in SERVERS}


# ---- the Inspector CLI ------------------------------------------------------------

def first_json(text: str) -> Any:
    """The first JSON value of the Inspector's output (2.12 adds an error line after an isError result)."""
    start = min(i for i in (text.find("{"), text.find("[")) if i >= 0)
    return json.JSONDecoder().raw_decode(text[start:])[0]


def inspector(ident: Identity, version: str, config: dict[str, Any], method: list[str]) -> tuple[Any, str]:
    env = clients_env()
    argv = [env["NODE"], str(Path(env["NODE_MODULES"]) / INSPECTORS[version]), "--cli"]
    for k, v in config["env"].items():
        argv += ["-e", f"{k}={v}"]
    argv += [config["command"], *config["args"], *method]
    p = run_client(ident, argv, node_env(ident), timeout=60)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    try:
        return first_json(out), err
    except ValueError:
        raise AssertionError(f"Inspector {version} {' '.join(method)}: exit {p.returncode}, no JSON:\n"
                             f"{out[-1500:]}\n{err[-1500:]}") from None


def tool_args(call: Call) -> list[str]:
    method = ["--method", "tools/call", "--tool-name", call.tool]
    if call.arguments:
        method += ["--tool-arg", *(f"{k}={v}" for k, v in call.arguments.items())]
    return method


# Inspector 2.12 in every mode; 0.15 (the older CLI and its launcher) on the
# diagonal: a root daemon, a user's private supervisor (the time budget).
INSPECTOR_CASES = [("2.12", k, m) for k, m in MODES] + [("0.15", "root", "daemon"), ("0.15", "user", "private")]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", SERVERS)
@pytest.mark.parametrize("version,kind,mode", INSPECTOR_CASES, ids=[f"{v}-{k}-{m}" for v, k, m in INSPECTOR_CASES])
def test_inspector_cli(identities: Any, unlisted: Any, version: str, kind: str, mode: str, name: str) -> None:
    ident: Identity = identities[kind]()
    sc = scenario(name, ident, unlisted.port, f"{kind}-{mode}-inspector")
    config = ident.config(mode, name, sc.client_args)
    assert "--" not in config["args"]
    where = f"Inspector {version} {kind}/{mode}/{name}"
    before = unlisted.accepted

    listed, err = inspector(ident, version, config, ["--method", "tools/list"])
    tools = {t["name"] for t in listed.get("tools", [])}
    assert {c.tool for c in sc.calls} <= tools, f"{where}: tools/list: {listed}\n{err[-1500:]}"
    real = next(c for c in sc.calls if not c.error)
    denial = next(c for c in sc.calls if c.denial)
    # The two calls at once, each its own session (tools/list first: an npx server's
    # cache filled, which two npx at once could race to fill): the suite's time.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda c: inspector(ident, version, config, tool_args(c)), (real, denial)))
    for call, (result, err) in zip((real, denial), replies):
        text = "\n".join(c.get("text", "") for c in result.get("content", []))
        ok = bool(result.get("isError")) == call.error and all(t in text for t in call.text)
        assert ok, f"{where}: {call.tool}: wanted isError={call.error} {call.text}, got {result}\n{err[-1500:]}"
    assert unlisted.accepted == before
    assert ident.daemon_children() == []
    assert ident.leftovers() == []
