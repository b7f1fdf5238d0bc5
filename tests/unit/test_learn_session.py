"""learn's session clock: --timeout runs from the server's read of its
request; while the request lies unread the server is still starting (a
first `npx -y` fetching its packages), for at most --start-timeout."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from supervisor.learn import session

# A server that waits BEFORE seconds before it reads stdin, then AFTER
# seconds before each reply (None: it never reads).
SERVER = textwrap.dedent("""
    import json, sys, time
    before, after = float(sys.argv[1]), float(sys.argv[2])
    time.sleep(before)
    if before >= 0:
        for line in sys.stdin:
            message = json.loads(line)
            if "id" in message:
                time.sleep(after)
                print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {}}), flush=True)
""")


def drive(before: float, after: float, timeout: float, start_timeout: float) -> list[session.Outcome]:
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(before), str(after)], stdin=in_r, stdout=out_w)
    os.close(in_r)
    os.close(out_w)
    try:
        return session.drive(in_w, out_r, session.requests([], None), timeout, start_timeout)
    finally:
        os.close(in_w)
        os.close(out_r)
        server.kill()
        server.wait()


@pytest.mark.parametrize("before, after, timeout, start_timeout, failure, detail", [
    # Starting for longer than --timeout, then answering within it: both replies.
    (3.0, 1.5, 2.0, 30.0, "", "0 tools"),
    # Read at once, never answered: no reply once --timeout has passed.
    (0.0, 60.0, 1.0, 30.0, session.TIMEOUT, "no reply in time"),
    # Never read: not started once --start-timeout has passed.
    (60.0, 0.0, 1.0, 2.0, session.TIMEOUT, "not started in time: its stdin unread after 2 s"),
])
def test_the_timeout_runs_from_the_servers_read(before: float, after: float, timeout: float, start_timeout: float,
                                               failure: str, detail: str) -> None:
    outcomes = drive(before, after, timeout, start_timeout)
    assert [o.failure for o in outcomes] == (["", ""] if not failure else [failure])
    assert outcomes[-1].detail == detail
