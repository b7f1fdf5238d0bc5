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

TYPE_CHECKING = False   # (typing's own name, without importing typing: `run` loads it after its private supervisor)
if TYPE_CHECKING:
    from typing import TextIO


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


class OwnLines:
    """Our stderr for our own lines (`run`'s): its reader gone (EPIPE), fd
    2 is put on /dev/null and the line dropped, so that a lost reader of
    what we say never ends the session or replaces the server's exit
    status with a traceback's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._mute()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._mute()

    def _mute(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2, inheritable=False)
        os.close(null)
        try:
            self.stream.flush()   # what the failed write left buffered, to /dev/null
        except OSError:
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)
