"""learn tells the truth (issue 25), on a stdlib server of tests/supervisor/learnservers: a failed call is a
failure, a grant no run confirmed is marked, the denials that remained are named with the line that would
allow them, no round follows a run whose call timed out."""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_learn import kept, learn  # noqa: F401 (a fixture)

from supervisor.manifests import manifest as manifests

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="learn needs strace")

SERVER = Path(__file__).parent / "learnservers" / "truthful.py"


@pytest.fixture
def truthful(lab) -> Path:
    (lab.dir / "srv").mkdir(mode=0o755)
    server = lab.dir / "srv" / "truthful.py"
    shutil.copyfile(SERVER, server)
    os.chmod(server, 0o644)
    return server


@pytest.fixture
def port() -> Iterator[int]:
    """A local TCP server that says hello to each connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def call(tool: str, **arguments: object) -> list[str]:
    return ["--call", tool, json.dumps(arguments)]


def lines(stderr: str, start: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(start)]


def test_a_tool_error_and_a_json_rpc_error_are_failures(lab, truthful, kept) -> None:
    result = learn(lab, "--name", "t", "--out", str(kept / "t.yaml"), *call("fail"), *call("rpcfail"),
                   "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 5, result.stderr
    # The server's own message, escaped, on one line: its line break and U+2028 never reach the reader.
    assert lines(result.stderr, "  FAILED: ") == [
        '  FAILED: tools/call fail (request 3, tool error): "not a public address,\\nstart with --allow-private-ips"',
        '  FAILED: tools/call rpcfail (request 4, error): "error -32000: the database is locked\\u2028really"']
    header = (kept / "t.yaml").read_text().split("\nname:")[0]
    assert '# FAILED in the last run: tools/call fail (request 3, tool error): "not a public address,\\nstart' in header
    assert "tools/call fail: ok" not in result.stderr
    manifests.load(kept / "t.yaml", state_root=str(lab.dir / "state"))


def test_allow_tool_errors_lets_a_session_call_failing_tools(lab, truthful) -> None:
    result = learn(lab, "--name", "t", "--allow-tool-errors", *call("fail"), "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 0, result.stderr
    assert not lines(result.stderr, "  FAILED") and "# Failed, allowed by --allow-tool-errors: tools/call fail" \
        in result.stdout


def test_a_call_the_learning_policy_failed_is_retried_with_what_it_needs(lab, truthful, port) -> None:
    """The learning run has no network: the connect is denied, the tool answers isError; the next round
    runs with the port and the call works."""
    result = learn(lab, "--name", "t", *call("connect", port=port), "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 0, result.stderr
    runs = lines(result.stderr, "  run ")
    assert "FAILED tools/call connect (request 3, tool error): \"connect failed: [Errno 13]" in runs[0]
    assert runs[-1].endswith("tools/call connect: ok, 0 denials")
    line = next(line for line in result.stdout.splitlines() if line.startswith(f"      - {port} "))
    assert f"# port {port} to every address (a Landlock port rule names no address): python3 connected to " \
        f"127.0.0.1 port {port}" in line
    assert lines(result.stderr, f"  network: connect_tcp {port}: port {port} to every address")


def test_no_round_after_a_call_that_timed_out(lab, truthful, port) -> None:
    """Its denial (the connect) is listed with the line that would allow it, never granted."""
    result = learn(lab, "--name", "t", "--timeout", "3", *call("hang", port=port), "--", "/usr/bin/python3",
                   str(truthful))
    assert result.returncode == 5, result.stderr
    assert len(lines(result.stderr, "  run ")) == 1
    assert lines(result.stderr, "  stopped after run 1: tools/call hang got no reply in time")
    denied = lines(result.stderr, f"  denied in run 1: python3 connected to port {port} (")
    assert denied and denied[0].endswith(f"allowed by `network: connect_tcp: [{port}]`")
    assert lines(result.stderr, '  FAILED: tools/call hang (request 3, no reply in time): "no reply in time"')
    assert "network:" not in result.stdout and str(port) not in result.stdout.split("sandbox:")[1]
    assert "NOT validated" in result.stdout.splitlines()[0]


def test_a_grant_the_last_round_added_is_marked_and_the_exit_code_says_so(lab, truthful, kept) -> None:
    grow = lab.dir / "grow"   # not in srv, granted whole for the script
    for i in (1, 2, 3):
        (grow / str(i)).mkdir(parents=True)
        (grow / str(i) / "f").write_text("x")
    result = learn(lab, "--name", "t", "--rounds", "2", "--out", str(kept / "t.yaml"), *call("grow", dir=str(grow)),
                   "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 4, result.stderr
    text = (kept / "t.yaml").read_text()
    marked = [line for line in text.splitlines() if "NOT VALIDATED" in line]
    assert len(marked) == 1 and marked[0].startswith(f'    - "{grow / "2"}"'), text
    assert f'    - "{grow / "1"}"' in text   # run 2 ran with it
    assert lines(result.stderr, "  NOT VALIDATED: ") == [
        f"  NOT VALIDATED: read_only_noexec {grow / '2'}: the last round added it, no run confirmed it"]
    # What, by which program, in which round, and the line that would allow it.
    denied = lines(result.stderr, f"  denied in run 2: python3 read {grow / '2' / 'f'} (")
    assert len(denied) == 1 and "round 2, denied)" in denied[0]
    assert denied[0].endswith(f'allowed by `read_only_noexec: ["{grow / "2"}"]`'), result.stderr
    assert lines(result.stderr, "  NOT validated: grants the last round added were never run")


def test_one_round_validates_nothing(lab, truthful) -> None:
    result = learn(lab, "--name", "t", "--rounds", "1", "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 4, result.stderr
    sandbox = result.stdout.split("sandbox:")[1].split("\n# ")[0]
    grants = [line for line in sandbox.splitlines() if line.startswith("    - ")]
    assert grants and all("NOT VALIDATED" in line for line in grants), sandbox


def test_temporary_names_go_to_the_state_directory_never_to_tmp(lab, truthful) -> None:
    result = learn(lab, "--name", "t", *call("temp"), "--", "/usr/bin/python3", str(truthful))
    assert result.returncode == 0, result.stderr
    assert '  TMPDIR: "${STATE_DIR}" ' in result.stdout
    sandbox = result.stdout.split("sandbox:")[1].split("\n# ")[0]
    assert '"/tmp"' not in sandbox and '"/var/tmp' not in sandbox, sandbox
    assert '"/tmp/' not in sandbox.replace(f'"{lab.dir}/srv"', ""), sandbox   # the script's own directory only
    assert "--write /var/tmp" not in result.stderr and "--write /tmp" not in result.stderr
    assert lines(result.stderr, "  temporary, not granted (a temporary file: the manifest's TMPDIR")
    assert "# Temporary names (not granted, never a --write" in result.stdout
    # Its run 2 met the /var/tmp denials nothing grants: the first line does not say "no denial".
    assert "the last needed no new grant; the " in result.stdout.splitlines()[0]
