"""Every client configuration of README.md's "Use it from your MCP client"
runs: each ```json block after a `<!-- client-config: WHO MODE -->` line is
parsed (the `mcpServers` form and VS Code's `servers` form), and each of its
servers is started by the official Python SDK with the entry's command, args
and env, as WHO (root, or the plain user), against the daemon MODE names
(daemon: WHO's own; root-daemon: root's, from the plain user; private: none).

The README's placeholders become the test's paths: /opt/landlock-supervisor
is this checkout, /home/alice/projects the projects of the world whose
supervisor serves, /run/landlock-supervisor/socket root's daemon, VS Code's
${input:github-token} what VS Code would put there. Two things are the
test's own, not the README's: a root client's daemon is the test's
(LANDLOCK_SUPERVISOR_SOCKET, not the host's /run/landlock-supervisor), and
root's private mode gets --state-root (not the host's /var/lib)."""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from clienthelpers import CLIENTS, EXAMPLES, HERE, REPO, TIMEOUT, Identity, run_client  # noqa: E402

README = REPO / "README.md"
TOKEN_FROM_INPUT = "ghp_typed_into_vscode"
_BLOCK = re.compile(r"<!-- client-config: (\w+) ([\w-]+) -->\s*```json\n(.*?)```", re.S)


def snippets() -> list[tuple[str, str, dict[str, Any]]]:
    return [(who, mode, json.loads(body)) for who, mode, body in _BLOCK.findall(README.read_text())]


def test_readme_has_the_client_configs() -> None:
    found = snippets()
    kinds = {(who, mode) for who, mode, _ in found}
    assert {("user", "daemon"), ("user", "root-daemon"), ("root", "daemon"), ("user", "private"),
            ("root", "private")} <= kinds, kinds
    assert any("servers" in data for _, _, data in found), "no VS Code form"
    assert any("mcpServers" in data for _, _, data in found)
    for _, _, data in found:
        for entry in (data.get("mcpServers") or data.get("servers")).values():
            assert "--" not in entry["args"], f"`--` in {entry}: the Inspector takes it as its own end of options"


def localize(value: str, served: Identity, root: Identity) -> str:
    return (value.replace("/opt/landlock-supervisor", str(REPO))
            .replace("/home/alice/projects", str(served.projects))
            .replace("/run/landlock-supervisor/socket", str(root.socket))
            .replace("${input:github-token}", TOKEN_FROM_INPUT))


def calls_for(name: str, served: Identity, env: dict[str, str]) -> list[dict[str, Any]]:
    if name.startswith("filesystem"):
        return [{"tool": "read_text_file", "arguments": {"path": str(served.projects / "notes.txt")}}]
    if name.startswith("everything"):
        return [{"tool": "echo", "arguments": {"message": "from the README"}}, {"tool": "get-env", "arguments": {}}]
    if name.startswith("time"):
        return [{"tool": "get_current_time", "arguments": {"timezone": "UTC"}}]
    raise AssertionError(f"README server {name}: no calls known for it")


SNIPPETS = snippets()


# The user's configs again for a user without a runtime directory: unchanged.
RUNS = [(i, who, mode) for i, (who, mode, _) in enumerate(SNIPPETS)] + \
    [(i, "user-noruntime", mode) for i, (who, mode, _) in enumerate(SNIPPETS)
     if who == "user" and mode in ("daemon", "private")]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("index, who, mode", RUNS, ids=[f"{i}-{w}-{m}" for i, w, m in RUNS])
def test_readme_config_runs(identities: Any, index: int, who: str, mode: str) -> None:
    data = SNIPPETS[index][2]
    client = identities[who]()
    root = identities["root"]()
    served = root if mode == "root-daemon" or who == "root" else client
    entries = data.get("mcpServers") or data.get("servers")
    sessions = {}
    for key, entry in entries.items():
        args = [localize(a, served, root) for a in entry.get("args", [])]
        env = {k: localize(v, served, root) for k, v in entry.get("env", {}).items()}
        name = next(a for a in args[1:] if not a.startswith("-") and a not in (str(EXAMPLES), str(root.socket)))
        if who == "root" and mode == "daemon":
            env["LANDLOCK_SUPERVISOR_SOCKET"] = str(root.socket)
        if who == "root" and mode == "private":
            args[1:1] = ["--state-root", str(root.private_state)]
        sessions[key] = {"command": localize(entry["command"], served, root), "args": args, "env": env,
                         "calls": calls_for(name, served, env), "_name": name}
    spec = {"timeout": TIMEOUT, "sessions": sessions}
    path = client.dir / f"readme-{index}-{who}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    p = run_client(client, [str(CLIENTS / "py" / "bin" / "python"), str(HERE / "driver.py"), str(path)],
                   client.client_env(), timeout=120)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0 and p.stdout.strip(), f"the driver exited {p.returncode}:\n{err[-3000:]}"
    results = json.loads(p.stdout)
    for key, session in sessions.items():
        r, name, where = results[key], session["_name"], f"README config {index} ({who} {mode}) {key}"
        assert "error" not in r, f"{where}: {r.get('stage')}: {r['error']}\n{err[-2000:]}"
        assert r["tools"] and r["leftover"] == [], f"{where}: {r}"
        assert all(not c["isError"] for c in r["calls"]), f"{where}: {r['calls']}"
        if name == "everything":
            server_env = json.loads(r["calls"][1]["text"])
            token = session["env"].get("GITHUB_TOKEN")
            assert server_env.get("GITHUB_TOKEN") == token, f"{where}: GITHUB_TOKEN did not arrive: {server_env}"
        # run names the config's variables it did not pass (not in client_env), not those
        # the manifest reads itself (its ${VAR}s, inherit_env: MCP_SERVERS in private mode).
        text = (EXAMPLES / f"{name}.yaml").read_text()
        manifest = yaml.safe_load(text)
        takes = manifest.get("client_env") or []
        uses = {*re.findall(r"\$\{(\w+)\}", text), *(manifest.get("inherit_env") or [])}
        line = next((ln for ln in err.splitlines() if f"not passed to {name} " in ln), "")
        dropped = sorted(k for k in entries[key].get("env", {}) if k not in takes and k not in uses)
        assert all(k in line for k in dropped), f"{where}: stderr does not name {dropped}:\n{err[-2000:]}"
        assert not any(re.search(rf"\b{k}\b", line) for k in uses), f"{where}: {line}"
    assert served.daemon_children() == []
