"""Reaping every child (grandchildren too, as subreaper) and describing how each ended."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


def reap_all() -> Iterator[tuple[int, int, Any]]:
    """(pid, status, rusage) of each child that has ended, without blocking."""
    while True:
        try:
            pid, status, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status, rusage


def describe(status: int, rusage: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"code": None, "signal": None}
    if os.WIFEXITED(status):
        out["code"] = os.WEXITSTATUS(status)
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        out["signal"] = sig
        try:
            out["signal_name"] = signal.Signals(sig).name
        except ValueError:
            pass
    out["rusage"] = {"utime": round(rusage.ru_utime, 6), "stime": round(rusage.ru_stime, 6),
                     "maxrss_kib": rusage.ru_maxrss}
    return out
