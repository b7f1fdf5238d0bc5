"""The soak, short: scripts/soak.py with 500 spawns from 4 clients that
disconnect and signal at random while the supervisor is reloaded. The full
run (10,000 spawns, 8 clients) is `scripts/soak.py`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sechelpers import REPO


@pytest.mark.timeout(90)
def test_short_soak():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "soak.py"), "--spawns", "500", "--clients", "4",
                        "--max-seconds", "60", "--sighup-every", "1", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=85)
    assert r.returncode in (0, 1), r.stderr
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    failed = [name for name, ok in figures["checks"].items() if not ok]
    assert not failed, (failed, figures.get("fds_new"), figures, r.stderr[-3000:])
    assert figures["zombies"] == 0 and figures["fd_growth"] == 0 and figures["orphans"] == 0
    assert figures["spawns_requested"] == 500
    assert figures["spawned"] + figures["refused"] + figures["failed"] == 500
    assert figures["spawned"] == figures["exited"] > 300
    assert figures["rss_kib_after"] < figures["rss_kib_before"] + 16 * 1024, figures
    assert figures["sighups"] >= 1
