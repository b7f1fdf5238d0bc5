"""`run`'s relay: its own stdio copied to and from pipes that the child holds (a warm server's, a fresh one's on pipes, or those standing in for a terminal).

Stdin and stdout move with splice(2) where both ends allow it (no copy
through this process), else read/write (splice's EINVAL: a file opened
O_APPEND; a socket or a terminal, where splice would wait: below); stderr always
by read/write, byte for byte (the supervisor's own lines are not there:
journal.py; `run`'s own are whole lines: stdio.OwnLines). Each end's EOF is passed
on: our stdin's closes the child's stdin; the child's stdout's puts
/dev/null on our fd 1, so our reader sees EOF while the child runs on; a
child that closed its stdin gets our fd 0 on /dev/null too, so our writer
gets EPIPE as it would writing to the child directly. Our stdout's reader
gone (EPIPE) is `reader_gone`: the caller ends the session as a disconnect.
A splice moves at most what a pipe holds (64 KiB by default), and every
move wakes a process: the child's pipes are widened to 1 MiB and our own
stdin and stdout, where they are pipes, to 256 KiB (the client's: they
count against its uid's pipe pages, so a quarter; never shrunk), where
this user may. A 5 MiB round trip still costs a process hop: +10-68%
against direct pipes to a client that only moves bytes, +2.5-14% to the
official SDK, whose own reading dominates (docs/performance.md, "Fourth
pass" and after). A chunk moved is followed by the next without a select() in
between where that cannot block (never from a terminal), and not after a
short one (the next would find src empty).
A splice asks for as much as the child's pipe holds: one move takes all
that is there (each move wakes the other end), where a read takes 64 KiB
(its buffer is made for each read).
Our own stdio are never made non-blocking (the file descriptions are our
parent's too), yet no move into them may wait for our reader: a signal to
us is forwarded between moves, and a client that stops reading, then
sends TERM, must reach the server. SPLICE_F_NONBLOCK covers a pipe, not a
socket (a node client's stdio are socketpairs) nor a terminal: what splice does not move
goes through stdio.Ours (a socket by send(MSG_DONTWAIT), a pipe or a
terminal through a non-blocking open of its own; a file as ever).
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import stat

from .. import stdio

CHUNK = 1 << 16
PIPE_SIZE = 1 << 20   # the child's pipes (fs.pipe-max-size's default)
OUR_PIPE_SIZE = 1 << 18   # ours, the client's: a quarter of that (they count against its uid's pipe pages)
BURST = 64   # chunks moved a stream at most before the others' turn
_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class Stream:
    """One direction: src to dst, until src's EOF or dst's end."""

    def __init__(self, src: int, dst: int, splice: bool, src_ours: bool) -> None:
        self.src, self.dst, self.splice = src, dst, splice
        # Into our stdout or stderr: never waiting on its reader (stdio.Ours).
        self.out = stdio.ours(dst) if src_ours else None
        if self.out is not None and not self.out.spliceable:
            self.splice = False
        # Whether a move after a move cannot block: src is a non-blocking
        # pipe of ours, or our stdin is a pipe and splice's NONBLOCK covers
        # it (a terminal or a blocking read would wait for the client).
        self.src_ours = src_ours
        self.again = src_ours or (splice and stat.S_ISFIFO(os.fstat(src).st_mode))
        self.pending = b""      # read, not yet written (read/write only: splice keeps nothing)
        self.blocked = False    # dst was full: wait until it is writable
        self.short = False      # the last move took less than a chunk: src is empty (or dst full)
        self.open = True

    def waits_to_read(self) -> bool:
        return self.open and not self.blocked and not self.pending

    def waits_to_write(self) -> bool:
        return self.open and (self.blocked or bool(self.pending))

    def burst(self) -> str | None:
        """move() again while it moves (a select() a chunk halves what a
        large message goes at): until src is empty, dst full or an end."""
        for i in range(BURST if self.again else 1):
            ended = self.move()
            if ended or self.pending:
                return ended
            if self.blocked:   # after a chunk moved: src is empty, more likely than dst full
                self.blocked = i == 0
                return None
            if self.short:     # another try would find src empty: no EAGAIN raised a chunk
                return None
        return None

    def move(self) -> str | None:
        """What is there, moved: None, or "eof" (src ended) or "epipe" (dst's reader is gone)."""
        self.blocked = False
        try:
            if self.pending:
                self._write()
                return None
            if self.splice:
                try:
                    moved = os.splice(self.src, self.dst, PIPE_SIZE, flags=_SPLICE)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self.splice = False   # one end takes no splice: copy from now on
                    self.again = self.src_ours
                    return self.move()
                self.short = moved < PIPE_SIZE
                return None if moved else "eof"
            self.pending = os.read(self.src, CHUNK)
            if not self.pending:
                return "eof"
            self.short = len(self.pending) < CHUNK
            self._write()
            return None
        except BlockingIOError:
            self.blocked = True
            return None
        except OSError as e:   # (a socket's reader gone: ECONNRESET; EIO: a terminal hung up)
            return "epipe" if e.errno in (errno.EPIPE, errno.ECONNRESET) else "eof"

    def _write(self) -> None:
        try:
            out = self.out
            self.pending = self.pending[out.write(self.pending) if out else os.write(self.dst, self.pending):]
        except BlockingIOError:
            pass   # the rest when dst is writable


class Relay:
    """The child's stdio: `child_fds` to pass to the spawn (ours, or a pipe
    for each of ours that is a terminal: terminals(); a child leading its
    own session could make a terminal its controlling one and type into
    it), or the pipes a spawn on pipes came with (take()): one or the other."""

    def __init__(self) -> None:
        self.child_fds: list[int] = [0, 1, 2]
        self.ours: list[int] = []            # the child's ends, closed once it has them
        self.streams: list[Stream] = []
        self.reader_gone = False

    def terminals(self) -> None:
        """child_fds: ours, each that is a terminal replaced by a pipe relayed here."""
        for fd in (0, 1, 2):
            if os.isatty(fd):
                r, w = os.pipe2(os.O_CLOEXEC)
                if fd == 0:
                    self.child_fds[0] = r
                    self.ours.append(r)
                    self._add(0, w)
                else:
                    self.child_fds[fd] = w
                    self.ours.append(w)
                    self._add(r, fd)

    def take(self, stdin: int, stdout: int, stderr: int) -> None:
        """The child's pipes (stdin's write end, stdout's and stderr's read
        ends), ours from now on: relayed, and closed here."""
        for src, dst in ((0, stdin), (stdout, 1), (stderr, 2)):
            self._add(src, dst)
        for fd in (stdin, stdout):
            _widen(fd, PIPE_SIZE)
        for fd in (0, 1):
            _widen(fd, OUR_PIPE_SIZE)

    def _add(self, src: int, dst: int) -> None:
        ours = dst if src == 0 else src
        os.set_blocking(ours, False)   # (a pipe only we hold; never our own stdio, shared with our parent)
        self.streams.append(Stream(src, dst, splice=dst != 2, src_ours=src != 0))

    def started(self) -> None:
        for fd in self.ours:
            os.close(fd)
        self.ours = []

    def readers(self) -> list[int]:
        return [s.src for s in self.streams if s.waits_to_read()]

    def writers(self) -> list[int]:
        return [s.dst for s in self.streams if s.waits_to_write()]

    def handle(self, readable: list[int], writable: list[int]) -> None:
        for s in list(self.streams):
            if s.open and ((s.waits_to_read() and s.src in readable) or (s.waits_to_write() and s.dst in writable)):
                ended = s.burst()
                if ended:
                    self._end(s, ended)

    def _end(self, s: Stream, how: str) -> None:
        """A stream's end passed on (the module's doc)."""
        s.open = False
        self.streams.remove(s)
        if s.src == 0:
            os.close(s.dst)              # the child's stdin ends
            if how == "epipe":
                stdio.on_devnull(0)      # the child closed it: our writer is told so
        elif how == "epipe":
            os.close(s.src)              # the child's next write gets EPIPE, as on our fd directly
            if s.dst == 1:
                self.reader_gone = True
        else:
            os.close(s.src)
            if s.dst == 1:
                stdio.on_devnull(1)      # EOF to our reader

    def drain(self, wakeup: int, patient: bool = True, timeout: float = 1.0) -> None:
        """After the child's exit: what it wrote, until EOF. Patient: what
        our reader has not taken yet is waited for as long as it takes
        (direct pipes would keep it for the reader). Pipes quiet for
        `timeout` (a leftover holding one; or our reader not reading, if not
        patient) end it, as does a signal to us (a byte on `wakeup`)."""
        for s in [s for s in self.streams if s.src == 0]:
            self._end(s, "eof")
        while self.streams and not self.reader_gone:
            writers = self.writers()
            readable, writable, _ = select.select([wakeup, *self.readers()], writers, [],
                                                  None if writers and patient else timeout)
            if wakeup in readable or not (readable or writable):
                break
            self.handle(readable, writable)
        self.close()

    def close(self) -> None:
        for s in self.streams:
            os.close(s.dst if s.src == 0 else s.src)
        self.streams = []


def _widen(fd: int, size: int) -> None:
    """A pipe made at least `size` where this user may: fewer wakeups of
    this process, the child and the client for a large message. Never
    shrunk (the client may have widened its own further); not a pipe, or
    over this user's pipe pages: left as it is."""
    try:
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < size:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError:
        pass
