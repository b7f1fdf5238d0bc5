"""Opening rule paths without letting a confined process choose the inode.

A rule binds to the inode its path names when the ruleset is built. A
process that may write a directory can replace anything below it with a
symlink (to /, to ~/.ssh) between two builds: the next ruleset would grant
the link's target. So a path is walked one component at a time with
O_PATH|O_NOFOLLOW, and a symlink met inside a writable grant is refused.
Links outside every writable grant (/etc/resolv.conf -> /run/...) were made
by someone the sandbox does not confine, and are followed.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from . import syscalls
from .spec import SpecError

_openat2_works = True
MAX_LINKS = 40  # the kernel's own bound (MAXSYMLINKS)
_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

Inode = tuple[int, int]  # (st_dev, st_ino)


class SymlinkInsideWritable(SpecError):
    """A symlink where a confined process could have made it."""

    def __init__(self, cls: str, path: str, link: str, grant: str) -> None:
        super().__init__(f"{cls}: {path}: symlink {link} lies inside the writable grant {grant}: "
                         "refused (a confined process may have made it)")
        self.cls, self.path, self.link, self.grant = cls, path, link, grant

    def __reduce__(self) -> tuple[type[SymlinkInsideWritable], tuple[str, str, str, str]]:  # pickled by tests and fork-servers: rebuilt from the fields
        return type(self), (self.cls, self.path, self.link, self.grant)


@dataclass
class Opened:
    """A rule path opened without following links inside a writable grant."""
    fd: int                  # O_PATH fd of what the path names, the caller closes it
    st: os.stat_result
    trailing_link: bool      # the path ends in a symlink (followed: outside every grant)
    grant: str | None        # the writable grant the walk entered first, if any


class Resolver:
    """Walks rule paths; `writable` maps the inodes of the writable grants to
    their paths (what the caller opened them as, following links)."""

    def __init__(self, writable: dict[Inode, str]) -> None:
        self.writable = writable

    def open(self, cls: str, path: str) -> Opened:
        """Raises OSError (ENOENT, ENOTDIR: the path is missing; others) or
        SymlinkInsideWritable. Opened.grant is only known after a walk."""
        global _openat2_works
        if _openat2_works:
            # Most paths hold no link at all: one system call instead of a walk.
            try:
                fd = syscalls.openat2(syscalls.AT_FDCWD, path, _FLAGS, syscalls.RESOLVE_NO_SYMLINKS)
            except OSError as e:
                if e.errno in (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM):
                    _openat2_works = False  # before Linux 5.6, or filtered
                elif e.errno != errno.ELOOP:  # ELOOP: a link on the way, walked below
                    raise
            else:
                st = _fstat(fd)
                # O_PATH|O_NOFOLLOW opens a last component that is a link as
                # the link itself, even under RESOLVE_NO_SYMLINKS.
                if not stat.S_ISLNK(st.st_mode):
                    return Opened(fd, st, False, None)
                os.close(fd)
        return self.walk(cls, path)

    def walk(self, cls: str, path: str) -> Opened:
        """One component at a time, following links outside writable grants."""
        links = 0
        todo = _components(path)
        todo.reverse()  # a stack: the next component last
        fd = os.open("/", _FLAGS)
        try:
            st = os.fstat(fd)
            walked = [""]  # the path walked so far, for messages
            grant = self.writable.get((st.st_dev, st.st_ino))
            trailing_link = False
            while todo:
                name = todo.pop()
                nfd = os.open(name, _FLAGS, dir_fd=fd)
                nst = _fstat(nfd)
                if not stat.S_ISLNK(nst.st_mode):
                    os.close(fd)
                    fd, st = nfd, nst
                    walked.append(name)
                    if grant is None:
                        grant = self.writable.get((st.st_dev, st.st_ino))
                    continue
                try:
                    target = os.readlink("", dir_fd=nfd)
                finally:
                    os.close(nfd)
                link = "/".join(walked + [name]) or "/"
                if grant is not None:
                    raise SymlinkInsideWritable(cls, path, link, grant)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"too many levels of symbolic links at {link}")
                trailing_link = trailing_link or not todo
                todo.extend(reversed(_components(target)))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _FLAGS)
                    st = os.fstat(fd)
                    walked = [""]
                    grant = self.writable.get((st.st_dev, st.st_ino))
            return Opened(fd, st, trailing_link, grant)
        except BaseException:
            os.close(fd)
            raise


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c and c != "."]


def writable_inodes(grants: list[tuple[str, str]]) -> dict[Inode, str]:
    """The inodes of the writable grants ((class, path) pairs).

    Each is walked with the grants found so far, outer ones first (by
    depth): a grant nested in another and swapped for a link must not make
    the link's target (/, say) count as writable, which would refuse every
    link below it under a misleading name. Such a grant is left out here;
    walked again with the others, it is refused then. A missing grant grants
    nothing."""
    out: dict[Inode, str] = {}
    resolver = Resolver(out)
    for cls, path in sorted(grants, key=lambda g: len(_components(g[1]))):
        try:
            opened = resolver.open(cls, path)
        except (OSError, SymlinkInsideWritable):
            continue
        os.close(opened.fd)
        out.setdefault((opened.st.st_dev, opened.st.st_ino), path)
    return out


def _fstat(fd: int) -> os.stat_result:
    """fstat, closing fd if even that fails."""
    try:
        return os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
