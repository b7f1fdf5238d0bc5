#!/usr/bin/env python3
"""The host's audit switch, for CI's audit-on pass: `get` prints `enabled`, `set N` sets it and prints what it was.

    .venv/bin/python scripts/host_audit.py get
    .venv/bin/python scripts/host_audit.py set 1

Root (CAP_AUDIT_CONTROL, in the initial PID namespace). Host-wide: the
kernel keeps audit "ever enabled" until reboot once it was on. A locked
audit (enabled=2) is left alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from landlock import audit  # noqa: E402


def main(argv: list[str]) -> int:
    if argv[:1] == ["get"] and len(argv) == 1:
        print(audit.status().enabled)
        return 0
    if argv[:1] != ["set"] or len(argv) != 2 or argv[1] not in ("0", "1"):
        print(__doc__, file=sys.stderr)
        return 2
    before = audit.status().enabled
    if before != audit.ENABLED_LOCKED:
        audit.set_status(enabled=int(argv[1]))
    print(before)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as e:
        sys.exit(f"host_audit: {e.strerror or e}")
