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


@pytest.fixture
def garbage(tmp_path: Path) -> Iterator[str]:
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
                conn.send(b"\x00not json {")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(5)


@pytest.mark.parametrize("command", [["ping"], ["stats"], ["run", "x", "--", "true"]])
def test_a_malformed_reply_is_one_line(garbage: str, command: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "supervisor", "--socket", garbage, *command], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "malformed reply" in r.stderr and r.stdout == ""
