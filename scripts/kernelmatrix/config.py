"""Where multikernel finds its files and keeps its cache, and what a guest runs."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
HERE = REPO / "scripts" / "multikernel.d"
# Run in every guest, relative to the repository; paths that do not exist
# (yet) are left out. Positional arguments replace this list.
TEST_PATHS = ["tests/kernel", "tests/landlock", "tests/supervisor/test_confinement.py"]
# TCG is slow: a longer per-test timeout than setup.cfg's 60 s.
PYTEST_ARGS = ["-p", "no:cacheprovider", "-o", "timeout=120", "--color=no", "-ra"]
CACHE = Path(os.environ.get("MULTIKERNEL_CACHE",
                            "/var/cache/landlock-supervisor/multikernel"))
GUEST_TIMEOUT = {"patched": 900, "qemu": 900}  # seconds for one whole guest run
