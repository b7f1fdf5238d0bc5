"""The official Python SDK (mcp, pinned by scripts/install-clients, in its own
venv) starts every example server through `landlock-supervisor run NAME`, in
daemon and private mode, as root and as a plain user, with the environment
the SDK gives (HOME, LOGNAME, PATH, SHELL, TERM, USER plus the config's env):
initialize, tools/list, real calls, a kernel denial with the session alive
after it, and nothing left running once the client has closed; and the
same sessions of warm servers, handed over by a root daemon to `run` as
root and as a plain user (each session the warm one, but where the client
passes arguments of its own: a fresh spawn).

One driver process per (identity, mode) runs the ten sessions one after the
other (the SDK's import is the costly part); each session is its own test.
The root world's driver and the plain user's of one mode run at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from clienthelpers import CLIENTS, HERE, TIMEOUT, Identity, start_client  # noqa: E402
from scenarios import ALL, check_session, scenario, session_spec  # noqa: E402

MODES = [("root", "daemon"), ("root", "private"), ("user", "daemon"), ("user", "private"),
         ("root-warm", "daemon"), ("user-warm", "daemon")]
# user-warm: the plain user's client of root-warm's daemon (`run --socket`; --allow-uid), as users of a
# system-wide supervisor are: the world and the daemon of one identity, the client another's.
SERVED_BY = {"user-warm": "root-warm"}
# By (kind, mode): the driver's results, its stderr, and each server's warm one before it ran (root-warm's).
_results: dict[tuple[str, str], tuple[dict[str, Any], str, dict[str, int]]] = {}


# A root world's driver and the plain user's of the same mode run at once (two
# worlds: nothing shared but the host): the suite's time.
PAIRED = {("root", "daemon"): ("user", "daemon"), ("user", "daemon"): ("root", "daemon"),
          ("root", "private"): ("user", "private"), ("user", "private"): ("root", "private")}
Driven = Callable[[], tuple[dict[str, Any], str]]


def drive(ident: Identity, mode: str, port: int, client: Identity, tag: str) -> tuple[subprocess.Popen[bytes], Driven]:
    """The Python SDK's driver, started as `client`, for every server of
    IDENT's world and daemon; and what waits for its (results by name, stderr)."""
    spec = {"timeout": TIMEOUT,
            "sessions": {n: session_spec(ident, mode, scenario(n, ident, port, tag)) for n in ALL}}
    path = client.dir / f"{tag}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    p = start_client(client, [str(CLIENTS / "py" / "bin" / "python"), str(HERE / "driver.py"), str(path)],
                     client.client_env())

    def results() -> tuple[dict[str, Any], str]:
        try:
            out, err_bytes = p.communicate(timeout=60 + 20 * len(ALL))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err_bytes = p.communicate()
        err = err_bytes.decode(errors="replace")
        assert p.returncode == 0 and out.strip(), f"the driver exited {p.returncode}:\n{err[-3000:]}"
        return json.loads(out), err
    return p, results


@pytest.fixture(scope="module")
def drivers() -> Iterator[dict[tuple[str, str], tuple[subprocess.Popen[bytes], Driven, dict[str, int]]]]:
    """Drivers started and not yet waited for; any left (its tests not run) killed."""
    running: dict[tuple[str, str], tuple[subprocess.Popen[bytes], Driven, dict[str, int]]] = {}
    yield running
    for p, _, _ in running.values():
        p.kill()
        p.communicate()


@pytest.fixture
def py_results(identities: Any, unlisted: Any, drivers: Any) -> Any:
    def start(kind: str, mode: str) -> None:
        ident = identities[SERVED_BY.get(kind, kind)]()
        client = identities["user"]() if kind in SERVED_BY else ident
        warm = ident.warm_servers(ALL) if ident.kind == "root-warm" else {}
        drivers[kind, mode] = (*drive(ident, mode, unlisted.port, client, f"{kind}-{mode}-py"), warm)

    def get(kind: str, mode: str) -> tuple[Identity, dict[str, Any], str, dict[str, int]]:
        if (kind, mode) not in _results:
            for key in ((kind, mode), PAIRED.get((kind, mode))):
                if key is not None and key not in drivers and key not in _results:
                    start(*key)
            _, results, warm = drivers.pop((kind, mode))
            _results[kind, mode] = (*results(), warm)
        return (identities[SERVED_BY.get(kind, kind)](), *_results[kind, mode])
    return get


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind,mode", MODES, ids=[f"{k}-{m}" for k, m in MODES])
def test_python_sdk_session(py_results: Any, unlisted: Any, kind: str, mode: str, name: str) -> None:
    ident, results, stderr, warm = py_results(kind, mode)
    before = unlisted.accepted
    where = f"{kind}/{mode}/{name}"
    sc = scenario(name, ident, unlisted.port, f"{kind}-{mode}-py")
    check_session(sc, results[name], f"{where} (client stderr: {stderr[-1500:]})")
    assert results[name]["leftover"] == [], f"{where}: left running after the client closed: {results[name]}"
    assert unlisted.accepted == before
    if warm:
        # The session was the server kept warm (handed over: no longer one, ended with its session), but
        # where the client passed arguments of its own (a fresh spawn: the warm one still waits).
        assert (warm[name] in ident.warm_servers(ALL).values()) == bool(sc.client_args), (where, warm)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,mode", MODES, ids=[f"{k}-{m}" for k, m in MODES])
def test_python_sdk_leaves_nothing(py_results: Any, kind: str, mode: str) -> None:
    """After the ten sessions: the daemon has no child, and no process of
    this world is left (a private supervisor, a server, a `run`)."""
    ident, results, _, _ = py_results(kind, mode)
    assert ident.daemon_children() == []
    assert ident.leftovers() == []
    # The denials were the kernel's: the session went on after each one.
    assert all("error" not in r for r in results.values()), results
