"""The listening socket: taken from systemd, or bound in a directory checked to be safe, and removed at the end."""
from __future__ import annotations

import fcntl
import os
import socket
import stat


def inherited(fd: int) -> socket.socket:
    """systemd socket activation's socket."""
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_SEQPACKET or sock.family != socket.AF_UNIX:
        raise SystemExit("landlock-supervisor: the activation socket must be AF_UNIX SOCK_SEQPACKET")
    sock.set_inheritable(False)  # systemd passes it inheritable
    return sock


def bound(path: str, open_to_others: bool) -> tuple[socket.socket, int]:
    """A socket listening on path (mode 0666 when other uids may connect,
    else 0600), and the fd holding the lock file beside it: close it only
    once the socket is removed."""
    _socket_directory(os.path.dirname(path) or ".", open_to_others)
    lock = _locked(path)
    try:
        _clear_stale(path)
    except BaseException:
        os.close(lock)
        raise
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o666 if open_to_others else 0o600)
    sock.listen(128)
    return sock, lock


def _locked(socket_path: str) -> int:
    """The lock file beside the socket, flocked: held while serving, so that an existing
    socket is replaced only when no supervisor holds it (a connect cannot
    tell a supervisor on another host sharing the directory from a stale
    socket; its lock it can)."""
    path = socket_path + ".lock"
    try:   # (O_NONBLOCK: a FIFO planted there must not hang the start)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise SystemExit(f"landlock-supervisor: cannot open the lock file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SystemExit(f"landlock-supervisor: {path} exists and is not a regular file")
        if st.st_uid != os.geteuid():   # someone else's, who could hold it locked for ever
            raise SystemExit(f"landlock-supervisor: {path} belongs to uid {st.st_uid}, not to this supervisor's: "
                             "remove it, or give --socket a path in a directory of yours")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"landlock-supervisor: another supervisor is listening on {socket_path} "
                         f"(it holds {path}; here, or on another host sharing the directory)") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _clear_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"landlock-supervisor: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a crashed supervisor's
        return
    finally:
        probe.close()
    raise SystemExit(f"landlock-supervisor: another supervisor is listening on {path}")


def _socket_directory(directory: str, open_to_others: bool) -> None:
    """Made (0700, or 0711 when other uids may connect) if missing; an
    existing one is used as it is, never chmodded (it may be shared: /tmp),
    unless it is unsafe: then the supervisor does not start."""
    parent = os.path.dirname(directory)
    if parent:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, 0o711 if open_to_others else 0o700)
        return
    st = os.lstat(directory)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid not in (0, os.geteuid()):
        why = f"belongs to uid {st.st_uid}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        why = f"is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        raise SystemExit(f"landlock-supervisor: the socket's directory {directory} {why}: not using it "
                         "(clients could be sent to another socket); give --socket a path in a directory "
                         "of root's or the supervisor's own")
