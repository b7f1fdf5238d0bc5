"""learn's session clock: --timeout runs from the server's read of its
request; until it reads or says anything the server is still starting (a
first `npx -y` fetching its packages), for at most --start-timeout; no
write of ours waits on a server that does not read."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from supervisor.learn import session

# A server that waits BEFORE seconds before it reads stdin, then AFTER
# seconds before each reply; HANG after its first reply: it reads no more.
SERVER = textwrap.dedent("""
    import json, sys, time
    before, after, hang = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "hang"
    time.sleep(before)
    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message:
            time.sleep(after)
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {}}), flush=True)
            if hang:
                time.sleep(600)
""")
# Never reads its stdin; asks us for pings without end (our answers fill its stdin).
PINGS = "import sys\nfor i in range(10**9): print('{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"ping\"}' % i, flush=True)"


def drive(argv: list[str], timeout: float, start_timeout: float) -> tuple[list[session.Outcome], float]:
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    server = subprocess.Popen([sys.executable, "-c", *argv], stdin=in_r, stdout=out_w)
    os.close(in_r)
    os.close(out_w)
    started = time.monotonic()
    try:
        return session.drive(in_w, out_r, session.requests([], None), timeout, start_timeout), \
            time.monotonic() - started
    finally:
        os.close(in_w)
        os.close(out_r)
        server.kill()
        server.wait()


@pytest.mark.parametrize("before, after, hang, timeout, start_timeout, failures, detail, within", [
    # Starting for longer than --timeout, then answering within it: both replies.
    (1.5, 0.5, False, 1.0, 30.0, ["", ""], "0 tools", 20),
    # Read at once, never answered: no reply once --timeout has passed.
    (0.0, 60.0, False, 1.0, 30.0, [session.TIMEOUT], "no reply in time", 10),
    # Never read: not started once --start-timeout has passed.
    (60.0, 0.0, False, 1.0, 2.0, [session.TIMEOUT], "not started in time: its stdin unread after 2 s", 4),
    # Started (it answered initialize), then reads no more: --timeout, not --start-timeout.
    (0.0, 0.0, True, 1.0, 30.0, ["", session.TIMEOUT], "no reply in time", 10),
])
def test_the_timeout_runs_from_the_servers_read(before: float, after: float, hang: bool, timeout: float,
                                               start_timeout: float, failures: list[str], detail: str,
                                               within: float) -> None:
    outcomes, took = drive([SERVER, str(before), str(after), "hang" if hang else "-"], timeout, start_timeout)
    assert [o.failure for o in outcomes] == failures
    assert outcomes[-1].detail == detail
    assert took < within


def test_a_server_that_never_reads_cannot_hold_our_writes() -> None:
    """Our answers to its pings fill its stdin: the write waits no longer than the session's clock."""
    outcomes, took = drive([PINGS], 1.0, 2.0)
    assert [o.failure for o in outcomes] == [session.TIMEOUT]
    assert took < 10
