"""A root supervisor's own namespaces, entered once before the zygote starts.

- IPC: the host's SysV shared memory, semaphores and message queues (root's
  0600 segments included) are out of the servers' reach. The zygote keeps
  no CAP_SYS_ADMIN, so there is one new namespace, shared by every server.
- Mounts: a copy of the host's, made a slave (host mounts still arrive,
  ours never leave), where /etc/passwd and /etc/group are the host's plus
  one line per dynamic user, bound read-only over the originals. A server
  without an account elsewhere then has one for getpwuid() (node's
  os.userInfo(), git, Python's getpass).

A kernel (or container) that refuses either is reported once and the
supervisor starts anyway.
"""
from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 1, 32, 4096, 16384, 1 << 19
FILES = {"/etc/passwd": "passwd", "/etc/group": "group"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.unshare.argtypes = (ctypes.c_int,)


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def ipc_namespaces_available() -> bool:
    return os.path.exists("/proc/self/ns/ipc")


def mount_namespaces_available() -> bool:
    return os.path.exists("/proc/self/ns/mnt")


def _why(e: OSError) -> str:
    if e.errno == errno.EINVAL:
        return "the kernel has no such namespaces"
    if e.errno == errno.EPERM:
        return "not permitted here (no CAP_SYS_ADMIN, or a container forbids it)"
    return e.strerror or str(e)


@dataclass
class Isolation:
    """The namespaces a root supervisor entered, and its passwd/group files for dynamic users."""
    log: Callable[[str], None]
    directory: str | None               # where our passwd and group files live
    mounts: bool = False
    notes: list[str] = field(default_factory=list)
    _base: dict[str, str] = field(default_factory=dict)     # the host's text of each file
    _bound: dict[str, tuple[int, int]] = field(default_factory=dict)   # our file's (dev, ino)

    def users(self, users: dict[int, str]) -> None:
        """Our passwd/group: the host's plus these (uid: name, gid = uid).
        Rewritten in place (the bind mount keeps showing the same inode);
        bound again when the host replaced its own file meanwhile."""
        if not self.mounts or self.directory is None or not (users or self._bound):
            return
        for target, name in FILES.items():
            ours = os.path.join(self.directory, name)
            try:
                current = os.stat(target)
                bound = self._bound.get(target) == (current.st_dev, current.st_ino)
                if not bound:
                    with open(target) as f:
                        self._base[target] = f.read()
                text = self._base[target]
                if text and not text.endswith("\n"):
                    text += "\n"
                for uid, user in sorted(users.items()):
                    text += (f"{user}:x:{uid}:{uid}:landlock-supervisor dynamic user:/:/usr/sbin/nologin\n"
                             if name == "passwd" else f"{user}:x:{uid}:\n")
                _write_in_place(ours, text.encode())
                if not bound:
                    mount(ours, target, MS_BIND)
                    mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
                    st = os.stat(ours)
                    self._bound[target] = (st.st_dev, st.st_ino)
            except OSError as e:
                self.log(f"cannot give dynamic users an entry in {target}: {e.strerror or e}")


def _write_in_place(path: str, data: bytes) -> None:
    """Same inode; longer content first, then truncated: a reader never
    sees an empty file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def isolate(log: Callable[[str], None], users: dict[int, str] | None = None,
            directory: str | None = None) -> Isolation:
    """Enter a new IPC namespace and a slave copy of the mount namespace."""
    iso = Isolation(log, directory)
    try:
        unshare(CLONE_NEWIPC)
    except OSError as e:
        iso.notes.append(f"no IPC namespace ({_why(e)}): servers share the host's SysV IPC objects")
    try:
        unshare(CLONE_NEWNS)
        mount(None, "/", MS_REC | MS_SLAVE)
        iso.mounts = True
    except OSError as e:
        iso.notes.append(f"no mount namespace ({_why(e)}): dynamic users have no passwd entry "
                         "(HOME, USER and LOGNAME are still set)")
    for note in iso.notes:
        log(note)
    if directory is not None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    iso.users(users or {})
    return iso
