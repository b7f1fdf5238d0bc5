"""The big client: this process grown to a large heap of small objects, with threads that wake often."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from .measure import rss_kib


class BigHeap:
    """~1 GiB of small objects, every page touched, and a few threads that
    wake up often to do a little work, as a proxy's I/O threads do."""

    def __init__(self, mib: int, threads: int, busy: int) -> None:
        self.objects: list[Any] = []
        self.base_kib = rss_kib()
        self.grow(mib)
        self.stop = False
        self.threads = []
        for i in range(threads):
            interval = (0.001, 0.005, 0.02, 0.1)[i % 4]
            t = threading.Thread(target=self._sleeper, args=(interval,), daemon=True)
            t.start()
            self.threads.append(t)
        for _ in range(busy):
            t = threading.Thread(target=self._busy, daemon=True)
            t.start()
            self.threads.append(t)
        self.thread_count = len(os.listdir("/proc/self/task"))

    def grow(self, mib: int) -> None:
        """Until this process holds mib MiB more than it did at the start."""
        target_kib = self.base_kib + mib * 1024
        chunk = 16384
        while rss_kib() < target_kib:
            # bytes of ~1 KiB (malloc'd, 4 KiB pages: THP is madvise-only here)
            # and a dict every 16 objects, as a proxy's request state would be.
            block: list[Any] = [bytes(1000) for _ in range(chunk)]
            block += [{"id": i, "name": f"r{i}"} for i in range(chunk // 16)]
            self.objects.append(block)
        self.rss_kib = rss_kib()

    def _sleeper(self, interval: float) -> None:
        state: dict[int, int] = {}
        i = 0
        while not self.stop:
            time.sleep(interval)
            i += 1
            state[i % 64] = i

    def _busy(self) -> None:
        x = 0
        while not self.stop:
            x += 1

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join()
        self.objects.clear()
