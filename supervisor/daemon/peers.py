"""Who is asking: the kernel's word (SO_PEERCRED, SO_PEERPIDFD), never the request's."""
from __future__ import annotations

import functools
import os
import signal
import socket
import struct
from dataclasses import dataclass

from .procfs import stat_fields

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5
_UCRED = struct.Struct("3i")


@dataclass
class Peer:
    """A client as the kernel shows it (SO_PEERCRED), its pid pinned by a pidfd."""
    pid: int
    uid: int
    gid: int
    pidfd: int = -1   # pins pid against reuse while we look at /proc

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def alive(self) -> bool:
        if self.pidfd < 0:
            return True
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # another uid's (a --allow-uid peer of a user's supervisor): alive


def credentials(sock: socket.socket) -> Peer:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    try:
        # (close-on-exec already: the kernel makes every pidfd so; tests/unit/test_peers.py)
        pidfd = struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError:
        pidfd = -1
    return Peer(pid, uid, gid, pidfd)


def process_key(peer: Peer) -> tuple[int, int]:
    """Names the peer's process for good, as no pid does: its pidfd's inode
    where pidfs numbers them uniquely (Linux >= 6.9; one fstat), else its
    pid and start time (a read of /proc/PID/stat). Raises OSError."""
    if peer.pidfd >= 0 and _pidfs_unique():
        return -1, os.fstat(peer.pidfd).st_ino
    return peer.pid, int(stat_fields(peer.pid)[19])


@functools.cache
def _pidfs_unique() -> bool:
    """Whether two processes' pidfds have different inodes (pidfs), found once
    (before pidfs, every pidfd is the one anonymous inode)."""
    fds = []
    try:
        fds = [os.pidfd_open(os.getpid()), os.pidfd_open(os.getppid())]
        return os.fstat(fds[0]).st_ino != os.fstat(fds[1]).st_ino
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ancestor is pid or one of its ancestors. As a subreaper, the
    supervisor inherits its orphaned descendants, so the chain holds for them.

    Fails closed: a chain it cannot read (out of fds, say) counts as
    descending. An ancestor that vanishes mid-walk had its children
    reparented: the walk starts again, a few times. A pid that cannot be
    seen at all is gone (the caller checks that) or another uid's under
    /proc's hidepid: no descendant of ours, whose children share our uid."""
    for _ in range(3):
        current, seen = pid, 0
        while current > 1 and seen < 4096:
            if current == ancestor:
                return True
            try:
                current = int(stat_fields(current)[1])
            except (FileNotFoundError, ProcessLookupError):
                if current == pid:
                    return False
                break  # an ancestor is gone: walk again from pid
            except (OSError, ValueError, IndexError):
                return True
            seen += 1
        else:
            return current == ancestor
    return True
