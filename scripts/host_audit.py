#!/usr/bin/env python3
"""The host's audit switch, for CI's audit-on pass: `get` prints `enabled`; `on -- COMMAND...` runs COMMAND with audit on.

    .venv/bin/python scripts/host_audit.py get
    .venv/bin/python scripts/host_audit.py on -- .venv/bin/python -m pytest -q tests/supervisor

`on` relies on audit as a supervisor does: a holder in the shared record
of supervisor/daemon/audit_settings.py while COMMAND runs, so that neither puts
the host's settings back under the other; the last holder to leave puts
back what was changed (this one too, when COMMAND fails or is stopped by
SIGINT, SIGTERM or SIGHUP; after a `kill -9` of this process, the next
holder to leave). Exits with COMMAND's status.

Root (CAP_AUDIT_CONTROL, in the initial PID namespace). Host-wide: the
kernel keeps audit "ever enabled" until reboot once it was on. A locked
audit (enabled=2) is left alone.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from landlock import audit  # noqa: E402
from supervisor.daemon import audit_settings  # noqa: E402


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)   # the holder leaves in `finally` (COMMAND got the signal too: same group)


def on(command: list[str]) -> int:
    wanted = {} if audit.status().enabled == audit.ENABLED_LOCKED else {"enabled": 1}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stopped)
    audit_settings.hold(wanted)
    try:
        return subprocess.call(command)
    finally:
        audit_settings.release()


def main(argv: list[str]) -> int:
    if argv == ["get"]:
        print(audit.status().enabled)
        return 0
    if argv[:2] == ["on", "--"] and len(argv) > 2:
        return on(argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as e:
        sys.exit(f"host_audit: {e.strerror or e}")
