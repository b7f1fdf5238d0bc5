"""Session gids leased for the whole host: a root supervisor hands out only
the gids of the blocks of its `--session-gids` range that it holds.

A session gid keeps sessions apart only while no other process has it
(pools.Gids: prlimit(2) needs the caller's uid and gid to match the
target's). Two root supervisors would each hand out their whole range
(both on the default, unless told otherwise), so one gid could go to a
session of each, and two such sessions of one uid could prlimit each
other. So each holds a lease: flock(2) on one file per block of BLOCK
gids (`session-gids.FIRST.lock`, FIRST the block's first gid) in the
directory of the host's table of dynamic uids (ids.table_directory:
root's alone, never a link; $LANDLOCK_SUPERVISOR_DYNAMIC_UIDS moves both),
held while it serves: the kernel lets go however it ends. Blocks
lie on the gid numbers, not on anyone's range, so ranges that overlap
share blocks, never a gid. A supervisor takes the lowest run of free
blocks its range has, as many as its children need; a block in which a
live process still has a gid (left by a supervisor that crashed, or
given by one of a version that takes no lease) is not free. None free:
it does not start.
"""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

from .. import protocol
from ..manifests import ids
from . import procfs

BLOCK = 1024
Gids = tuple[int, int]   # (first, last)


def wanted(children: int) -> int:
    """The blocks a supervisor with this children limit leases: room for
    twice as many gids (a pooled child has one too, and a released gid
    comes back last)."""
    return max(1, -(-2 * children // BLOCK))


def runs(gids: Gids, count: int) -> Iterator[Gids]:
    """The gids of each run of `count` consecutive blocks that the range
    touches (of all of them, when it touches fewer), clipped to the range,
    lowest first. Pure."""
    first, last = gids[0] // BLOCK, gids[1] // BLOCK
    count = min(count, last - first + 1)
    for block in range(first, last - count + 2):
        yield max(gids[0], block * BLOCK), min(gids[1], (block + count) * BLOCK - 1)


def lease(gids: Gids, children: int) -> tuple[Gids, list[int]]:
    """(the gids this supervisor may hand out, the lock files' fds: they
    hold the lease while they are open, until the process ends). IdError
    when no run of the range is free; OSError when the directory or a
    lock file cannot be opened."""
    directory = ids.table_directory(os.path.dirname(ids.host_table()), create=True)
    assert directory is not None
    try:
        count = 0
        for run in runs(gids, wanted(children)):
            count += 1
            fds = _lock(directory, run)
            if fds is None:
                continue
            if not _in_use(run):
                return run, fds
            protocol.close_all(fds)
    finally:
        os.close(directory)
    raise ids.IdError(f"--session-gids {gids[0]}-{gids[1]}: none of its {count} run(s) of up to {wanted(children)} "
                      f"block(s) of {BLOCK} gids is free: each is another running supervisor's, or a process "
                      "still has one of its gids. Give this supervisor a range of its own")


def _lock(directory: int, run: Gids) -> list[int] | None:
    """The run's lock files, each flocked; None when another holds one."""
    fds: list[int] = []
    try:
        for block in range(run[0] // BLOCK, run[1] // BLOCK + 1):
            fds.append(os.open(f"session-gids.{block * BLOCK}.lock",
                               os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory))
            fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        protocol.close_all(fds)
        return None
    except BaseException:
        protocol.close_all(fds)
        raise
    return fds


def _in_use(run: Gids) -> bool:
    """Whether a live process has a gid of the run (looked at once its lock
    is held: no supervisor that leases can give one out any more)."""
    return bool(held(*run))


def held(first: int, last: int) -> set[int]:
    """The gids of first..last that a process has (real, effective, saved
    or filesystem): at a lease, and at each round of a leased run (pools.Gids)."""
    return {gid for pid in procfs.pids() for gid in procfs.gids_of(pid) if first <= gid <= last}
