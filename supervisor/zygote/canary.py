"""One child's canary (landlock.enter.mark_domain): made by the zygote before the fork, removed when its child never ran."""
from __future__ import annotations

import os


def make(root: str | None) -> str | None:
    """One child's canary (landlock.enter.mark_domain): an empty file in the
    supervisor's canary root with a random name nobody else can learn (the
    root is root's, 0711: not listable), writable by any uid (0666: DAC
    decides before Landlock, and must let the write through to be denied by
    the domain). None without a root (denials not read) or when it cannot
    be made: that child's denials are then not attributed, and the zygote
    says why."""
    if root is None:
        return None
    path = f"{root}/{os.urandom(16).hex()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)   # whatever our umask
        finally:
            os.close(fd)
    except OSError as e:
        os.write(2, f"landlock-supervisor zygote: no canary for a child: {e}\n".encode(errors="replace"))
        return None
    return path


def remove(canary: str | None) -> None:
    """A child that never ran: its canary goes (the supervisor removes the
    others once their record came)."""
    if canary is not None:
        try:
            os.unlink(canary)
        except OSError:
            pass
