"""The server's area (<state root>/servers/<name>) copied into learn's scratch state root, never following a link.

learn copies it (as root, for a root supervisor's server) so the runs start
from the state and caches the server will have. Its state directory and
caches are the server's to write, and a running instance of the same
server may swap a directory for a link while the copy walks it: so every
entry is opened through its parent's fd with O_NOFOLLOW and checked by
fstat. A link is copied as a link (the supervisor's own load refuses links
in an area); what is neither file, directory nor link is left out (a FIFO
would block the copy). A file with several hard links may be a link to a
file the server could not read, which the supervisor never hands over to
it (state._reown): it is linked, not copied, so the copy is that same file
(uv's cache links its files); where it cannot be (another file system),
only the server's own is copied. Modes are copied without the set-id bits.
What is copied is bounded (MAX_BYTES, by the files' sizes): a sparse file
costs its server nothing and would cost learn, as root, its size in full.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE = 0o777   # never set-uid, set-gid: the copy is learn's (root's) until the supervisor hands it over
MAX_DEPTH = 64
MAX_BYTES = 8 << 30


class _Budget:
    """What is left to copy, in bytes."""
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_BYTES

    def take(self, size: int, name: str) -> None:
        self.left -= size
        if self.left < 0:
            raise OSError(errno.EFBIG, f"the server's area holds over {MAX_BYTES >> 30} GiB of files "
                          "(sparse ones counted in full): learn copies no more of it", name)


def copy(src: str, dst: str, owner: int) -> bool:
    """src (a directory, not a link) into dst, created; False when src is
    none. owner: the uid the server runs as."""
    try:
        from_fd = os.open(src, _DIR)
    except OSError:
        return False
    try:
        os.mkdir(dst, 0o700)
        to_fd = os.open(dst, _DIR)
        try:
            _tree(from_fd, to_fd, owner, 0, _Budget())
        finally:
            os.close(to_fd)
    finally:
        os.close(from_fd)
    return True


def _tree(src: int, dst: int, owner: int, depth: int, budget: _Budget) -> None:
    if depth > MAX_DEPTH:
        return
    for name in os.listdir(src):
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _directory(src, dst, name, owner, depth, budget)
            elif stat.S_ISREG(st.st_mode):
                _file(src, dst, name, owner, budget)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                raise
            # Gone meanwhile, or swapped for a link or another kind: left out.


def _directory(src: int, dst: int, name: str, owner: int, depth: int, budget: _Budget) -> None:
    from_fd = os.open(name, _DIR, dir_fd=src)   # ELOOP/ENOTDIR if swapped for a link meanwhile
    try:
        os.mkdir(name, 0o700, dir_fd=dst)
        to_fd = os.open(name, _DIR, dir_fd=dst)
        try:
            _tree(from_fd, to_fd, owner, depth + 1, budget)
            os.fchmod(to_fd, os.fstat(from_fd).st_mode & _MODE)
        finally:
            os.close(to_fd)
    finally:
        os.close(from_fd)


def _file(src: int, dst: int, name: str, owner: int, budget: _Budget) -> None:
    from_fd = os.open(name, _FILE, dir_fd=src)
    try:
        st = os.fstat(from_fd)
        if not stat.S_ISREG(st.st_mode):
            return
        if st.st_nlink > 1:
            try:
                os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
                return
            except OSError:
                if st.st_uid != owner:
                    return
        budget.take(st.st_size, name)
        to_fd = os.open(name, _NEW, 0o600, dir_fd=dst)
        with open(from_fd, "rb", closefd=False) as r, open(to_fd, "wb") as w:
            shutil.copyfileobj(r, w)
            os.fchmod(to_fd, st.st_mode & _MODE)
            os.utime(to_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(from_fd)
