"""The official Python SDK (mcp, pinned by scripts/install-clients, in its own
venv) starts every example server through `landlock-supervisor run NAME`, in
daemon and private mode, as root and as a plain user, with the environment
the SDK gives (HOME, LOGNAME, PATH, SHELL, TERM, USER plus the config's env):
initialize, tools/list, real calls, a kernel denial with the session alive
after it, and nothing left running once the client has closed.

One driver process per (identity, mode) runs the ten sessions one after the
other (the SDK's import is the costly part); each session is its own test."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from clienthelpers import CLIENTS, HERE, TIMEOUT, Identity, run_client  # noqa: E402
from scenarios import ALL, check_session, scenario, session_spec  # noqa: E402

MODES = [("root", "daemon"), ("root", "private"), ("user", "daemon"), ("user", "private")]
_results: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}


def drive(ident: Identity, mode: str, port: int, names: tuple[str, ...] = ALL) -> tuple[dict[str, Any], str]:
    """Run the Python SDK's driver once for NAMES; (results by name, stderr)."""
    tag = f"{ident.kind}-{mode}-py"
    spec = {"timeout": TIMEOUT,
            "sessions": {n: session_spec(ident, mode, scenario(n, ident, port, tag)) for n in names}}
    path = ident.dir / f"{tag}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    p = run_client(ident, [str(CLIENTS / "py" / "bin" / "python"), str(HERE / "driver.py"), str(path)],
                   ident.client_env(), timeout=60 + 20 * len(names))
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0 and p.stdout.strip(), f"the driver exited {p.returncode}:\n{err[-3000:]}"
    return json.loads(p.stdout), err


@pytest.fixture
def py_results(identities: Any, unlisted: Any, request: pytest.FixtureRequest) -> Any:
    def get(kind: str, mode: str) -> tuple[Identity, dict[str, Any], str]:
        ident = identities[kind]()
        if (kind, mode) not in _results:
            _results[kind, mode] = drive(ident, mode, unlisted.port)
        return (ident, *_results[kind, mode])
    return get


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind,mode", MODES, ids=[f"{k}-{m}" for k, m in MODES])
def test_python_sdk_session(py_results: Any, unlisted: Any, kind: str, mode: str, name: str) -> None:
    ident, results, stderr = py_results(kind, mode)
    before = unlisted.accepted
    where = f"{kind}/{mode}/{name}"
    sc = scenario(name, ident, unlisted.port, f"{kind}-{mode}-py")
    check_session(sc, results[name], f"{where} (client stderr: {stderr[-1500:]})")
    assert results[name]["leftover"] == [], f"{where}: left running after the client closed: {results[name]}"
    assert unlisted.accepted == before


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,mode", MODES, ids=[f"{k}-{m}" for k, m in MODES])
def test_python_sdk_leaves_nothing(py_results: Any, kind: str, mode: str) -> None:
    """After the ten sessions: the daemon has no child, and no process of
    this world is left (a private supervisor, a server, a `run`)."""
    ident, results, _ = py_results(kind, mode)
    assert ident.daemon_children() == []
    assert ident.leftovers() == []
    # The denials were the kernel's: the session went on after each one.
    assert all("error" not in r for r in results.values()), results
