"""Where learn writes its manifest (--out): a directory opened once, no link followed, and a file renamed into it.

learn runs unconfined, as the user or as root, while the server it learns
may write where learning lets it, and a server it learnt earlier wherever
its manifest does. So --out's directory is opened before the first round
without following a link on any component (a link is refused: whoever
could make it chose the directory), the manifest is written to a new file
of an unpredictable name there (O_EXCL|O_NOFOLLOW: nothing planted is
opened) and renamed over --out through that same directory fd.
"""
from __future__ import annotations

import errno
import os
import secrets as tokens
import stat

from landlock import syscalls

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(ValueError):
    pass


def open_directory(path: str) -> int:
    """An fd of the directory `path` (absolute) names with no symbolic link on the way."""
    try:
        return syscalls.openat2(syscalls.AT_FDCWD, path, _DIR, syscalls.RESOLVE_NO_SYMLINKS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{path}: a symbolic link on the way (refused: whoever made it chose the directory)") \
                from None
        if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM):
            raise
    fd = os.open("/", _DIR)   # before Linux 5.6, or filtered: one component at a time
    try:
        for name in [c for c in path.split("/") if c and c != "."]:
            try:
                nfd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                # With O_DIRECTORY, a link is ENOTDIR (ELOOP without).
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                        os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise Refused(f"{path}: a symbolic link on the way at {name} (refused)") from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


class Destination:
    """--out: its directory held open from before the first round to the rename."""

    def __init__(self, out: str) -> None:
        self.path = os.path.abspath(out)   # lexical: with no link on the way, the real path
        directory, self.name = os.path.split(self.path)
        if not self.name or self.name in (".", ".."):
            raise Refused(f"{out}: not a file name")
        self.fd = open_directory(directory)

    def write(self, text: str) -> None:
        tmp = f".{self.name}.{tokens.token_hex(8)}.tmp"
        fd = os.open(tmp, _NEW, 0o666, dir_fd=self.fd)
        try:
            with open(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.rename(tmp, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def close(self) -> None:
        os.close(self.fd)
