"""A fake supervisor that answers garbage: `landlock-supervisor` says so in
one line and exits 1, no traceback (protocol.ProtocolError is a
SupervisorError, which cli.main's handler catches), and `run` does not call
it a usage error."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fake(tmp_path: Path, reply: bytes) -> Iterator[str]:
    """A supervisor that answers every request with `reply`."""
    path = str(tmp_path / "fake.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.send(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(5)


@pytest.fixture
def garbage(tmp_path: Path) -> Iterator[str]:
    yield from _fake(tmp_path, b"\x00not json {")


@pytest.fixture
def bare_spawned(tmp_path: Path) -> Iterator[str]:
    """`spawned` without its pid, pgid and report (to describe too)."""
    yield from _fake(tmp_path, b'{"v": 1, "event": "spawned"}')


@pytest.mark.parametrize("command", [["ping"], ["stats"], ["run", "x", "--", "true"]])
def test_a_malformed_reply_is_one_line(garbage: str, command: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "supervisor", "--socket", garbage, *command], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "malformed reply" in r.stderr and r.stdout == ""


def test_a_spawned_without_its_fields_is_a_protocol_error_not_a_traceback(bare_spawned: str) -> None:
    from supervisor.client import Client
    from supervisor.protocol import ProtocolError
    with pytest.raises(ProtocolError, match="`spawned` without a pid"):
        Client(bare_spawned).spawn("x")
    r = subprocess.run([sys.executable, "-m", "supervisor", "--socket", bare_spawned, "run", "x"], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "malformed reply" in r.stderr, r.stderr
