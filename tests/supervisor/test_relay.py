"""`run NAME` of a manifest with warm servers: a session on pipes, relayed
between run's own stdio and the pipes it was given (supervisor/client/relay.py):
bytes exact both ways, EOF and half-close each way, our reader gone,
signals, exit status; and a private supervisor's one line for `warm:`."""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pytest

from svhelpers import REPO, alive, read_line, state, wait_until

pytestmark = pytest.mark.enforcement

# A client's environment with nothing `run` would name as dropped: its stderr is the server's alone.
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/"}
# The installed command, run from /: no import from a working directory to warn of.
RUN = [str(REPO / ".venv" / "bin" / "landlock-supervisor")]
# Each says nothing on stdout before its client's first line (else it is discarded, never handed out).
SCRIPTS = {
    "wcat": "exec cat",
    # stderr byte for byte: what comes in goes out on stdout and on stderr (a pipe of root's: no reopening)
    "wtee": 'exec python3 -c "import os\nwhile d := os.read(0, 65536):\n for fd in 1, 2:\n  v = memoryview(d)\n  while v: v = v[os.write(fd, v):]"',  # noqa: E501
    "wsh": 'read line; echo "$$ $line"; echo banner-after >&2; cat; echo after-eof',
    # closes its stdout, then still reads and tells on stderr
    "whalf": 'read line; echo "$line"; exec 1>&-; read more; echo "got $more" >&2',
    "wloud": "read line; while :; do echo y; done",
    "wloud2": "read line; while :; do echo y >&2; done",
    "wloud3": "read line; while :; do echo y; echo z >&2; done",
    # more than run's stdout holds (256 KiB), less than that and its own pipe (1 MiB): then it exits
    "wburst": "read line; head -c 1000000 /dev/zero",
    # as wburst, when it is told to end
    "wlast": "trap 'head -c 1000000 /dev/zero; exit 0' TERM; read line; echo ready; sleep 100 & wait",
    "wtrap": "read line; trap 'echo caught; exit 42' TERM INT; echo ready; sleep 100 & wait",
    "wexit": 'read code; [ "$code" = kill ] && kill -9 $$; exit $code',
    "wfds": 'read line; echo "stderr $(readlink /proc/self/fd/2)"',
}


@pytest.fixture
def daemon(lab):
    for name, script in SCRIPTS.items():
        lab.manifest(name, command="/bin/sh", args=["-c", script], warm=1, user=65534,
                     sandbox={"profiles": ["system"], "read_only": ["/usr/bin"], "read_only_noexec": ["/proc"]})
    lab.manifest("fresh", command="/bin/cat", user=65534, sandbox={"profiles": ["system"]})
    lab.manifest("fresh-fds", command="/bin/sh", args=["-c", SCRIPTS["wfds"]], user=65534,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"], "read_only_noexec": ["/proc"]})
    sv = lab.start()
    assert wait_until(lambda: all(_warm(sv, name) for name in SCRIPTS), 20), sv.log()
    return sv


def _warm(sv, name: str) -> list[int]:
    return sv.client.stats()["warm"].get(name, [])


def _exactly(stderr: bytes, server: bytes) -> bool:
    """run's stderr is what the server wrote, then at most run's own lines
    (where the host's audit is on: the kernel's count of its denials, say),
    on a line of their own."""
    rest = stderr[len(server):]
    if server and not server.endswith(b"\n") and rest:
        if not rest.startswith(b"\n"):
            return False
        rest = rest[1:]
    ours = rest.splitlines()
    return stderr[:len(server)] == server and all(line.startswith(b"landlock-supervisor: ") for line in ours)


def _stalls(fd: int, still: float = 0.3) -> Callable[[], bool]:
    """A predicate for wait_until: bytes wait on fd (our reading end), as many as `still` seconds ago."""
    seen = [-1, 0.0]   # bytes waiting, since when

    def stalled() -> bool:
        n = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
        if n != seen[0]:
            seen[:] = n, time.monotonic()
            return False
        return n > 0 and time.monotonic() - seen[1] >= still
    return stalled


def _run(sv, name: str, **kwargs) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*RUN, "--socket", str(sv.socket_path), "run", name],
                            cwd="/", env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


@pytest.mark.timeout(60)
def test_a_warm_session_through_run_gets_the_clients_first_line_first(daemon):
    """The server got nothing before its hand-over: the client's first line
    (an MCP initialize) is its first message; its pid is the warm one's."""
    [server] = _warm(daemon, "wsh")
    first = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'
    proc = _run(daemon, "wsh")
    out, err = proc.communicate(first + b"\nmore\n", timeout=30)
    assert proc.returncode == 0, err
    assert out == b"%d %s\nmore\nafter-eof\n" % (server, first), out
    assert _exactly(err, b"banner-after\n"), err
    assert f"wsh: warm server {server} discarded" not in daemon.log()


@pytest.mark.timeout(120)
def test_run_relays_a_large_payload_byte_exact_both_ways(daemon):
    """8 MiB of every byte value in, the same out on stdout (splice) and on
    stderr (read/write), exact, with a warm server."""
    [server] = _warm(daemon, "wtee")
    data = os.urandom(8 << 20)
    proc = _run(daemon, "wtee")
    out, err = proc.communicate(data, timeout=90)
    assert proc.returncode == 0, err[-300:]
    assert out == data and _exactly(err, data)
    assert server not in _warm(daemon, "wtee")   # it was the one handed over


@pytest.mark.timeout(60)
def test_our_stdins_eof_reaches_the_server_which_still_writes(daemon):
    proc = _run(daemon, "wsh")
    out, _ = proc.communicate(b"one\ntwo\n", timeout=30)   # stdin's EOF: cat ends, the shell goes on
    assert proc.returncode == 0 and out.endswith(b"one\ntwo\nafter-eof\n"), out


@pytest.mark.timeout(60)
def test_the_servers_stdout_closing_reaches_our_reader_while_it_runs(daemon):
    """Half-close the other way: the server closes its stdout; run's reader
    sees EOF while the server still reads its stdin and writes stderr."""
    proc = _run(daemon, "whalf")
    proc.stdin.write(b"hello\n")
    proc.stdin.flush()
    assert proc.stdout.read() == b"hello\n"   # to its EOF (the test's timeout if none came)
    assert proc.poll() is None
    proc.stdin.write(b"later\n")
    proc.stdin.close()
    assert proc.wait(20) == 0
    assert _exactly(proc.stderr.read(), b"got later\n")
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout(60)
def test_what_the_server_wrote_before_it_exited_waits_for_a_slow_reader(daemon):
    """The server writes more than run's stdout holds and exits; our reader
    takes it over a second later: every byte, as direct pipes would have kept it."""
    [server] = _warm(daemon, "wburst")
    proc = _run(daemon, "wburst")
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert wait_until(lambda: not alive(server), 10)
    time.sleep(1.2)   # run drains, its stdout full (past the second it gives a reader after a TERM)
    assert proc.stdout.read() == bytes(1000000)
    assert proc.wait(20) == 0
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout(60)
def test_a_signal_ends_runs_wait_for_a_reader_that_never_reads(daemon):
    [server] = _warm(daemon, "wburst")
    proc = _run(daemon, "wburst")
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert wait_until(lambda: not alive(server), 10)
    time.sleep(0.5)   # run has the `exited`: it drains, its stdout full
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0   # the server's own exit
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout(60)
def test_a_client_that_terminates_run_then_waits_without_reading_gets_its_exit(daemon):
    """terminate(), then wait(): what the server wrote as it ended is not
    waited for past a second of our reader not reading (with direct pipes
    the client's wait() returns as the server ends)."""
    proc = _run(daemon, "wlast")
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert read_line(proc.stdout.fileno()) == b"ready\n"
    proc.terminate()
    assert proc.wait(10) == 0   # the server's trap's exit
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, stderr", [("fresh-fds", b"/dev/null"), ("wfds", b"pipe:[")])
def test_run_started_with_its_stderr_closed_passes_no_fd_of_its_own(daemon, lab, name, stderr):
    """A client that closed fd 2 before starting run: a server on run's own
    fds gets /dev/null as its stderr, never run's signal pipe (a warm one
    keeps its pipe, relayed to /dev/null), and nothing of run's goes to
    stdout (Python's print(file=None) would write there: the MCP stream)."""
    proc = subprocess.run(["/bin/sh", "-c", 'exec "$@" 2>&-', "sh", *RUN, "--socket", str(daemon.socket_path),
                           "run", name], input=b"go\n", capture_output=True, cwd="/", env=ENV, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith(b"stderr " + stderr) and proc.stdout.count(b"\n") == 1, \
        proc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["fresh", "wcat"])
def test_a_stderr_nobody_reads_any_more_takes_runs_own_lines_not_the_session(daemon, name):
    """run's stderr's reader is gone before run says a word of its own (a
    variable it does not pass): the line is dropped, the session runs, and
    run exits as the server did (not 1, with a traceback)."""
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.run([*RUN, "--socket", str(daemon.socket_path), "run", name], input=b"hello\n",
                          stdout=subprocess.PIPE, stderr=w, cwd="/", env={**ENV, "SOME_TOKEN": "x"}, timeout=30)
    os.close(w)
    assert proc.returncode == 0 and proc.stdout == b"hello\n", proc


@pytest.mark.timeout(60)
def test_our_readers_going_ends_the_session_like_a_disconnect(daemon, lab):
    """run's stdout reader dies: EPIPE; the session ends as if the client
    disconnected: run exits as SIGPIPE would have it, the server ends."""
    [server] = _warm(daemon, "wloud")
    proc = _run(daemon, "wloud")
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert read_line(proc.stdout.fileno(), 20) == b"y\n"
    proc.stdout.close()
    assert proc.wait(20) == 128 + signal.SIGPIPE
    assert wait_until(lambda: not alive(server), 10), state(server)
    proc.stdin.close()
    proc.stderr.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream, kind", [(1, "socket"), (2, "socket"), (2, "pipe"), (3, "pipe"), (1, "pty"),
                                          (2, "pty")])
def test_a_signal_is_forwarded_while_our_reader_does_not_read(daemon, stream, kind):
    """The server fills run's stdout or stderr (3: both, one pipe: `2>&1`),
    which our reader never reads (a node client's stdio are sockets; a
    terminal's reader can be gone or stopped): run's move never blocks, so
    our TERM reaches the server and run exits with its status."""
    name = {1: "wloud", 2: "wloud2", 3: "wloud3"}[stream]
    ours, theirs = socket.socketpair() if kind == "socket" else (None, None)
    r, w = {"pipe": os.pipe, "pty": os.openpty}.get(kind, lambda: (-1, -1))()
    target = theirs.fileno() if theirs is not None else w
    out = {1: {"stdout": target}, 2: {"stderr": target}, 3: {"stdout": target, "stderr": target}}[stream]
    proc = subprocess.Popen([*RUN, "--socket", str(daemon.socket_path), "run", name], cwd="/", env=ENV,
                            stdin=subprocess.PIPE, **{"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **out})
    for fd in (theirs, w):
        if isinstance(fd, socket.socket):
            fd.close()
        elif fd is not None and fd >= 0:
            os.close(fd)
    try:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        # Our stdout or stderr full (run would wait in its move): what waits on our end stops growing.
        assert wait_until(_stalls(ours.fileno() if ours is not None else r), 20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM   # the server's, killed by our TERM
    finally:
        proc.kill()
        proc.stdin.close()
        if ours is not None:
            ours.close()
        if r >= 0:
            os.close(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_forwards_signals_to_a_warm_server(daemon, sig):
    proc = _run(daemon, "wtrap")
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert read_line(proc.stdout.fileno(), 20) == b"ready\n"
    proc.send_signal(sig)
    assert proc.wait(20) == 42, proc.stderr.read()
    assert proc.stdout.read() == b"caught\n"
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [b"0", b"5", b"kill"])
def test_run_keeps_a_warm_servers_exit_status(daemon, code):
    proc = _run(daemon, "wexit")
    _, err = proc.communicate(code + b"\n", timeout=30)
    assert proc.returncode == (128 + signal.SIGKILL if code == b"kill" else int(code)), err


@pytest.mark.timeout(60)
def test_a_manifest_without_warm_servers_gets_runs_own_fds(daemon, tmp_path):
    """No warm server to be had: run passes its own stdio (no relay, no
    copy): the server's stdout is the very file run was given."""
    target = tmp_path / "out"
    with open(target, "wb") as out:
        proc = subprocess.Popen([*RUN, "--socket", str(daemon.socket_path), "run", "fresh"],
                                cwd="/", env=ENV, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE)
        proc.stdin.write(b"x\n")
        proc.stdin.flush()
        def fresh() -> list[int]:
            return [c["pid"] for c in daemon.client.list()["children"] if c.get("manifest") == "fresh"]
        assert wait_until(fresh, 10)
        [server] = fresh()
        # (listed from its fork on: its stdio are put in place just before its exec)
        assert wait_until(lambda: os.stat(f"/proc/{server}/fd/1").st_ino == os.fstat(out.fileno()).st_ino, 10)
        proc.stdin.close()
        assert proc.wait(20) == 0, proc.stderr.read()
        proc.stderr.close()
    assert target.read_bytes() == b"x\n"


@pytest.mark.timeout(60)
def test_a_private_supervisor_says_in_one_line_that_it_keeps_no_warm_server(lab):
    lab.manifest("wcat", command="/bin/cat", warm=1, user=65534, sandbox={"profiles": ["system"]})
    r = subprocess.run([*RUN, "run", "--allow-root-servers", "--manifests",
                        str(lab.manifest_dir), "wcat"], cwd="/", env=ENV, input=b"data\n", capture_output=True,
                       timeout=30)
    assert r.returncode == 0 and r.stdout == b"data\n", r
    lines = [line for line in r.stderr.decode().splitlines() if "warm" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "warning: warm: 1 not kept: a private supervisor keeps none: every spawn is fresh"), r


SERVERS = REPO / ".servers"


@pytest.mark.timeout(120)
def test_a_warm_mcp_server_through_run_answers_the_clients_own_initialize(lab):
    """examples/time.yaml with `warm: 1`, started by an MCP client as
    `run time`: the warm server is the one handed over, the client's
    initialize is its first message and is answered, a tool call works."""
    if not (SERVERS / "venv" / "bin" / "mcp-server-time").exists():
        pytest.fail("the real MCP servers are not installed: run scripts/install-servers", pytrace=False)
    sys.path.insert(0, str(REPO / "examples"))
    from mcp_session import McpSession, tool_text
    (lab.manifest_dir / "time.yaml").write_text((REPO / "examples" / "time.yaml").read_text() + "warm: 1\n")
    sv = lab.start(env={"MCP_SERVERS": str(SERVERS)})
    assert wait_until(lambda: _warm(sv, "time"), 30), sv.log()
    [server] = _warm(sv, "time")
    proc = _run(sv, "time")
    with McpSession(proc.stdin, proc.stdout, timeout=30) as session:
        assert session.initialize()["serverInfo"]["name"] == "mcp-time"
        # the warm one, a session now (a warm server is listed `"warm": true`)
        assert [c["pid"] for c in sv.client.list()["children"] if c["pid"] == server and not c.get("warm")]
        result = session.call_tool("get_current_time", {"timezone": "UTC"})
        assert not result.get("isError") and "UTC" in tool_text(result), result
    proc.stdin.close()
    assert proc.wait(30) == 0, proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout(60)
def test_a_warm_server_through_run_from_a_terminal_never_gets_the_terminal(daemon):
    """run's stdio a terminal: the warm server's are its pipes (relayed),
    the terminal none of its fds; what it writes reaches the terminal."""
    import pty
    import tty
    master, slave = pty.openpty()
    tty.setraw(slave)   # no echo, no line discipline: the bytes as written
    [server] = _warm(daemon, "wsh")
    proc = subprocess.Popen([*RUN, "--socket", str(daemon.socket_path), "run", "wsh"], cwd="/", env=ENV,
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        os.write(master, b"hi\n")
        seen = b""
        while b"banner-after" not in seen:
            seen += os.read(master, 4096)
        assert b"%d hi" % server in seen, seen
        assert all(os.readlink(f"/proc/{server}/fd/{fd}").startswith("pipe:") for fd in (0, 1, 2))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
