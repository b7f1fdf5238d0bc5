"""A process's fds 0-2: open before it makes any fd of its own, and (`run`'s) written without waiting on their reader.

A command started with one of them closed would otherwise give that number
to the first fd it makes: a received fd (the supervisor), the signal
wakeup pipe or the socket (`run`), which would then be a server's stdio,
or be relayed to as our own. `run`'s stdout and stderr are its client's:
what it relays and the lines it says itself never wait on a client that
stops reading (Ours, OwnLines), or a signal the client sends would wait
too. Light to import: `run` is on an MCP client's path.
"""
from __future__ import annotations

import _socket   # (the C type: socket.py's enums and selectors are ~4 ms of every `run`)
import errno
import os
import select
import stat
import sys
import time

_TTYAUX_MAJOR = 5   # /dev/tty, /dev/console, /dev/ptmx: aliases, each open resolves anew
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


def room(fd: int) -> bool:
    """Whether a write of PIPE_BUF bytes into fd goes without waiting (a
    pipe: a free slot; a reader gone counts: the write then fails)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))


class Ours:
    """One of our own fds 1 and 2, written without waiting on its reader
    (its file description is our parent's too: blocking, never made
    otherwise). A socket (a node client's stdio) by send(MSG_DONTWAIT)
    through a dup of its own; a pipe or a terminal (a pty nobody reads, a
    tty stopped with ^S) through an open of its own, made non-blocking
    (/proc/self/fd/N), else (that open refused) a pipe PIPE_BUF at a time
    once poll() finds room just before (a write that small then never
    waits, unless another process writing that pipe took the room
    meanwhile); anything else (a file, a terminal whose open was refused)
    as it is. `mid_line`: the last byte written was no newline (the
    server's, when ours come); `owed`: a line of ours broke off, a newline
    goes before anything else."""

    def __init__(self, fd: int) -> None:
        st = os.fstat(fd)
        mode = st.st_mode
        self.fd, self.mid_line, self.owed = fd, False, False
        self.sock = _socket.socket(fileno=os.dup(fd)) if stat.S_ISSOCK(mode) else None
        self.fifo, self.own, tty = stat.S_ISFIFO(mode), -1, os.isatty(fd)
        # A splice into a socket or a terminal waits for room, whatever SPLICE_F_NONBLOCK says.
        self.spliceable = self.sock is None and not tty
        # (A terminal's alias opened again is whatever it resolves to now: a new pty, for ptmx.)
        if self.fifo or (tty and os.major(st.st_rdev) != _TTYAUX_MAJOR):
            self.own = _reopened(fd, st)

    def write(self, data: bytes | memoryview) -> int:
        """What went without waiting; BlockingIOError if nothing could (and whatever os.write raises)."""
        if self.owed:
            self._write(b"\n")
            self.owed = self.mid_line = False
        n = self._write(data)
        if n:
            self.mid_line = bytes(data[n - 1:n]) != b"\n"
        return n

    def _write(self, data: bytes | memoryview) -> int:
        if self.sock is not None:
            return self.sock.send(data, _socket.MSG_DONTWAIT)
        if self.own >= 0:
            return os.write(self.own, data)
        if self.fifo:
            if not room(self.fd):
                raise BlockingIOError(errno.EAGAIN, "no room")
            return os.write(self.fd, data[:select.PIPE_BUF])
        return os.write(self.fd, data)

    def close(self) -> None:
        """Its dup or open of its own: our reader sees EOF once the fd goes too."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.own >= 0:
            os.close(self.own)
            self.own = -1


def _reopened(fd: int, st: os.stat_result) -> int:
    """fd's file opened again, write-only and non-blocking, or -1 where
    that open is refused: a pipe with no reader left (ENXIO), another
    uid's or a policy of our own (EACCES); a terminal hung up (EIO) or
    exclusive (EBUSY; O_NOCTTY: never made ours to control). It must be
    the same file (its inode), or it is not ours to write."""
    try:
        own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return -1
    got = os.fstat(own)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
        os.close(own)
        return -1
    return own


_ours: dict[int, Ours] = {}


def ours(fd: int) -> Ours:
    """The one Ours of fd 1 or 2 (the relay and our own lines share it)."""
    if fd not in _ours:
        _ours[fd] = Ours(fd)
    return _ours[fd]


def forget(fd: int) -> None:
    """fd replaced (/dev/null put on it): its Ours closed, made again if asked for."""
    out = _ours.pop(fd, None)
    if out is not None:
        out.close()


def forked() -> None:
    """In a process forked from `run` (its private supervisor), before it
    moves any fd: run's writers stay run's. Each Ours' fd of its own is
    closed (it holds a number the child is about to give to something
    else), and sys.stderr is the plain stream again (a partial line of
    run's is run's to write)."""
    for fd in list(_ours):
        forget(fd)
    if isinstance(sys.stderr, OwnLines):
        sys.stderr = sys.stderr.stream  # type: ignore[assignment]


def on_devnull(fd: int) -> None:
    """Our fd replaced by /dev/null: the other end's holder sees it closed
    (no dup of ours keeps it), and no later open takes the number."""
    forget(fd)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.dup2(null, fd, inheritable=False)
    os.close(null)


class OwnLines:
    """Our stderr for our own lines (`run`'s), never waiting long on its
    reader: each line whole, after a newline if the server's bytes before
    it ended mid-line; a line that finds no room within LINE_WAIT is
    dropped (and the next ones at once, until one goes), for a client that
    stops reading stderr must still get its signals to the server; its
    reader gone (EPIPE), fd 2 is put on /dev/null and the line dropped, so
    that a lost reader of what we say never ends the session or replaces
    the server's exit status with a traceback's."""

    LINE_WAIT = 0.5

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.partial = ""
        self.dropping = False

    def write(self, text: str) -> int:
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self._put(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.partial:
            text, self.partial = self.partial, ""
            self._put(text)

    def _put(self, text: str) -> None:
        out = ours(2)
        prefix = "\n" if out.mid_line and not out.owed else ""
        data = memoryview((prefix + text).encode(self.stream.encoding or "utf-8", "backslashreplace"))
        whole = len(data)
        deadline = time.monotonic() + (0 if self.dropping else self.LINE_WAIT)
        try:
            while data:
                try:
                    data = data[out.write(data):]
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not select.select([], [2], [], remaining)[1]:
                        self.dropping = True   # not read: dropped, as the next ones are at once
                        out.owed = out.owed or len(data) < whole   # broken off: no server byte may continue it
                        return
            self.dropping = False
        except OSError as e:   # (our reader gone; anything else is no reader's doing)
            if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
            on_devnull(2)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)
