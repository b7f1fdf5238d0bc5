"""A session's denials as `run` received them from its supervisor, kept for `landlock-supervisor denials --session ID`: away from the stderr `run` shares with the server.

A server writes what it likes on that stderr, lines like the supervisor's
included. So `run` writes no denial and no proposal there, only a count
and this pointer; the lines themselves go to

    <state root>/denials/<ID>.jsonl     (the directory 0700, the file 0600: this uid's)

ID is random (64 bits), chosen by `run` and told on its stderr alone. The
directory is created and opened here without following a link, the file
created O_EXCL: a server can put nothing there unless its manifest grants
it the state root (`check` warns; no proposal ever names it, refusal.py).
A forged pointer leads nowhere, or to the real lines of another session.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

KEPT = 200                  # journals kept: the oldest go when a new one is made
READ_MAX = 4 << 20          # bytes of a journal read
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class JournalError(Exception):
    pass


def valid_id(session: str) -> bool:
    return len(session) == 16 and all(c in "0123456789abcdef" for c in session)


def _directory(state_root: str, create: bool) -> int:
    """<state root>/denials, this uid's and no one else's, opened without
    following a link."""
    if create:
        os.makedirs(state_root, mode=0o700, exist_ok=True)
    root = os.open(state_root, _DIR)
    try:
        if create:
            try:
                os.mkdir("denials", 0o700, dir_fd=root)
            except FileExistsError:
                pass
        fd = os.open("denials", _DIR, dir_fd=root)
    finally:
        os.close(root)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise JournalError(f"{state_root}/denials is not this uid's own 0700 directory")
    return fd


class Journal:
    """One session's: made at its first line (a session without denials
    costs nothing)."""

    def __init__(self, state_root: str) -> None:
        self.state_root = state_root
        self.id = os.urandom(8).hex()
        self.fd: int | None = None
        self.lines = 0
        self.failed: str | None = None   # why it could not be kept (said once)

    def add(self, entry: Mapping[str, Any]) -> None:
        if self.fd is None:
            self.fd = self._create()
        os.write(self.fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        self.lines += 1

    def _create(self) -> int:
        directory = _directory(self.state_root, create=True)
        try:
            _prune(directory)
            return os.open(f"{self.id}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                           | os.O_APPEND, 0o600, dir_fd=directory)
        finally:
            os.close(directory)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _prune(directory: int) -> None:
    """The oldest journals beyond KEPT - 1 go."""
    found = []
    for name in os.listdir(directory):
        if name.endswith(".jsonl") and valid_id(name[:-6]):
            try:
                found.append((os.stat(name, dir_fd=directory, follow_symlinks=False).st_mtime, name))
            except OSError:
                pass
    for _, name in sorted(found)[:max(0, len(found) - KEPT + 1)]:
        try:
            os.unlink(name, dir_fd=directory)
        except OSError:
            pass


def read(state_root: str, session: str) -> list[dict[str, Any]]:
    """The entries of a session's journal, as `run` wrote them."""
    if not valid_id(session):
        raise JournalError(f"--session {session!r}: not a session id (16 hex digits, as `run` printed it)")
    try:
        directory = _directory(state_root, create=False)
    except FileNotFoundError:
        raise JournalError(f"no session {session} in {state_root}") from None
    try:
        fd = os.open(f"{session}.jsonl", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=directory)
    except FileNotFoundError:
        raise JournalError(f"no session {session} in {state_root}") from None
    finally:
        os.close(directory)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise JournalError(f"{state_root}/denials/{session}.jsonl is not this uid's own file")
        data = os.read(fd, READ_MAX)
    finally:
        os.close(fd)
    out = []
    for raw in data.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out
