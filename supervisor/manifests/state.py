"""The state layout: what the supervisor creates and checks on disk for a server.

    <state root>/servers/<name>/        the area: the supervisor's, the server cannot write it
        state/                          $STATE_DIR, the default cwd (the server's)
        npm-cache/ uv-cache/ uv-tools/  profile caches (the server's), siblings of state
    <state root>/parsed/                manifests the supervisor parsed (manifests/file.read)
    <state root>/denials/               `run`'s, not made here (journal.py)

A grant inside a directory its server may write can be swapped for a
symlink before the next spawn's rules are built; siblings in a directory
the server cannot write cannot. Everything here goes through directory
fds opened O_NOFOLLOW, entries are lstat'ed and chowned without following
links: whatever a server left in its area (a dangling link, a link to /)
is refused for that manifest, never followed, chowned or fatal.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable

from .manifest import Manifest

CACHES = ("npm-cache", "uv-cache", "uv-tools")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    pass


def area_mode() -> int:
    # A root supervisor's servers run as other uids: they must traverse it.
    return 0o755 if os.geteuid() == 0 else 0o700


def prepare(m: Manifest, log: Callable[[str], None]) -> str | None:
    """Create and check m's state entries; what refuses m alone, or None."""
    try:
        _prepare(m, log)
    except Refused as e:
        return str(e)
    except OSError as e:
        return f"state directory: {e.filename or ''}: {e.strerror or e}"
    return None


def parsed_directory(state_root: str, log: Callable[[str], None]) -> str | None:
    """<state root>/parsed, the supervisor's own; None (logged) when it
    cannot be: every manifest is then parsed anew."""
    try:
        os.close(_own_dir(state_root, "parsed"))
    except (OSError, Refused) as e:
        log(f"manifests are parsed anew each time: {e}")
        return None
    return os.path.join(state_root, "parsed")


def owner(m: Manifest) -> tuple[int, int]:
    """(uid, gid) the server runs as, hence owns its writable state with."""
    creds = m.credentials
    return (creds.uid, creds.gid) if creds else (os.geteuid(), os.getegid())


def _writable(m: Manifest) -> list[str]:
    return [p for cls in ("read_write", "read_write_noexec") for p in getattr(m.spec, cls)]


def _prepare(m: Manifest, log: Callable[[str], None]) -> None:
    uid, gid = owner(m)
    default_state = os.path.join(m.area, "state") if m.area else None
    if m.area:
        entries = [os.path.basename(p) for p in _writable(m) if os.path.dirname(p) == m.area]
        if m.state_dir == default_state:
            entries.insert(0, "state")
        if entries:
            state_root = os.path.dirname(os.path.dirname(m.area))
            servers = _own_dir(state_root, "servers")
            try:
                area = _area(servers, m, uid, gid, log)
            finally:
                os.close(servers)
            try:
                for entry in dict.fromkeys(entries):
                    _entry(area, entry, uid, gid, os.path.join(m.area, entry), log)
            finally:
                os.close(area)
    if m.state_dir and m.state_dir != default_state:
        parent, name = os.path.split(m.state_dir.rstrip("/"))
        os.makedirs(parent, mode=0o755, exist_ok=True)   # the administrator's path
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _entry(fd, name, uid, gid, m.state_dir, log)
        finally:
            os.close(fd)
    if m.state_dir:
        # Grants the manifest puts inside its own state dir exist before the
        # rules are built (a missing path is skipped, not granted).
        inner = [p for p in _writable(m) if p.startswith(m.state_dir.rstrip("/") + "/")]
        if inner:
            fd = os.open(m.state_dir, _DIR)
            try:
                for p in inner:
                    _beneath(fd, os.path.relpath(p, m.state_dir), uid, gid, p)
            finally:
                os.close(fd)


def _own_dir(state_root: str, name: str) -> int:
    """state_root/name, the supervisor's own: created, traversable by the
    servers of a root supervisor, opened without following a link."""
    os.makedirs(state_root, mode=0o700, exist_ok=True)
    root = os.open(state_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if os.geteuid() == 0:
            st = os.fstat(root)
            if st.st_mode & 0o011 != 0o011:
                os.fchmod(root, stat.S_IMODE(st.st_mode) | 0o011)
        try:
            os.mkdir(name, 0o700, dir_fd=root)
        except FileExistsError:
            pass
        fd = os.open(name, _DIR, dir_fd=root)
    finally:
        os.close(root)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise Refused(f"{state_root}/{name} is owned by uid {st.st_uid}, not by the supervisor")
    want = 0o711 if os.geteuid() == 0 else 0o700
    if stat.S_IMODE(st.st_mode) != want:
        os.fchmod(fd, want)
    return fd


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(st: os.stat_result) -> str:
    return "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"


def _area(servers: int, m: Manifest, uid: int, gid: int, log: Callable[[str], None]) -> int:
    """servers/<name>, the supervisor's; an old-layout one (the state dir
    itself) becomes area/state, its caches moved beside it."""
    assert m.area is not None  # only manifests with an area get here
    me, mode, name = os.geteuid(), area_mode(), m.name
    st = _lstat(name, servers)
    if st is None:
        os.mkdir(name, mode, dir_fd=servers)
        fd = os.open(name, _DIR, dir_fd=servers)
        os.fchmod(fd, mode)
        return fd
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{m.area} is {_kind(st)} (left as it is)")
    fd = os.open(name, _DIR, dir_fd=servers)
    fst = os.fstat(fd)
    inner = _lstat("state", fd)
    if fst.st_uid == me and inner is not None and stat.S_ISDIR(inner.st_mode):
        if stat.S_IMODE(fst.st_mode) != mode:
            os.fchmod(fd, mode)
        return fd
    os.close(fd)
    if inner is not None:
        # Neither layout: an old state dir holding an entry of that name, or a
        # link put in place of the new one. Nothing is guessed, nothing followed.
        raise Refused(f"{m.area}/state is {_kind(inner)} (left as it is)")
    if fst.st_uid not in (uid, me):
        raise Refused(f"{m.area} is owned by uid {fst.st_uid}, neither the server's ({uid}) nor the supervisor's")
    # The old layout: servers/<name> was the server's state directory.
    aside = f".{name}.old-layout"
    if _lstat(aside, servers) is not None:
        raise Refused(f"{os.path.dirname(m.area)}/{aside} is in the way of moving {m.area} to the new layout")
    os.rename(name, aside, src_dir_fd=servers, dst_dir_fd=servers)
    os.mkdir(name, mode, dir_fd=servers)
    fd = os.open(name, _DIR, dir_fd=servers)
    os.fchmod(fd, mode)
    os.rename(aside, "state", src_dir_fd=servers, dst_dir_fd=fd)
    state = os.open("state", _DIR, dir_fd=fd)
    try:
        for cache in CACHES:
            cst = _lstat(cache, state)
            if cst is not None and stat.S_ISDIR(cst.st_mode):
                os.rename(cache, cache, src_dir_fd=state, dst_dir_fd=fd)
    finally:
        os.close(state)
    log(f"{m.source}: moved {m.area} to the new layout: its state is now {m.area}/state")
    return fd


def _entry(parent: int, name: str, uid: int, gid: int, path: str, log: Callable[[str], None]) -> None:
    """One writable entry of the server: a directory it owns."""
    st = _lstat(name, parent)
    if st is None:
        os.mkdir(name, 0o700, dir_fd=parent)
        os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
        return
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path} is {_kind(st)} (left as it is)")
    if st.st_uid == uid:
        return
    me = os.geteuid()
    if st.st_uid != me:
        raise Refused(f"{path} is owned by uid {st.st_uid}, not by the server's {uid}")
    # The supervisor's own: state of a server that ran as root (allow_root,
    # or created before the server had a uid of its own) now goes to its uid.
    skipped = _reown(parent, name, me, uid, gid)
    log(f"{path}: handed over to uid {uid}" + (f" ({skipped} hard-linked file(s) left as they were)"
                                                if skipped else ""))


def _reown(parent: int, name: str, old: int, uid: int, gid: int) -> int:
    """chown what `old` owns below parent/name, never following a link. A
    file with several links may be a link to something outside: left."""
    skipped = 0
    top = os.open(name, _DIR, dir_fd=parent)
    try:
        for _, dirs, files, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for entry in (*dirs, *files):
                st = _lstat(entry, dirfd)
                if st is None or st.st_uid != old:
                    continue
                if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) and st.st_nlink > 1:
                    skipped += 1
                    continue
                os.chown(entry, uid, gid, dir_fd=dirfd, follow_symlinks=False)
        os.fchown(top, uid, gid)
    finally:
        os.close(top)
    return skipped


def _beneath(fd: int, rel: str, uid: int, gid: int, path: str) -> None:
    """Create rel below fd component by component, refusing any link."""
    current = os.dup(fd)
    try:
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise Refused(f"{path}: '..' in a path inside the state directory")
            st = _lstat(part, current)
            if st is None:
                os.mkdir(part, 0o700, dir_fd=current)
                os.chown(part, uid, gid, dir_fd=current, follow_symlinks=False)
            elif not stat.S_ISDIR(st.st_mode):
                raise Refused(f"{path}: {part} is {_kind(st)} (left as it is)")
            nxt = os.open(part, _DIR, dir_fd=current)
            os.close(current)
            current = nxt
    finally:
        os.close(current)
