"""The supervisor's log: one line on stderr per event, never raising."""
from __future__ import annotations

import os


def log(message: str) -> None:
    try:
        os.write(2, f"landlock-supervisor[{os.getpid()}]: {message}\n".encode(errors="replace"))
    except OSError:
        pass
