"""A process's fds 0-2, open before it makes any fd of its own.

A command started with one of them closed would otherwise give that number
to the first fd it makes: a received fd (the supervisor), the signal
wakeup pipe or the socket (`run`), which would then be a server's stdio,
or be relayed to as our own. Light to import: `run` is on an MCP client's
path.
"""
from __future__ import annotations

import os
import sys


def keep_stdio_open() -> None:
    """Each of fds 0-2 that is closed opened on /dev/null; Python's
    sys.stdout and sys.stderr, None for a closed one, made again."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open("/dev/null", os.O_RDWR)
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)   # (print would write nowhere, or fail)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)   # (print(file=None) would write to stdout: the MCP stream)
