"""The canary root: the directory where a supervisor's zygote makes each child's canary file (zygote.canary), which no manifest grants."""
from __future__ import annotations

import errno
import os

from . import audit_settings

CANARY_DIR = audit_settings.DIRECTORY


def make_canary_root(directory: str) -> str:
    """This supervisor's canary root, `<directory>/<pid>`, empty: where its
    zygote makes each child's canary (zygote.canary.make). Root's
    and 0711 at both levels: any uid may pass through to a canary whose
    name it was told, nobody may list one; no manifest grants it."""
    root = f"{directory}/{os.getpid()}"
    remove_canaries(root)   # a dead supervisor's, of our pid
    for path in (directory, root):
        try:
            os.mkdir(path, 0o711)
        except FileExistsError:
            pass
        try:   # (no lchmod before glibc 2.32: the directory's own fd)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise OSError(errno.EPERM, f"{path}: not a directory of ours") from None
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise OSError(errno.EPERM, f"{path}: not a directory of ours")
            os.fchmod(fd, 0o711)
        finally:
            os.close(fd)
    return root


def remove_canaries(root: str) -> None:
    """The canaries left in root (their records lost), then root."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError:
        pass
