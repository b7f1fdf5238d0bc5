"""Where denials cannot be seen (audit off on the host, a user's own
supervisor, a kernel before 6.15), the supervisor, `run` and `check` say
so and point to `learn`; nothing else changes. No host setting is touched."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from landlock import audit

sys.path.insert(0, os.path.dirname(__file__))
from svhelpers import PYTHON, REPO, accounted, counted, run  # noqa: E402

pytestmark = pytest.mark.enforcement


def _host_audit_on() -> bool:
    return audit.status().enabled != 0


def test_the_default_mode_follows_the_host(lab: Any) -> None:
    lab.stock()
    sv = lab.start()
    result = run(sv.client, "sh", ["cat /etc/hostname; exit 4"])
    assert result.code == 4
    # The supervisor's own report says which: another program may switch
    # the host's audit on or off while the test runs.
    if result.child.denials["mode"] == "count":
        counts = counted(result.child, sv.client)
        assert counts["kernel"] == 1 or not accounted(counts, sv.client), counts
    else:
        assert result.child.denials["mode"] == "off"
        assert "audit is off on this host" in result.child.denials["reason"]
        assert "landlock-supervisor learn" in result.child.denials["reason"]
        assert "denials: not visible: audit is off" in sv.log()   # said once, at the start
        assert "denials" not in result.child.exited
        proc = subprocess.run([PYTHON, "-m", "supervisor", "run", "--socket", str(sv.socket_path), "sh",
                               "cat /etc/hostname; exit 4"], cwd=REPO, capture_output=True, text=True,
                              timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": "/root"})
        assert proc.returncode == 4
        assert proc.stderr.splitlines()[-1].startswith(
            "landlock-supervisor: sh failed; its denials are not visible: audit is off on this host"), proc.stderr


def test_audit_off_changes_nothing_and_says_why(lab: Any) -> None:
    lab.stock()
    before = audit.status()
    sv = lab.start(extra=["--audit", "off"])
    result = run(sv.client, "sh", ["cat /etc/hostname"])
    assert result.child.denials == {"mode": "off", "reason": "serve --audit off"}
    assert "denials: not visible" not in sv.log()
    assert " set to " not in sv.log()   # it says each host setting it changes
    after = audit.status()
    if (after.enabled, after.backlog_limit, after.rate_limit) != \
            (before.enabled, before.backlog_limit, before.rate_limit):
        pytest.skip(f"machine setting changed under the test, by another program (this supervisor says it changed "
                    f"nothing): {before} -> {after}")


_CHOOSE = """
import os, sys
os.setgroups([]); os.setresgid(64150, 64150, 64150); os.setresuid(64150, 64150, 64150)
from supervisor.daemon import audit
print(audit.choose(None, False, True).reason)
print(audit.choose(None, False, False).reason)
try:
    audit.choose("count", False, True)
except SystemExit as e:
    print(e)
"""


def test_a_users_own_supervisor_says_why_it_sees_none() -> None:
    out = subprocess.run([PYTHON, "-c", _CHOOSE], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    users, old_kernel, refused = out.stdout.splitlines()
    assert users.startswith("a user's own supervisor cannot read audit records (CAP_AUDIT_READ)")
    assert "learn" in users
    assert old_kernel.startswith("Landlock cannot log denials on this kernel (Linux 6.15+, Landlock ABI 7)")
    assert refused.startswith("landlock-supervisor: --audit count: a user's own supervisor cannot read")


def test_check_says_what_serve_would_show(lab: Any) -> None:
    path = lab.manifest("true", command="/bin/true")
    on = _host_audit_on()
    out = subprocess.run([PYTHON, "-m", "supervisor", "check", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(l for l in out.stdout.splitlines() if l.strip().startswith("denials: "))
    if _host_audit_on() != on:
        pytest.skip(f"machine setting changed under the test: audit switched {'off' if on else 'on'} meanwhile")
    assert ("count (audit is on here)" in line) if on else ("not visible: audit is off" in line)
