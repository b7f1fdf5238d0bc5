"""`run` from a terminal: the child gets pipes, copied to and from the terminal, never the terminal itself."""
from __future__ import annotations

import os
import select


class Relay:
    """`run` from a terminal: the child gets pipes, copied here to and from
    our terminal fds, never the terminal itself (a child leading its own
    session could make it its controlling terminal and type into it)."""

    def __init__(self) -> None:
        self.child_fds: list[int] = [0, 1, 2]
        self.ours: list[int] = []          # the child's ends, closed once it has them
        self.inbound: int | None = None    # our write end of the child's stdin
        self.pending = b""
        self.outbound: dict[int, int] = {}  # our read end -> our fd it goes to
        if os.isatty(0):
            r, w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(w, False)
            self.child_fds[0], self.inbound = r, w
            self.ours.append(r)
        for fd in (1, 2):
            if os.isatty(fd):
                r, w = os.pipe2(os.O_CLOEXEC)
                self.child_fds[fd] = w
                self.outbound[r] = fd
                self.ours.append(w)

    def started(self) -> None:
        for fd in self.ours:
            os.close(fd)
        self.ours = []

    def readers(self) -> list[int]:
        fds = list(self.outbound)
        if self.inbound is not None and not self.pending:
            fds.append(0)
        return fds

    def writers(self) -> list[int]:
        return [self.inbound] if self.inbound is not None and self.pending else []

    def handle(self, readable: list[int], writable: list[int]) -> None:
        for r in [fd for fd in readable if fd in self.outbound]:
            try:
                data = os.read(r, 65536)
            except OSError:
                data = b""
            if data:
                _write_all(self.outbound[r], data)
            else:
                os.close(r)
                del self.outbound[r]
        if 0 in readable and self.inbound is not None:
            try:
                self.pending = os.read(0, 65536)
            except OSError:
                self.pending = b""
            if not self.pending:
                self._close_inbound()  # EOF (^D): the child's stdin ends too
        if self.inbound is not None and self.pending:  # non-blocking: what fits now
            try:
                self.pending = self.pending[os.write(self.inbound, self.pending):]
            except BlockingIOError:
                pass
            except OSError:  # the child closed its stdin
                self._close_inbound()

    def _close_inbound(self) -> None:
        if self.inbound is not None:
            os.close(self.inbound)
            self.inbound = None
        self.pending = b""

    def drain(self, timeout: float = 1.0) -> None:
        """After the child's exit: what it wrote, until EOF (or a leftover
        holding the pipe stays quiet for `timeout`)."""
        self._close_inbound()
        while self.outbound:
            ready = select.select(list(self.outbound), [], [], timeout)[0]
            if not ready:
                break
            self.handle(ready, [])
        for r in self.outbound:
            os.close(r)
        self.outbound = {}


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:
            return
