"""The single-threaded event loop: a selector, a timer heap with cancel handles, signals through a wakeup fd, guarded callbacks.

Imports stay lean (no threading, logging, asyncio or subprocess): each of
them makes every fork slower, and threading would make fork unsound.
"""
from __future__ import annotations

import heapq
import itertools
import os
import selectors
import signal
import time
from collections.abc import Callable, Iterable

from .log import log

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


class Timer:
    """A callback due at some time; cancel() keeps it from running."""
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], Any]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """Selector callbacks get the selector key (the zygote handle registers
    its channel on `selector` itself); timers and callbacks run guarded."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()   # equal times run in the order they were set
        self._last: set[int] = set()    # fds handled after every other one ready in the same turn

    def at(self, delay: float, callback: Callable[[], Any]) -> Timer:
        """Run callback after delay seconds (unless cancelled)."""
        timer = Timer(callback)
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), timer))
        return timer

    def watch(self, fileobj: Any, callback: Callable[[], None], last: bool = False) -> None:
        """callback() whenever fileobj is readable; `last`: after whatever
        else is ready in the same turn (a flood there never goes first)."""
        key = self.selector.register(fileobj, selectors.EVENT_READ, lambda key: callback())
        if last:
            self._last.add(key.fd)

    def unwatch(self, fileobj: Any) -> None:
        self._last.discard(self.selector.unregister(fileobj).fd)

    def catch(self, signals: Iterable[int], handler: Callable[[set[int]], None]) -> None:
        """handler(the signal numbers received) in the loop, not in a signal handler."""
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the number

        def received() -> None:
            try:
                data = os.read(r, 512)
            except BlockingIOError:
                return
            handler(set(data))
        self.watch(r, received)

    def run(self, done: Callable[[], bool]) -> None:
        while not done():
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            ready = self.selector.select(timeout)
            if self._last and len(ready) > 1:
                ready.sort(key=lambda item: item[0].fd in self._last)
            for key, _ in ready:
                guarded(key.data, key)
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    guarded(timer.callback)


class Periodic:
    """callback() every `interval` seconds for as long as it returns true;
    start() sets it going again once it stopped."""

    def __init__(self, loop: Loop, interval: float, callback: Callable[[], bool]) -> None:
        self.loop, self.interval, self.callback = loop, interval, callback
        self.running = False

    def start(self) -> None:
        if not self.running:
            self.running = True
            self.loop.at(self.interval, self._run)

    def _run(self) -> None:
        self.running = bool(self.callback())
        if self.running:
            self.loop.at(self.interval, self._run)


def guarded(callback: Callable[..., Any], *args: Any) -> None:
    """A bug in one handler must not take the supervisor, and every child, down."""
    try:
        callback(*args)
    except Exception as e:
        log(f"internal error: {type(e).__name__}: {e}")
