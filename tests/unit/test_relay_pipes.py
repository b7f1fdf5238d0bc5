"""relay's pipe sizes: the child's widened to 1 MiB, ours (the client's) to 256 KiB, neither ever shrunk."""
import fcntl
import os

from supervisor import stdio
from supervisor.client import relay


def _size(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)


def test_a_pipe_is_widened_and_never_shrunk(tmp_path):
    r, w = os.pipe2(os.O_CLOEXEC)
    wide_r, wide_w = os.pipe2(os.O_CLOEXEC)
    fcntl.fcntl(wide_w, fcntl.F_SETPIPE_SZ, 1 << 20)
    try:
        relay._widen(w, relay.OUR_PIPE_SIZE)
        assert _size(r) == relay.OUR_PIPE_SIZE == 1 << 18
        relay._widen(wide_r, relay.OUR_PIPE_SIZE)   # the client made it larger: kept
        assert _size(wide_r) == 1 << 20
        with open(tmp_path / "f", "wb") as f:
            relay._widen(f.fileno(), relay.PIPE_SIZE)   # not a pipe: left as it is
    finally:
        for fd in (r, w, wide_r, wide_w):
            os.close(fd)


def test_take_widens_the_childs_pipes_and_ours(monkeypatch):
    """take(): the child's stdin and stdout pipes to PIPE_SIZE, our fds 0 and 1 to OUR_PIPE_SIZE."""
    widened = []
    monkeypatch.setattr(relay, "_widen", lambda fd, size: widened.append((fd, size)))
    monkeypatch.setattr(relay.os, "set_blocking", lambda fd, blocking: None)
    try:
        relay.Relay().take(10, 11, 12)
    finally:
        for fd in (1, 2):
            stdio.forget(fd)   # (the writers of our fds 1 and 2 take() made: this process's are pytest's)
    assert widened == [(10, relay.PIPE_SIZE), (11, relay.PIPE_SIZE), (0, relay.OUR_PIPE_SIZE),
                       (1, relay.OUR_PIPE_SIZE)]
