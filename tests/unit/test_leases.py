"""Session gids leased for the whole host (supervisor/daemon/leases.py):
the runs of blocks a range offers, as a table; the lease itself against
a table directory of the test's own, flocked by this process."""
from __future__ import annotations

import errno
import fcntl
import os

import pytest

from supervisor.daemon import leases
from supervisor.manifests import ids
from supervisor.zygote.pools import Gids

B = leases.BLOCK

RUNS = [
    # what, range, blocks wanted, the runs offered
    ("one block, whole", (B, 2 * B - 1), 1, [(B, 2 * B - 1)]),
    ("a range inside a block: itself", (B + 5, B + 6), 1, [(B + 5, B + 6)]),
    ("blocks lie on the numbers: a range across two is clipped to each",
     (B + 1000, 2 * B + 10), 1, [(B + 1000, 2 * B - 1), (2 * B, 2 * B + 10)]),
    ("runs of two overlap", (0, 3 * B - 1), 2, [(0, 2 * B - 1), (B, 3 * B - 1)]),
    ("more wanted than the range touches: all of it, once", (B + 3, 2 * B + 3), 5, [(B + 3, 2 * B + 3)]),
    ("the default range: 64 blocks", ids.DEFAULT_SESSION_GIDS, 1,
     [(ids.DEFAULT_SESSION_GIDS[0] + i * B, ids.DEFAULT_SESSION_GIDS[0] + (i + 1) * B - 1) for i in range(64)]),
]


@pytest.mark.parametrize("gids,count,expected", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_runs(gids, count, expected):
    assert list(leases.runs(gids, count)) == expected


@pytest.mark.parametrize("children,blocks", [(1, 1), (256, 1), (512, 1), (513, 2), (2000, 4)])
def test_wanted(children, blocks):
    """Room for twice the children limit."""
    assert leases.wanted(children) == blocks


# Far above the default range (no gid any process here has), on a block's first gid.
FREE = (2_929_688 * B, 2_929_691 * B - 1)   # three blocks from 3000000512


@pytest.fixture
def table(tmp_path, monkeypatch):
    directory = tmp_path / "ids"
    monkeypatch.setenv(ids.TABLE_ENV, str(directory / "dynamic-uids"))
    return directory


def test_lease_takes_the_lowest_free_run_and_holds_it(table):
    gids, fds = leases.lease(FREE, 256)
    try:
        assert gids == (FREE[0], FREE[0] + B - 1)
        assert sorted(os.listdir(table)) == [f"session-gids.{FREE[0]}.lock"]
        assert all(os.get_inheritable(fd) is False for fd in fds)
        # Held: another open file description cannot lock it.
        other = os.open(table / f"session-gids.{FREE[0]}.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(other)
        # So the next lease is the next block, and with two blocks wanted, the two after.
        second, more = leases.lease(FREE, 256)
        third, most = leases.lease(FREE, 1)
        assert second == (FREE[0] + B, FREE[0] + 2 * B - 1) and third == (FREE[0] + 2 * B, FREE[1])
        with pytest.raises(ids.IdError, match=r"--session-gids \d+-\d+: none of its 3 run\(s\) of up to 1 block"):
            leases.lease(FREE, 1)
        for fd in more + most:
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    # Let go once closed.
    again, fds = leases.lease(FREE, 1)
    assert again == (FREE[0], FREE[0] + B - 1)
    for fd in fds:
        os.close(fd)


def test_a_run_needs_every_block_free(table):
    """Two blocks wanted: a run with one held is passed over, and none left is refused."""
    middle, held = leases.lease((FREE[0] + B, FREE[0] + 2 * B - 1), 1)
    try:
        with pytest.raises(ids.IdError, match="none of its 2 run"):
            leases.lease(FREE, B)
    finally:
        for fd in held:
            os.close(fd)


def test_a_gid_in_use_keeps_its_block(table, monkeypatch):
    """A block where a live process has a gid is let go and passed over."""
    monkeypatch.setattr(leases.procfs, "pids", lambda: [1, 2])
    monkeypatch.setattr(leases.procfs, "gids_of", lambda pid: {FREE[0] + 7} if pid == 2 else {0})
    gids, fds = leases.lease(FREE, 1)
    assert gids == (FREE[0] + B, FREE[0] + 2 * B - 1)
    for fd in fds:
        os.close(fd)
    monkeypatch.undo()
    gids, fds = leases.lease(FREE, 1)   # the passed-over block was not kept locked
    assert gids[0] == FREE[0]
    for fd in fds:
        os.close(fd)


def test_the_directory_must_be_roots_alone(table):
    table.mkdir(mode=0o777)
    os.chmod(table, 0o777)
    with pytest.raises(ids.IdError, match="only the supervisor's user may write"):
        leases.lease(FREE, 1)
    assert os.listdir(table) == []


# ---- handing out a leased run's gids (zygote/pools.Gids) ---------------------------------------

TAKES = [
    # what, the looks' answers in turn, what is released before each take (None: nothing), the gids taken
    ("round the range, a released gid last", [set()] * 3, [None, None, None, 11, None], [10, 11, 12, 11, "EAGAIN"]),
    ("a gid held at the round's look is passed over", [{11}], [None, None], [10, 12]),
    ("held then, free at the next round's look", [{11}, set()], [None, None, 10, 12], [10, 12, 10, 11]),
    ("one passed over before the look is taken after it", [{12}, set()], [None, None, None], [10, 11, 12]),
    ("every gid not in use held: refused", [{11, 12}, {11, 12}], [None, None], [10, "EAGAIN"]),
    ("in use at the look, no process yet (a pooled child not forked), released: passed over till the next look",
     [set(), set(), {12}], [None, None, None, 10, 12], [10, 11, 12, 10, "EAGAIN"]),
    ("free again after the take's own look: found, wherever the take began",
     [{11, 12}, {11}], [None, None], [10, 12]),
]


@pytest.mark.parametrize("looks,released,expected", [t[1:] for t in TAKES], ids=[t[0] for t in TAKES])
def test_gids_taken(looks, released, expected):
    """A look at the start of each round (when `first` comes round), and
    none between: only take() gives out the range's gids."""
    answers = iter(looks)
    calls = []

    def held(first, last):
        calls.append((first, last))
        return next(answers)

    gids = Gids(10, 12, held)
    taken = []
    for release, want in zip(released, expected):
        gids.release(release)
        try:
            taken.append(gids.take())
        except OSError as e:
            assert e.errno == errno.EAGAIN, e
            taken.append("EAGAIN")
    assert taken == expected
    assert calls and set(calls) == {(10, 12)}
