"""The event loop's order within one batch of ready fds."""
from __future__ import annotations

import os

from supervisor.daemon.loop import Loop


def test_an_fd_watched_last_is_handled_after_the_others_ready_with_it() -> None:
    loop = Loop()
    pipes = [os.pipe() for _ in range(3)]
    order: list[str] = []
    try:
        for (r, w), name in zip(pipes, ("records", "reply", "exit")):
            os.write(w, b"x")   # all ready before the loop looks
            loop.watch(r, lambda r=r, name=name: (os.read(r, 1), order.append(name)), last=name == "records")
        loop.run(lambda: len(order) == 3)
        assert order[-1] == "records" and sorted(order[:2]) == ["exit", "reply"]
        loop.unwatch(pipes[0][0])   # forgotten with its fd
        assert not loop._last
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
