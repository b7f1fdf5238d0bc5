"""Ids a root supervisor hands out without the administrator creating users.

`user: dynamic` gets a uid from a reserved range, recorded in one table
for the whole host (HOST_TABLE, whatever `--state-root` says; only
$LANDLOCK_SUPERVISOR_DYNAMIC_UIDS moves it, as the test suite does): one
`UID NAME STATE_ROOT` line per (state root, manifest name), never removed,
so a manifest keeps its uid across restarts (its state stays its own) and
a uid once recorded is never given to another key: two supervisors with
different state roots never run two servers as one uid. The table is read
and rewritten under flock on its `.lock`, by root, in a directory only
root may write, never following a link (a temp file renamed over it).

Tables of earlier versions (`<state root>/dynamic-users`, `NAME UID` a
line, one per state root) are carried in with their uids: the own state
root's and the default one's, at each assignment; an entry whose uid the
host table already gives another key is not carried (that manifest gets a
new uid).
"""
from __future__ import annotations

import fcntl
import grp
import os
import pwd
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping

from ..client.paths import ROOT_STATE

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_DYNAMIC_UIDS = (1879048192, 1879113727)
DEFAULT_SESSION_GIDS = (1879113728, 1879179263)
# The ids the test suites use (inside the next one, named first), and systemd's DynamicUser= range.
RESERVED = (("the test suites' ids", 64000, 64999), ("systemd's DynamicUser range", 61184, 65519))
MAX_ID = 2**32 - 2          # (uid_t)-1 means "unchanged" to the kernel
HOST_TABLE = "/var/lib/landlock-supervisor/dynamic-uids"
TABLE_ENV = "LANDLOCK_SUPERVISOR_DYNAMIC_UIDS"   # moves HOST_TABLE (the test suite's own)
OLD_TABLE = "dynamic-users"      # a state root's own table, before the host's
USER_PREFIX = "llsv-"
_HOST_LINE = re.compile(r"^(?P<uid>[0-9]{1,10}) (?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,63}) (?P<root>/.*)$")
_OLD_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,63}) (?P<uid>[0-9]{1,10})$")
Key = tuple[str, str]            # (state root, manifest name)


class IdError(ValueError):
    pass


def parse_range(text: str, option: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        raise IdError(f"{option}: expected FIRST-LAST (two numbers), got {text!r}")
    lo, hi = int(first), int(last)
    if not 0 < lo <= hi <= MAX_ID:
        raise IdError(f"{option}: {text}: expected 1 <= FIRST <= LAST <= {MAX_ID}")
    return lo, hi


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def known_ids() -> dict[int, str]:
    """Every uid and gid NSS knows, with what names it."""
    out: dict[int, str] = {}
    for pw in pwd.getpwall():
        out.setdefault(pw.pw_uid, f"user {pw.pw_name}")
    for gr in grp.getgrall():
        out.setdefault(gr.gr_gid, f"group {gr.gr_name}")
    return out


def check_ranges(uids: tuple[int, int], gids: tuple[int, int]) -> None:
    """Refuse ranges that would hand out an id someone else has or may get."""
    named = {"--dynamic-uids": uids, "--session-gids": gids}
    if _overlaps(uids, gids):
        raise IdError(f"--dynamic-uids {uids[0]}-{uids[1]} and --session-gids {gids[0]}-{gids[1]} overlap")
    for option, r in named.items():
        for what, lo, hi in RESERVED:
            if _overlaps(r, (lo, hi)):
                raise IdError(f"{option} {r[0]}-{r[1]} overlaps {what} ({lo}-{hi})")
    # Our own table's users are in the passwd file of our mount namespace
    # (namespaces.py), never in the host's: a hit here is someone else's id.
    for ident, name in sorted(known_ids().items()):
        for option, r in named.items():
            if r[0] <= ident <= r[1]:
                raise IdError(f"{option} {r[0]}-{r[1]} holds id {ident}, known to NSS as {name}: "
                              "choose a range no user or group uses")


def user_name(manifest: str) -> str:
    return USER_PREFIX + manifest


def host_table() -> str:
    return os.environ.get(TABLE_ENV) or HOST_TABLE


def key_root(state_root: str) -> str:
    """A state root as the table names it: one name for one directory."""
    root = os.path.realpath(state_root)
    if not root.isprintable():   # (a line break of any kind would split the table's line)
        raise IdError(f"state root {root!r}: a control character or line break in its path")
    return root


def carry(table: Mapping[Key, int], old: Mapping[Key, int]) -> tuple[dict[Key, int], list[Key]]:
    """(the table with the old tables' entries carried in, the keys not
    carried: their uid is another key's already). Pure."""
    out, owners = dict(table), {uid: key for key, uid in table.items()}
    refused = []
    for key, uid in old.items():
        if key in out:
            continue
        if uid in owners:
            refused.append(key)
            continue
        out[key] = uid
        owners[uid] = key
    return out, refused


def assign(table: Mapping[Key, int], keys: Iterable[Key], uids: tuple[int, int]) -> dict[Key, int]:
    """The table with a uid for each key it lacks: the lowest of the range
    no key has. Pure; raises IdError when the range is spent."""
    out, used = dict(table), set(table.values())
    uid = uids[0]
    for key in dict.fromkeys(keys):
        if key in out:
            continue
        while uid in used:
            uid += 1
        if uid > uids[1]:
            raise IdError(f"--dynamic-uids {uids[0]}-{uids[1]}: no uid left for {key[1]!r} "
                          f"({len(table)} recorded)")
        out[key] = uid
        used.add(uid)
    return out


class Table:
    """The host's table of dynamic uids, as one state root's supervisor
    uses it: its keys are (the state root, a manifest name)."""

    def __init__(self, state_root: str, uids: tuple[int, int] = DEFAULT_DYNAMIC_UIDS,
                 path: str | None = None) -> None:
        self.root, self.uids = key_root(state_root), uids
        self.path = path or host_table()
        self.directory, self.name = os.path.split(self.path)
        # Earlier versions' tables: the default state root's first (its
        # daemon may not have restarted yet: its uids stay its own, whoever
        # carries them in), then this one's.
        self.old = {r: os.path.join(r, OLD_TABLE) for r in dict.fromkeys((key_root(ROOT_STATE), self.root))}

    def peek(self, name: str) -> tuple[int, bool]:
        """(uid, recorded): the uid the manifest has, or the one assign() would give."""
        fd = table_directory(self.directory, create=False)
        try:
            table = _read(fd, self.name, self.path) if fd is not None else {}
        finally:
            if fd is not None:
                os.close(fd)
        carried, _ = carry(table, self._old())
        key = (self.root, name)
        return assign(carried, [key], self.uids)[key], key in carried

    def names(self) -> dict[str, int]:
        """This state root's manifests and their uids, as recorded."""
        fd = table_directory(self.directory, create=False)
        if fd is None:
            return {}
        try:
            return {name: uid for (root, name), uid in _read(fd, self.name, self.path).items() if root == self.root}
        finally:
            os.close(fd)

    def assign(self, names: Iterable[str], log: Callable[[str], None] | None = None) -> dict[str, int]:
        """The uid of each name, recording new ones (under the lock)."""
        keys = [(self.root, n) for n in names]
        fd = table_directory(self.directory, create=True)
        assert fd is not None
        try:
            lock = os.open(self.name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                           dir_fd=fd)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                table = _read(fd, self.name, self.path)
                carried, refused = carry(table, self._old())
                for root, name in refused:
                    if log is not None and (root, name) in keys:
                        log(f"{os.path.join(root, OLD_TABLE)}: {name}: its uid is another key's in "
                            f"{self.path}: it gets a new one")
                new = assign(carried, keys, self.uids)
                if new != table:
                    _write(fd, self.name, new)
                return {name: new[(root, name)] for root, name in keys}
            finally:
                os.close(lock)
        finally:
            os.close(fd)

    def _old(self) -> dict[Key, int]:
        out: dict[Key, int] = {}
        for root, path in self.old.items():
            out.update({(root, name): uid for name, uid in _read_old(path).items()})
        return out


def table_directory(directory: str, create: bool) -> int | None:
    """The host table's directory (also the session gids' leases:
    daemon/leases.py), opened without following a link, None when it is
    missing; it must be root's (this process's uid's), writable by nobody else."""
    if create:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise IdError(f"{directory}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                      "the host's table of dynamic uids and the session gids' leases lie in a directory only the "
                      "supervisor's user may write")
    return fd


# Never a link; a FIFO planted in its place does not block the open.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _text(open_it: Callable[[], int], path: str) -> str | None:
    """The file's text, None if it is missing; it must be a regular file of
    this process's uid that no one else may write (a planted line could
    name any uid), opened without following a link."""
    try:
        fd = open_it()
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, encoding="utf-8", errors="surrogateescape") as f:   # a path is any bytes
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            raise IdError(f"{path}: not a regular file of uid {os.geteuid()} that only it may write")
        return f.read(1 << 24)


def _lines(text: str | None, path: str, pattern: re.Pattern[str], form: str) -> Iterator[re.Match[str]]:
    # Lines end at "\n" alone (not at splitlines' \r, \x85, U+2028...: a state
    # root's path may hold them, and must not split its own line).
    for number, line in enumerate(text.removesuffix("\n").split("\n") if text else [], 1):
        m = pattern.match(line)
        if not m or not 0 < int(m.group("uid")) <= MAX_ID:
            raise IdError(f"{path}:{number}: expected `{form}` (a uid from 1 to {MAX_ID}), got {line[:100]!r}")
        yield m


def _read(directory: int, name: str, path: str) -> dict[Key, int]:
    text = _text(lambda: os.open(name, _READ, dir_fd=directory), path)
    return _distinct([((m.group("root"), m.group("name")), int(m.group("uid")))
                      for m in _lines(text, path, _HOST_LINE, "UID NAME STATE_ROOT")], path)


def _read_old(path: str) -> dict[str, int]:
    """An earlier version's `<state root>/dynamic-users`: `NAME UID` a line."""
    text = _text(lambda: os.open(path, _READ), path)
    return _distinct([(m.group("name"), int(m.group("uid"))) for m in _lines(text, path, _OLD_LINE, "NAME UID")],
                     path)


def _distinct(pairs: list[tuple[Any, int]], path: str) -> dict[Any, int]:
    """The table of these (key, uid) lines: each key once, each uid once."""
    out = dict(pairs)
    if len(out) != len(pairs) or len(set(out.values())) != len(pairs):
        raise IdError(f"{path}: a key or a uid is given twice")
    return out


def _write(directory: int, name: str, table: Mapping[Key, int]) -> None:
    """The whole table, atomically: a temp file of an unpredictable name, renamed over it;
    root's alone to read (it names every state root and manifest of the host)."""
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"   # (secrets.token_hex's own bytes; secrets loads hashlib: ~8 ms)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory)
    try:
        try:
            os.write(fd, "".join(f"{uid} {n} {root}\n" for (root, n), uid in sorted(
                table.items(), key=lambda item: item[1])).encode("utf-8", "surrogateescape"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=directory)
        except OSError:
            pass
        raise
    os.fsync(directory)
