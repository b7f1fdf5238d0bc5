"""run's own stderr lines (stdio.OwnLines) never wait long on a reader
that does not read, start a line even after the server's bytes ended
mid-line, and go whole; each case in a process of its own (fd 2 replaced)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = {
    # fd 2 a pipe nobody reads, full: the line is dropped within LINE_WAIT, the next at once.
    "full pipe": """
        r, w = os.pipe(); os.dup2(w, 2); os.set_blocking(w, False)
        while True:
            try: os.write(w, b"x" * 65536)
            except BlockingIOError: break
        lines = stdio.OwnLines(sys.stderr)
        t = time.monotonic(); print("ours", file=lines, flush=True); first = time.monotonic() - t
        t = time.monotonic(); print("ours", file=lines, flush=True); second = time.monotonic() - t
        print(first < 2 and second < 0.2, file=sys.__stdout__)
    """,
    # the same on a socket (a node client's stderr)
    "full socket": """
        a, b = socket.socketpair(); os.dup2(a.fileno(), 2); a.setblocking(False)
        while True:
            try: a.send(b"x" * 65536)
            except BlockingIOError: break
        lines = stdio.OwnLines(sys.stderr)
        t = time.monotonic(); print("ours", file=lines, flush=True)
        print(time.monotonic() - t < 2, file=sys.__stdout__)
    """,
    # the server's bytes ended mid-line: ours begins a line; whole lines, in one write each
    "mid line": """
        r, w = os.pipe(); os.dup2(w, 2)
        stdio.ours(2).write(b"server half")
        lines = stdio.OwnLines(sys.stderr)
        lines.write("landlock-supervisor: "); lines.write("said\\n"); lines.write("and this"); lines.flush()
        os.close(2); os.close(w)
        print(os.read(r, 4096) == b"server half\\nlandlock-supervisor: said\\nand this", file=sys.__stdout__)
    """,
    # a line of ours broken off (room for part of it): the server's next bytes begin a line
    "broken line": """
        r, w = os.pipe(); os.dup2(w, 2); os.set_blocking(w, False)
        while True:
            try: os.write(w, b"x" * 65536)
            except BlockingIOError: break
        os.set_blocking(r, False)
        os.read(r, 4096)                                   # room for 4096 bytes of a longer line
        lines = stdio.OwnLines(sys.stderr)
        print("landlock-supervisor: " + "y" * 10000, file=lines, flush=True)
        while True:
            try: os.read(r, 1 << 20)
            except BlockingIOError: break
        stdio.ours(2).write(b"server")
        os.set_blocking(r, True); os.close(2); os.close(w); stdio.forget(2)
        print(os.read(r, 1 << 20) == b"\\nserver", file=sys.__stdout__)
    """,
    # fd 2 a pty nobody reads: written through a non-blocking open of its own, so a full
    # one drops the line; /dev/ptmx is no terminal of ours to open again (a new pty)
    "full pty": """
        m, s = os.openpty(); os.dup2(s, 2)
        out = stdio.ours(2)
        while True:
            try: out.write(b"x" * 4096)
            except BlockingIOError: break
        lines = stdio.OwnLines(sys.stderr)
        t = time.monotonic(); print("ours", file=lines, flush=True)
        alias = stdio.Ours(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
        print(time.monotonic() - t < 2 and out.own >= 0 and alias.own == -1, file=sys.__stdout__)
    """,
    # its reader gone: dropped, fd 2 on /dev/null, no traceback
    "reader gone": """
        r, w = os.pipe(); os.dup2(w, 2); os.close(r)
        lines = stdio.OwnLines(sys.stderr)
        print("ours", file=lines, flush=True)
        print(os.readlink("/proc/self/fd/2") == "/dev/null", file=sys.__stdout__)
    """,
}


@pytest.mark.parametrize("case", CASES)
def test_own_lines(case: str) -> None:
    code = "import os, socket, sys, time\nfrom supervisor import stdio\n" + textwrap.dedent(CASES[case])
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == "True", (p.stdout, p.stderr)
