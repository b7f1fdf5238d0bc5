#!/usr/bin/env python3
"""The spawn-latency benchmark's command; the program is the package scripts/bench/ (its --help says what it measures)."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.bench.__main__ import main  # noqa: E402 - needs the repository on the path

if __name__ == "__main__":
    sys.exit(main())
