"""Keyrings: what a confined child shares with the supervisor and with
other servers besides files (issue 11, point 4).

The supervisor runs in the test run's session keyring (its Popen changes
none), so a key planted there is what a supervisor's session would hold.
Every child joins a fresh anonymous session keyring before its uid
switch; the per-uid user keyrings stay what they are: Limits rows.
"""
from __future__ import annotations

import uuid

import pytest

from landlock import keyrings_available, syscalls
from sechelpers import IDENTITIES, Arena, Identity, case, check_limit

pytestmark = [pytest.mark.enforcement,
              pytest.mark.skipif(not keyrings_available(), reason="machine setting: no keyrings in this kernel")]


def _plant(which: int, payload: str) -> tuple[str, int]:
    description = f"llsv-{uuid.uuid4().hex[:12]}"
    key = syscalls.add_key(b"user", description.encode(), payload.encode(), which)
    return description, key


def _unlink(key: int, which: int) -> None:
    try:
        syscalls.keyctl(9, key, which)  # KEYCTL_UNLINK
    except OSError:
        pass


@pytest.mark.timeout(30)
@case("session-keyring")
def test_session_keyring_of_the_supervisor(fresh: Arena, ident: Identity) -> None:
    """Attempt: find a key of the supervisor's session keyring, and plant
    one there for the next server. Stopped by: every child joins a new
    anonymous session keyring before its uid switch: ENOKEY, and what it
    adds stays in its own."""
    description, key = _plant(syscalls.KEY_SPEC_SESSION_KEYRING, "supervisor secret")
    mine = syscalls.keyctl(syscalls.KEYCTL_GET_KEYRING_ID, syscalls.KEY_SPEC_SESSION_KEYRING, 0)
    try:
        o = fresh.attack(ident, [["keyring_id", "session"], ["key_search", "session", description],
                                 ["key_add", "session", description + "-planted", "planted"]])
        assert o[0]["ok"] and o[0]["value"] != mine, o
        assert o.errname(1) == "ENOKEY", o
        assert o[2]["ok"], o
        with pytest.raises(OSError):
            syscalls.keyctl(syscalls.KEYCTL_SEARCH, syscalls.KEY_SPEC_SESSION_KEYRING, b"user",
                            (description + "-planted").encode(), 0)
        # The next server's session is fresh again: the planted key is not there.
        o = fresh.attack(ident, [["key_search", "session", description + "-planted"]])
        assert o.errname(0) == "ENOKEY", o
    finally:
        _unlink(key, syscalls.KEY_SPEC_SESSION_KEYRING)


@pytest.mark.timeout(30)
def test_user_keyring_shared_by_one_uid(arena: Arena) -> None:
    """Two sessions of one uid and that uid's user keyring (@u): one plants a
    key there; can the next find it or read it by its id? (The row says what
    this kernel answers.)"""
    uid_ident = IDENTITIES[0]
    description = f"llsv-{uuid.uuid4().hex[:12]}"
    o = arena.attack(uid_ident, [["key_add", "user", description, "passed between sessions"],
                                 ["sleep", 0.5]])
    assert o[0]["ok"], o
    o2 = arena.attack(uid_ident, [["key_search", "user", description], ["key_read", o[0]["value"]]])
    check_limit("user-keyring-shared", any(r["ok"] and r["value"] == "passed between sessions" for r in o2.results))


@pytest.mark.timeout(30)
def test_root_children_reach_roots_keyrings(arena: Arena) -> None:
    """An allow_root child is uid 0: does it reach a key in root's user keyring?"""
    root_ident = IDENTITIES[1]
    description, key = _plant(syscalls.KEY_SPEC_USER_KEYRING, "root's key")
    try:
        o = arena.attack(root_ident, [["key_search", "user", description], ["key_read", key]])
    finally:
        _unlink(key, syscalls.KEY_SPEC_USER_KEYRING)
    check_limit("root-keyrings", any(r["ok"] and r["value"] == "root's key" for r in o.results))


@pytest.mark.timeout(30)
def test_persistent_keyring_shared_by_one_uid(arena: Arena, ident: Identity) -> None:
    """KEYCTL_GET_PERSISTENT links the uid's persistent keyring into the
    session keyring: one session of a uid puts a key there, the next one of
    the same uid reads it (for an allow_root child, that is root's
    persistent keyring). Per uid, by the kernel's design."""
    description = f"llsv-{uuid.uuid4().hex[:12]}"
    ring = arena.attack(ident, [["persistent_keyring"]])[0]["value"]
    o = arena.attack(ident, [["persistent_keyring"], ["key_add_to", ring, description, "across sessions"]])
    assert o[1]["ok"], o
    o = arena.attack(ident, [["persistent_keyring"], ["key_search_in", ring, description]])
    try:
        check_limit("persistent-keyring", o[1]["ok"] and o[1]["value"] == "across sessions")
    finally:
        try:
            key = syscalls.keyctl(syscalls.KEYCTL_SEARCH, ring, b"user", description.encode(), 0)
            syscalls.keyctl(9, key, ring)  # KEYCTL_UNLINK
        except OSError:
            pass
