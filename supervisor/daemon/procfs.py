"""/proc readers: stat fields, children of a pid, members of a session, by environment or uid, fd count, RSS, gids.

The server, peers, the tests and scripts/soak.py read processes through
these; each tolerates a process that vanishes while it looks.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat from the field after comm (state is [0], ppid [1], pgrp [2],
    sid [3], starttime [19]); raises OSError for a process that is gone."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)  # 3 syscalls, not open()'s 9
    try:
        return parse_stat(os.read(fd, 4096))
    finally:
        os.close(fd)


def parse_stat(data: bytes) -> list[str]:
    """/proc/PID/stat's text as stat_fields gives it (comm may hold anything: cut at its last ")")."""
    return data[data.rindex(b")") + 2:].decode().split()


def state_of(data: bytes) -> str | None:
    """The state letter of /proc/PID/stat's text (the field after comm), or
    None if there is none: parse_stat's first field, without the rest."""
    at = data.rindex(b")") + 2
    return data[at:at + 1].decode() or None


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process still there when read."""
    for pid in pids():
        try:
            yield pid, stat_fields(pid)
        except OSError:
            pass


def state(pid: int) -> str | None:
    """Its state letter (R, S, Z...), None when it is gone."""
    try:
        return stat_fields(pid)[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    return state(pid) not in (None, "Z", "X")


def children_of(pid: int) -> list[int]:
    return [child for child, fields in stats() if _field(fields, 1) == pid]


def session_members(sid: int, table: Iterable[tuple[int, list[str]]] | None = None) -> list[int]:
    """The pids of session sid, among (pid, stat fields) pairs (default: every process)."""
    return [pid for pid, fields in (stats() if table is None else table) if _field(fields, 3) == sid]


def with_environment(entry: str) -> list[int]:
    """Live processes whose environment holds entry ("NAME=value")."""
    needle = entry.encode()
    out = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found = needle in f.read().split(b"\0")
        except OSError:
            continue
        if found and alive(pid):
            out.append(pid)
    return out


def of_uid(uid: int) -> list[int]:
    """Processes (zombies too) whose /proc entry belongs to uid."""
    out = []
    for pid in pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                out.append(pid)
        except OSError:
            pass
    return out


def fd_count(pid: int | str = "self") -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None  # out of fds: listing them takes one


def _kib(path: str, field: str) -> int | None:
    """The kB figure of one `Field:` line of a /proc file; None when the
    file cannot be read or has no such line."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_kib(pid: int | str = "self") -> int | None:
    """A process's resident set (VmRSS)."""
    return _kib(f"/proc/{pid}/status", "VmRSS:")


def pss_kib(pid: int) -> int | None:
    """A process's proportional set size (smaps_rollup): what it costs, its
    shared pages divided among their holders; None when it cannot be read."""
    return _kib(f"/proc/{pid}/smaps_rollup", "Pss:")


def session_pss_kib(sid: int, table: Iterable[tuple[int, list[str]]]) -> tuple[int | None, int, int]:
    """The PSS of session sid's leader, of its processes summed (those that
    could be read), and how many there are, among (pid, stat fields) pairs.
    Each is read once: a PSS moves as other processes map or drop the pages
    it shares, and the sum must hold the leader's figure it is given beside."""
    members = session_members(sid, table)
    pss = {pid: pss_kib(pid) for pid in members}
    return (pss[sid] if sid in pss else pss_kib(sid)), sum(v or 0 for v in pss.values()), len(members)


def groups_of(pid: int) -> set[int]:
    """Its supplementary groups; none when it cannot be read."""
    return _ids(pid, "Groups:")


def gids_of(pid: int | str) -> set[int]:
    """Its real, effective, saved and filesystem gids; none when it cannot be read."""
    return _ids(pid, "Gid:")


def _ids(pid: int | str, field: str) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def _field(fields: list[str], index: int) -> int | None:
    try:
        return int(fields[index])
    except (ValueError, IndexError):
        return None
