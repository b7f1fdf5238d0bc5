"""Ids a root supervisor hands out without the administrator creating users.

`user: dynamic` gets a uid (its gid the same number) from a reserved range,
recorded in `<state root>/dynamic-users`: one `NAME UID` line per manifest,
never removed, so a manifest keeps its uid across restarts (its state stays
its own) and a uid once given is never given to another manifest. The
table is read and rewritten under flock on `dynamic-users.lock`: two
supervisors on one state root never hand out one uid twice.
"""
from __future__ import annotations

import fcntl
import grp
import os
import pwd
import re
from collections.abc import Iterable

DEFAULT_DYNAMIC_UIDS = (1879048192, 1879113727)
DEFAULT_SESSION_GIDS = (1879113728, 1879179263)
# The ids the test suites use (inside the next one, named first), and systemd's DynamicUser= range.
RESERVED = (("the test suites' ids", 64000, 64999), ("systemd's DynamicUser range", 61184, 65519))
MAX_ID = 2**32 - 2          # (uid_t)-1 means "unchanged" to the kernel
TABLE = "dynamic-users"
USER_PREFIX = "llsv-"
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63}) ([0-9]+)$")


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


class Table:
    """The `dynamic-users` table of one state root."""

    def __init__(self, state_root: str, uids: tuple[int, int] = DEFAULT_DYNAMIC_UIDS) -> None:
        self.state_root, self.uids = state_root, uids
        self.path = os.path.join(state_root, TABLE)

    def _read(self) -> dict[str, int]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd) as f:
            text = f.read(1 << 22)
        out: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), 1):
            m = _LINE.match(line)
            if not m:
                raise IdError(f"{self.path}:{number}: expected `NAME UID`, got {line[:100]!r}")
            name, uid = m.group(1), int(m.group(2))
            if name in out or uid in out.values():
                raise IdError(f"{self.path}:{number}: {name} {uid} repeats a name or a uid")
            out[name] = uid
        return out

    def peek(self, name: str) -> tuple[int, bool]:
        """(uid, recorded): the recorded uid, or the one assign() would give."""
        table = self._read()
        if name in table:
            return table[name], True
        return self._free(table, 1)[0], False

    def assign(self, names: Iterable[str]) -> dict[str, int]:
        """The uid of each name, recording new names (under the lock)."""
        names = list(dict.fromkeys(names))
        os.makedirs(self.state_root, mode=0o700, exist_ok=True)
        lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table = self._read()
            new = [n for n in names if n not in table]
            if new:
                for name, uid in zip(new, self._free(table, len(new))):
                    table[name] = uid
                self._write(table)
            return {n: table[n] for n in names}
        finally:
            os.close(lock)

    def _free(self, table: dict[str, int], count: int) -> list[int]:
        used = set(table.values())
        out: list[int] = []
        uid = self.uids[0]
        while len(out) < count:
            if uid > self.uids[1]:
                raise IdError(f"--dynamic-uids {self.uids[0]}-{self.uids[1]}: no uid left for "
                              f"{count} more manifest(s) ({self.path} holds {len(table)})")
            if uid not in used:
                out.append(uid)
            uid += 1
        return out

    def _write(self, table: dict[str, int]) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, "".join(f"{n} {u}\n" for n, u in table.items()).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
