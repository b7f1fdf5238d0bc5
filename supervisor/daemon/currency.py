"""Whether a prepared ruleset's paths still name the inodes its rules hold, known without a walk while the kernel says nothing changed.

A cached ruleset is reused while every path of its identity resolves to
the inode its rule was bound to (landlock.Ruleset.is_current: a stat a
path, 26-48 of them for the examples, ~0.2-0.3 ms of every spawn and
hand-over on a 2-CPU VM). Only two things change what a path resolves to:
an entry created, removed or renamed in a directory its lookup reads
(a symlink retargeted is one), and a mount in this mount namespace. The
kernel reports both: inotify on each directory a lookup reads, and
/proc/self/mountinfo, which polls POLLPRI after any mount change. A
ruleset found current by stat once its directories are watched is
"armed": it stays current until an event names one of them, a mount
changes, or inotify's queue overflows (events lost); then it is stat'ed
again, as before, and armed anew once the request is answered
(arm_pending: arming walks every path twice, ~3 ms for 48 paths where a
stat of each is ~0.15), at most once every REARM_AFTER seconds: where a
directory churns (a home directory with a grant in it, or a server
writing into a directory another ruleset's lookups read), the rulesets
watching it are stat'ed as before, not walked at every spawn. A change
whose system call returned before a check is seen by it (the kernel
queues the event, or bumps the mount table's count, within that call).
Events only ever mean more checking, never a stale ruleset passed.

Armed only where inotify sees every change: each directory on a local,
in-kernel filesystem (a network or FUSE filesystem changes behind it,
/proc and /sys have no events), every lookup one this module can follow;
else that ruleset is stat'ed each time. Any failure (no inotify, its
limits reached) means the same.
"""
from __future__ import annotations

import os
import select
import stat
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import landlock
from landlock import syscalls
from landlock.resolve import MAX_LINKS   # the kernel's bound on links in one lookup

REARM_AFTER = 1.0   # s: the least time between two armings of one ruleset

# Filesystems whose every directory change goes through this kernel's VFS
# (fsnotify), by their type as /proc/self/mountinfo names it.
LOCAL = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "devtmpfs", "ramfs", "overlay",
                   "squashfs", "erofs", "iso9660", "vfat", "exfat"})
# An entry created, removed, renamed out or in; the directory itself removed or moved.
_MASK = (syscalls.IN_CREATE | syscalls.IN_DELETE | syscalls.IN_MOVED_FROM | syscalls.IN_MOVED_TO
         | syscalls.IN_DELETE_SELF | syscalls.IN_MOVE_SELF | syscalls.IN_ONLYDIR)
_EVENT = struct.Struct("iIII")   # wd, mask, cookie, len (then len bytes of name)
_DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Lookup = tuple[str, bool]   # a path, and whether a link ending it is followed


def lookups(path: str, follow: bool) -> list[str] | None:
    """The directories the kernel reads entries of to resolve path (each
    by its path, free of links), in order; where a component is missing the
    walk stops at the directory that lacks it. None where it cannot be
    followed here (relative, a loop, an unreadable or non-directory
    component). A trailing link is followed only with `follow` (os.stat
    as against os.lstat: landlock.Ruleset.is_current)."""
    if not path.startswith("/"):
        return None
    todo = [c for c in path.split("/") if c and c != "."]
    todo.reverse()   # a stack: the next component last
    read: list[str] = []
    at, links = "/", 0
    while todo:
        name = todo.pop()
        if name == "..":
            at = os.path.dirname(at)   # `at` holds no link: its parent by name is its parent
            continue
        if at not in read:
            read.append(at)
        entry = os.path.join(at, name)
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            return read   # its creation would be an event of `at`
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode) and (todo or follow):
            links += 1
            if links > MAX_LINKS:
                return None
            try:
                target = os.readlink(entry)
            except OSError:
                return None
            todo.extend(reversed([c for c in target.split("/") if c and c != "."]))
            if target.startswith("/"):
                at = "/"
            continue
        at = entry
    return read


def directories(paths: Iterable[Lookup]) -> list[str] | None:
    """Every directory the lookups of paths read, once each, in order; None if any cannot be followed."""
    out: dict[str, None] = {}
    for path, follow in paths:
        read = lookups(path, follow)
        if read is None:
            return None
        out.update(dict.fromkeys(read))
    return list(out)


def parse_events(buffer: bytes) -> tuple[set[int], bool]:
    """inotify's events: the watch descriptors they name, and whether the
    queue overflowed (events lost: every watch in doubt). Pure."""
    wds: set[int] = set()
    overflow = False
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        wd, mask, _, length = _EVENT.unpack_from(buffer, offset)
        offset += _EVENT.size + length
        if mask & syscalls.IN_Q_OVERFLOW or wd < 0:
            overflow = True
        else:
            wds.add(wd)
    return wds, overflow


def filesystems(mountinfo: bytes) -> dict[int, str]:
    """st_dev -> filesystem type, from /proc/self/mountinfo. Pure."""
    types: dict[int, str] = {}
    for line in mountinfo.decode(errors="replace").splitlines():
        fields = line.split(" ")
        try:
            major, minor = fields[2].split(":")
            types[os.makedev(int(major), int(minor))] = fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):
            continue
    return types


@dataclass
class _Armed:
    ruleset: landlock.Ruleset   # held: its id() is the key, which no other object may take meanwhile
    wds: list[int] = field(default_factory=list)
    dirty: bool = False


@dataclass
class Currency:
    """The supervisor's one inotify instance and mount-table watch, and the rulesets armed on them."""
    armed: dict[int, _Armed] = field(default_factory=dict)     # id(ruleset) -> its watches
    users: dict[int, set[int]] = field(default_factory=dict)   # wd -> the ids of the rulesets armed on it
    inotify: int = -1
    mounts: int = -1
    poller: select.poll | None = None   # the mount table's, for POLLPRI
    # Found current by stat, to be armed by arm_pending(): off the request's
    # path, as arming walks every path twice (~1-2 ms for 48 paths here).
    pending: dict[int, landlock.Ruleset] = field(default_factory=dict)
    armed_at: dict[int, float] = field(default_factory=dict)   # id(ruleset) -> its last arming (monotonic)

    def current(self, ruleset: landlock.Ruleset) -> bool:
        """ruleset.is_current(), without its stats while its watches are
        armed and quiet; otherwise stat'ed (the cost of before) and left for
        arm_pending(), unless it was armed less than REARM_AFTER ago."""
        self._drain()
        entry = self.armed.get(id(ruleset))
        if entry is not None and not entry.dirty:
            return True
        self._unwatch(ruleset)
        if not ruleset.is_current():
            self.forget(ruleset)
            return False
        if time.monotonic() - self.armed_at.get(id(ruleset), -REARM_AFTER) >= REARM_AFTER:
            self.pending[id(ruleset)] = ruleset
        return True

    def arm_pending(self) -> None:
        """Arm the rulesets current() found current by stat (still cached: forget() drops one)."""
        while self.pending:
            self._arm(self.pending.popitem()[1])

    def forget(self, ruleset: landlock.Ruleset) -> None:
        """All of it let go (a ruleset closed, or found changed)."""
        self.pending.pop(id(ruleset), None)
        self.armed_at.pop(id(ruleset), None)
        self._unwatch(ruleset)

    def _unwatch(self, ruleset: landlock.Ruleset) -> None:
        entry = self.armed.pop(id(ruleset), None)
        if entry is None:
            return
        for wd in entry.wds:
            users = self.users.get(wd, set())
            users.discard(id(ruleset))
            if not users:
                self.users.pop(wd, None)
                try:
                    syscalls.inotify_rm_watch(self.inotify, wd)
                except OSError:
                    pass   # (gone with its directory already)

    def close(self) -> None:
        for entry in list(self.armed.values()):
            self.forget(entry.ruleset)
        for fd in (self.inotify, self.mounts):
            if fd >= 0:
                os.close(fd)
        self.inotify = self.mounts = -1
        self.poller = None

    def _drain(self) -> None:
        """Every armed ruleset an event or a mount change may concern marked dirty."""
        if not self.armed:
            return
        assert self.poller is not None   # (opened before the first ruleset was armed)
        overflow = bool(self.poller.poll(0))   # a mount changed: every lookup in doubt
        changed: set[int] = set()
        while not overflow:
            try:
                buffer = os.read(self.inotify, 65536)
            except BlockingIOError:
                break
            except OSError:
                overflow = True
                break
            wds, overflow = parse_events(buffer)
            changed |= wds
        for entry in self.armed.values():
            if overflow or not changed.isdisjoint(entry.wds):
                entry.dirty = True

    def _arm(self, ruleset: landlock.Ruleset) -> None:
        """Watch every directory ruleset's lookups read, then check that
        its lookups read those very directories still and that it is still
        current: a change from then on is an event. Not armed (stat'ed the
        next time) where any of it fails."""
        if not self.open():
            return
        self.armed_at[id(ruleset)] = time.monotonic()   # (tried: not again before REARM_AFTER, armed or not)
        paths = [(path, follow) for path, _, follow in ruleset.identity]
        read = directories(paths)
        if read is None:
            return
        entry = self.armed[id(ruleset)] = _Armed(ruleset)
        pinned: list[int] = []
        try:
            with open("/proc/self/mountinfo", "rb") as f:
                types = filesystems(f.read())
            inodes = []
            for directory in read:
                pinned.append(os.open(directory, _DIRECTORY))
                st = os.fstat(pinned[-1])
                if types.get(st.st_dev) not in LOCAL:
                    break
                inodes.append((st.st_dev, st.st_ino))
            else:
                for fd in pinned:   # (through /proc/self/fd: the very inode fstat'ed)
                    wd = syscalls.inotify_add_watch(self.inotify, f"/proc/self/fd/{fd}", _MASK)
                    entry.wds.append(wd)
                    self.users.setdefault(wd, set()).add(id(ruleset))
                again = [os.lstat(directory) for directory in read]
                if directories(paths) == read and [(st.st_dev, st.st_ino) for st in again] == inodes \
                        and ruleset.is_current():
                    return   # armed
        except OSError:
            pass
        finally:
            for fd in pinned:
                os.close(fd)
        self._unwatch(ruleset)

    def open(self) -> bool:
        """The inotify instance and the mount table's fd (where that fails,
        out of fds or of inotify instances, tried again at the next arming)."""
        if self.inotify >= 0:
            return True
        try:
            self.mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
            self.poller = select.poll()
            self.poller.register(self.mounts, select.POLLPRI)
            self.inotify = syscalls.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.close()
            return False
        return True

