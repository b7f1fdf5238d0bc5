"""supervisor.client.journal: where `run` keeps a session's denials, made and read
without following a link, this uid's alone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.client import journal


def test_a_session_is_kept_and_read_back(tmp_path: Path) -> None:
    kept = journal.Journal(str(tmp_path / "state"))
    assert journal.valid_id(kept.id) and not (tmp_path / "state").exists()   # nothing until a line
    kept.add({"event": "denied", "object": "/etc/hostname"})
    kept.add({"event": "summary", "text": "x"})
    kept.close()
    assert journal.read(str(tmp_path / "state"), kept.id) == [{"event": "denied", "object": "/etc/hostname"},
                                                              {"event": "summary", "text": "x"}]
    assert (tmp_path / "state" / "denials").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "state" / "denials" / f"{kept.id}.jsonl").stat().st_mode & 0o777 == 0o600


def test_two_sessions_never_share_an_id(tmp_path: Path) -> None:
    assert len({journal.Journal(str(tmp_path)).id for _ in range(100)}) == 100


@pytest.mark.parametrize("session", ["", "../../etc/passwd", "0123456789ABCDEF", "0123456789abcde", "x" * 16])
def test_only_an_id_is_read(tmp_path: Path, session: str) -> None:
    with pytest.raises(journal.JournalError, match="not a session id"):
        journal.read(str(tmp_path), session)


def test_links_and_shared_directories_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    kept = journal.Journal(str(state))
    kept.add({"event": "denied"})
    kept.close()
    target = state / "denials" / f"{kept.id}.jsonl"
    elsewhere = tmp_path / "elsewhere.jsonl"
    os.rename(target, elsewhere)
    os.symlink(elsewhere, target)               # a link where the journal was: not followed
    with pytest.raises(OSError):
        journal.read(str(state), kept.id)
    os.chmod(state / "denials", 0o777)          # a directory others could write in
    with pytest.raises(journal.JournalError, match="own 0700"):
        journal.read(str(state), kept.id)
    with pytest.raises(journal.JournalError, match="own 0700"):
        journal.Journal(str(state)).add({})
    os.chmod(state / "denials", 0o700)
    os.rename(state / "denials", tmp_path / "d")
    os.symlink(tmp_path / "d", state / "denials")   # the directory a link: not followed
    with pytest.raises(OSError):
        journal.Journal(str(state)).add({})


def test_the_oldest_journals_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "KEPT", 3)
    ids = []
    for i in range(5):
        kept = journal.Journal(str(tmp_path))
        kept.add({"n": i})
        kept.close()
        os.utime(tmp_path / "denials" / f"{kept.id}.jsonl", (i, i))
        ids.append(kept.id)
    assert sorted(os.listdir(tmp_path / "denials")) == sorted(f"{i}.jsonl" for i in ids[-3:])
    with pytest.raises(journal.JournalError, match="no session"):
        journal.read(str(tmp_path), ids[0])
