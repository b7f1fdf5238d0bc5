"""Host audit settings shared by every supervisor on the host (and the test suite): one locked record of who relies on them and what they were before.

Audit is host state. A supervisor that switched it on must not put it back
while another still reads denials: the second would go on reporting zero.
So each one that reads audit records is a holder in RECORD (its pid and
that process's start time: a holder left by `kill -9` is dropped, never
waited for), and the first holder to change a setting writes its value
from before. Settings go back only when the last holder leaves, found
alive or not. The record is root's, at a fixed path, opened without
following links, and read and written under flock.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat

from landlock import audit

from . import procfs

DIRECTORY = "/run/landlock-supervisor-audit"
RECORD = "settings.json"
# Only these are changed, and put back.
NAMES = ("enabled", "backlog_limit", "backlog_wait_time")

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


def _me() -> dict[str, int]:
    pid = os.getpid()
    return {"pid": pid, "start": int(procfs.stat_fields(pid)[19])}


def _alive(holder: dict[str, Any]) -> bool:
    try:
        return int(procfs.stat_fields(holder["pid"])[19]) == holder["start"]
    except (OSError, IndexError, KeyError, TypeError, ValueError):
        return False


class Record:
    """The record, open and locked (a context manager): `before` (a setting's
    value before the first holder changed it) and the live `holders`."""

    def __init__(self, directory: str = DIRECTORY) -> None:
        self.directory = directory
        self.fd = -1
        self.before: dict[str, int] = {}
        self.holders: list[dict[str, int]] = []

    def __enter__(self) -> "Record":
        os.makedirs(self.directory, mode=0o711, exist_ok=True)
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.fd = os.open(RECORD, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            os.close(self.fd)
            raise OSError(errno.EPERM, f"{self.directory}/{RECORD}: not root's own record")
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self._load()
        return self

    def _load(self) -> None:
        data = b""
        while chunk := os.pread(self.fd, 65536, len(data)):
            data += chunk
        try:
            record = json.loads(data) if data else {}
            before = {k: int(v) for k, v in record.get("before", {}).items() if k in NAMES}
            holders = [h for h in record.get("holders", []) if isinstance(h, dict)]
        except (ValueError, AttributeError, TypeError):
            before, holders = {}, []   # a damaged record: what the host has now is what stays
        self.before = before
        self.holders = [h for h in holders if _alive(h)]

    def __exit__(self, *exc: object) -> None:
        try:
            data = json.dumps({"before": self.before, "holders": self.holders}).encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
        finally:
            os.close(self.fd)   # (the lock goes with it)
            self.fd = -1


def hold(wanted: dict[str, int], directory: str = DIRECTORY) -> dict[str, int]:
    """Become a holder; set each wanted setting (the backlog only ever
    raised, its wait only ever shortened), recording its value before if no
    holder had. Returns what was changed (name: new value). Raises OSError
    (the record, or the kernel refused)."""
    changed: dict[str, int] = {}
    with Record(directory) as record:
        status = audit.status()._asdict()
        try:
            for name, value in wanted.items():
                if (status[name] == value or (name == "backlog_limit" and status[name] >= value)
                        or (name == "backlog_wait_time" and status[name] <= value)):
                    continue
                audit.set_status(**{name: value})
                changed[name] = value
        except OSError:
            # Nothing half-held: no holder is recorded for a failed call, so
            # what it changed goes back now (nobody else would put it back).
            for name in changed:
                audit.set_status(**{name: status[name]})
            raise
        for name in changed:
            record.before.setdefault(name, status[name])
        record.holders.append(_me())
    return changed


def release(directory: str = DIRECTORY) -> dict[str, int]:
    """Stop holding; the last holder puts every recorded setting back.
    Returns what was put back (name: value)."""
    me = _me()
    with Record(directory) as record:
        if me in record.holders:   # one entry: a process may hold twice (the suite, a supervisor in it)
            record.holders.remove(me)
        if record.holders:
            return {}
        restored = {}
        for name, value in record.before.items():
            try:
                audit.set_status(**{name: value})
                restored[name] = value
            except OSError:
                pass
        record.before = {}
        return restored
