"""Whether a cached ruleset is current, known from the kernel's events (supervisor/daemon/currency.py): the
lookups a path's resolution reads, the events parsed, and every change that can make a path name another
inode seen, where a quiet check makes no stat at all."""
from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import landlock
from landlock.report import Report
from landlock.ruleset import PathIdentity
from supervisor.daemon import currency
from supervisor.daemon.currency import Currency, filesystems, lookups, parse_events


def ancestors(path: str) -> list[str]:
    """The directories read to look up path's own name: "/" down to its parent."""
    out, at = ["/"], "/"
    for name in path.strip("/").split("/")[:-1]:
        at = os.path.join(at, name)
        out.append(at)
    return out


@pytest.fixture(autouse=True)
def rearm_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ruleset armed again as soon as it is found current after an event
    (the supervisor waits REARM_AFTER: test_a_churning_directory_costs_stats_not_walks)."""
    monkeypatch.setattr(currency, "REARM_AFTER", 0.0)


@pytest.fixture
def tree(tmp_path: Path) -> str:
    """d/a/b/file; d/link -> a; d/abs -> <d>/a; d/loop1 <-> d/loop2."""
    base = os.path.realpath(tmp_path)
    d = os.path.join(base, "d")
    os.makedirs(os.path.join(d, "a", "b"))
    Path(d, "a", "b", "file").write_text("x")
    os.symlink("a", os.path.join(d, "link"))
    os.symlink(os.path.join(d, "a"), os.path.join(d, "abs"))
    os.symlink("loop2", os.path.join(d, "loop1"))
    os.symlink("loop1", os.path.join(d, "loop2"))
    return d


LOOKUPS = [
    # (case, path under d, follow, the directories read below d's parent's chain, or None)
    ("plain", "a/b/file", False, ["d", "d/a", "d/a/b"]),
    ("a link on the way is followed", "link/b/file", False, ["d", "d/a", "d/a/b"]),
    ("a trailing link, not followed", "link", False, ["d"]),
    ("a trailing link, followed", "link", True, ["d"]),
    ("an absolute link: / and its chain read again (once each)", "abs/b", False, ["d", "d/a"]),
    ("a missing component: the walk stops where it lacks", "missing/x", False, ["d"]),
    ("dot-dot is the parent by name", "a/../a/b", False, ["d", "d/a"]),
    ("a loop", "loop1", True, None),
    ("a file as a directory", "a/b/file/x", False, None),
]


@pytest.mark.parametrize("case,path,follow,expected", LOOKUPS, ids=[c[0] for c in LOOKUPS])
def test_lookups(tree: str, case: str, path: str, follow: bool, expected: list[str] | None) -> None:
    parent = os.path.dirname(tree)
    want = None if expected is None else ancestors(tree) + [os.path.join(parent, e) for e in expected]
    assert lookups(os.path.join(tree, path), follow) == want


def test_a_relative_path_is_not_followed() -> None:
    assert lookups("etc/hosts", False) is None


def _event(wd: int, mask: int, name: bytes = b"") -> bytes:
    padded = name + b"\0" * (-len(name) % 16 or (16 if name else 0))
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


EVENTS = [
    ("none", b"", set(), False),
    ("two watches named", _event(1, 0x100, b"new") + _event(3, 0x200, b"gone") + _event(1, 0x40, b"a"), {1, 3}, False),
    ("the queue overflowed", _event(-1, 0x4000), set(), True),
    ("overflow among others", _event(2, 0x80, b"x") + _event(-1, 0x4000), {2}, True),
]


@pytest.mark.parametrize("case,buffer,wds,overflow", EVENTS, ids=[c[0] for c in EVENTS])
def test_parse_events(case: str, buffer: bytes, wds: set[int], overflow: bool) -> None:
    assert parse_events(buffer) == (wds, overflow)


def test_filesystems() -> None:
    text = (b"27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            b"24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755\n"
            b"90 27 0:52 / /home rw master:3 - nfs4 server:/home rw\n"
            b"garbage\n")
    assert filesystems(text) == {os.makedev(254, 0): "ext4", os.makedev(0, 6): "devtmpfs",
                                 os.makedev(0, 52): "nfs4"}


class Counted(landlock.Ruleset):
    """A ruleset of paths only (no fd), counting its stat checks."""
    checks = 0

    def is_current(self) -> bool:
        self.checks += 1
        return super().is_current()


PINNED: list[int] = []


@pytest.fixture(autouse=True)
def _unpin():
    yield
    while PINNED:
        os.close(PINNED.pop())


def ruleset_of(*paths: tuple[str, bool]) -> Counted:
    """Its inodes held open, as a real ruleset's rules hold theirs: no
    inode number freed and given to the next file made (ext4 would)."""
    identity: list[PathIdentity] = []
    for path, follow in paths:
        try:
            PINNED.append(os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)))
        except FileNotFoundError:
            identity.append((path, None, False))
            continue
        st = os.fstat(PINNED[-1])
        identity.append((path, (st.st_dev, st.st_ino), follow))
    return Counted(-1, 0, Report(), tuple(identity))


def quietly(check: Callable[[], bool], rearm: Callable[[], None], tries: int = 3) -> bool:
    """Whether check() found the ruleset current without a stat in one of
    `tries` tries. The tree's ancestors (/tmp among them) are every
    process's: an entry another one makes there is an event too (stat'ed:
    right, not quiet), so a quiet check is asked for more than once."""
    for _ in range(tries):
        if check():
            return True
        rearm()
    return False


def local(path: str) -> bool:
    types = filesystems(Path("/proc/self/mountinfo").read_bytes())
    return types.get(os.stat(path).st_dev) in currency.LOCAL


def _replace_file(d: str) -> None:
    os.unlink(os.path.join(d, "a/b/file"))
    Path(d, "a/b/file").write_text("x")


def _replace_directory(d: str, keep: bool = False) -> None:
    os.rename(os.path.join(d, "a"), os.path.join(d, "old-a"))
    os.makedirs(os.path.join(d, "a/b"))
    if keep:   # the file's very inode, under a new directory
        os.link(os.path.join(d, "old-a/b/file"), os.path.join(d, "a/b/file"))
    else:
        Path(d, "a/b/file").write_text("x")


def _retarget_link(d: str) -> None:
    os.makedirs(os.path.join(d, "c/b"))
    os.link(os.path.join(d, "a/b/file"), os.path.join(d, "c/b/file"))
    os.unlink(os.path.join(d, "link"))
    os.symlink("c", os.path.join(d, "link"))


CHANGES: list[tuple[str, Callable[[str], object], bool, bool]] = [
    # (case, change, still current, found without a stat)
    ("nothing", lambda d: None, True, True),
    ("the file written", lambda d: Path(d, "a/b/file").write_text("y"), True, True),
    ("a directory chmodded", lambda d: os.chmod(os.path.join(d, "a"), 0o700), True, True),
    ("an unrelated entry made beside: stat'ed, still current", lambda d: Path(d, "a/other").write_text(""),
     True, False),
    ("the file replaced", _replace_file, False, False),
    ("a directory on the way replaced", _replace_directory, False, False),
    # A rule holds the inode a path named: the same inode by another way is the same rule.
    ("a directory on the way replaced, the file's inode kept", lambda d: _replace_directory(d, keep=True),
     True, False),
    ("a link on the way retargeted, the file's inode kept", _retarget_link, True, False),
    ("the missing path made", lambda d: os.makedirs(os.path.join(d, "missing/x")), False, False),
]


@pytest.mark.parametrize("case,change,current,quiet", CHANGES, ids=[c[0] for c in CHANGES])
def test_every_change_is_seen(tree: str, case: str, change: Callable[[str], object], current: bool,
                              quiet: bool) -> None:
    ruleset = ruleset_of((os.path.join(tree, "a/b/file"), False), (os.path.join(tree, "link/b/file"), False),
                         (os.path.join(tree, "missing/x"), False))
    watch = Currency()
    try:
        assert watch.current(ruleset) and ruleset.checks == 1 and id(ruleset) not in watch.armed
        watch.arm_pending()   # (the supervisor's next turn, once the request is answered)
        assert ruleset.checks == 2 - (not local(tree))   # armed: its directories watched, then stat'ed again
        assert (id(ruleset) in watch.armed) == local(tree)

        def check() -> bool:
            checks = ruleset.checks
            change(tree)
            assert watch.current(ruleset) == current
            return ruleset.checks == checks
        if not quiet:
            assert not check()
        elif local(tree):
            assert quietly(check, watch.arm_pending)
    finally:
        watch.close()


def test_quiet_checks_make_no_system_call_but_two(tree: str) -> None:
    """Armed: a check is the mount table's poll and inotify's read, whatever the paths."""
    ruleset = ruleset_of(*[(os.path.join(tree, "a/b/file"), False)] * 40)
    watch = Currency()
    try:
        watch.current(ruleset)
        watch.arm_pending()
        assert id(ruleset) in watch.armed or not local(tree)

        def check() -> bool:
            checks = ruleset.checks
            assert all(watch.current(ruleset) for _ in range(5))
            return ruleset.checks == checks
        assert quietly(check, watch.arm_pending) == local(tree)
    finally:
        watch.close()


def test_a_path_where_inotify_is_blind_is_stat_ed_each_time() -> None:
    ruleset = ruleset_of(("/proc/sys/kernel/hostname", False), ("/etc/hosts", False))
    watch = Currency()
    try:
        assert watch.current(ruleset)
        watch.arm_pending()
        assert watch.current(ruleset)
        assert id(ruleset) not in watch.armed and ruleset.checks == 2 and not watch.users
    finally:
        watch.close()


def test_an_overflowed_queue_puts_every_ruleset_in_doubt(tree: str) -> None:
    if not local(tree):
        pytest.fail(f"{tree} is on a filesystem inotify cannot watch here", pytrace=False)
    first, second = ruleset_of((os.path.join(tree, "a/b/file"), False)), ruleset_of((os.path.join(tree, "link"), False))
    watch = Currency()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        assert watch.current(first) and watch.current(second)
        watch.arm_pending()
        os.close(watch.inotify)
        watch.inotify = r   # what inotify would say: events lost
        os.write(w, _event(-1, 0x4000))
        assert watch.current(first) and first.checks == 3
        assert watch.armed[id(second)].dirty
    finally:
        os.close(w)
        watch.inotify = -1
        watch.close()
        os.close(r)


def test_forget_lets_the_watches_go(tree: str) -> None:
    first, second = ruleset_of((os.path.join(tree, "a/b/file"), False)), ruleset_of((os.path.join(tree, "link"), False))
    watch = Currency()
    try:
        watch.current(first)
        watch.current(second)
        watch.arm_pending()
        shared = set(watch.armed[id(first)].wds) & set(watch.armed[id(second)].wds) if local(tree) else set()
        watch.forget(first)
        assert set(watch.users) == set(watch.armed[id(second)].wds) if local(tree) else not watch.users
        assert shared <= set(watch.users)
        watch.forget(second)
        assert not watch.users and not watch.armed
    finally:
        watch.close()


_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root (in a mount namespace of its own)")
def test_a_mount_over_a_path_is_seen(tree: str) -> None:
    """A bind mount over the file, in a mount namespace of the test's own
    (the child's, so the host's mounts are untouched): no entry changed in
    any directory, the path names another inode."""
    if not local(tree):
        pytest.fail(f"{tree} is on a filesystem inotify cannot watch here", pytrace=False)
    other = Path(tree, "other")
    other.write_text("other")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(_CLONE_NEWNS) or libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None):
                os._exit(2)
            target = os.path.join(tree, "a/b/file")
            ruleset = ruleset_of((target, False))
            watch = Currency()
            armed = watch.current(ruleset)
            watch.arm_pending()
            armed = armed and id(ruleset) in watch.armed and watch.current(ruleset)
            if armed and libc.mount(str(other).encode(), target.encode(), None, _MS_BIND, None) == 0:
                code = 0 if not watch.current(ruleset) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_after_a_link_moved_its_new_directories_are_watched(tree: str) -> None:
    if not local(tree):
        pytest.fail(f"{tree} is on a filesystem inotify cannot watch here", pytrace=False)
    ruleset = ruleset_of((os.path.join(tree, "link/b/file"), False))
    watch = Currency()
    try:
        assert watch.current(ruleset)
        watch.arm_pending()
        _retarget_link(tree)
        assert watch.current(ruleset) and ruleset.checks == 3   # stat'ed
        watch.arm_pending()                                      # armed anew: c watched
        assert watch.current(ruleset) and id(ruleset) in watch.armed
        os.unlink(os.path.join(tree, "c/b/file"))
        Path(tree, "c/b/file").write_text("new")
        assert not watch.current(ruleset)
    finally:
        watch.close()


def test_a_churning_directory_costs_stats_not_walks(tree: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found dirty sooner than REARM_AFTER after its arming, a ruleset is
    stat'ed (the cost of before) and not walked and watched again at each
    spawn (~20 times a stat's cost): once the time is past, it is armed again.
    A path where inotify is blind is not tried again sooner either."""
    if not local(tree):
        pytest.fail(f"{tree} is on a filesystem inotify cannot watch here", pytrace=False)
    monkeypatch.setattr(currency, "REARM_AFTER", 3600.0)
    walks: list[object] = []
    walk = currency.directories

    def counted(paths: Iterable[tuple[str, bool]]) -> list[str] | None:
        walks.append(paths)
        return walk(paths)
    monkeypatch.setattr(currency, "directories", counted)
    ruleset = ruleset_of((os.path.join(tree, "a/b/file"), False))
    blind = ruleset_of(("/proc/sys/kernel/hostname", False))
    watch = Currency()
    try:
        assert watch.current(ruleset) and watch.current(blind)
        watch.arm_pending()
        assert id(ruleset) in watch.armed and ruleset.checks == 2 and len(walks) == 3   # (2 + the blind one's 1)
        for i in range(5):
            Path(tree, f"churn{i}").write_text("")   # an entry made in a directory its lookup reads
            assert watch.current(ruleset) and watch.current(blind)
            watch.arm_pending()
        assert ruleset.checks == 7 and blind.checks == 6 and len(walks) == 3 and id(ruleset) not in watch.armed
        monkeypatch.setattr(currency, "REARM_AFTER", 0.0)
        assert watch.current(ruleset)
        watch.arm_pending()
        assert id(ruleset) in watch.armed and len(walks) == 5
    finally:
        watch.close()
