"""The host's table of dynamic uids as pure functions: what an earlier
version's per-state-root table carries in, and what a new key gets."""
from __future__ import annotations

import pytest

from supervisor.manifests import ids

A, B = "/srv/a", "/srv/b"
RANGE = (100, 105)

CARRY = [
    # what, table, old, expected table, refused
    ("empty", {}, {}, {}, []),
    ("an old table carried in with its uids",
     {}, {(A, "fs"): 103, (A, "git"): 100}, {(A, "fs"): 103, (A, "git"): 100}, []),
    ("carried already: the table's uid stays", {(A, "fs"): 101}, {(A, "fs"): 103}, {(A, "fs"): 101}, []),
    ("a uid the table gives another key is not carried (the collision this table ends)",
     {(B, "fs"): 100}, {(A, "fs"): 100}, {(B, "fs"): 100}, [(A, "fs")]),
    ("nor one another old table carried first",
     {}, {(A, "fs"): 100, (B, "fs"): 100}, {(A, "fs"): 100}, [(B, "fs")]),
    ("uids outside today's range kept", {}, {(A, "old"): 7}, {(A, "old"): 7}, []),
]


@pytest.mark.parametrize("table,old,expected,refused", [r[1:] for r in CARRY], ids=[r[0] for r in CARRY])
def test_carry(table, old, expected, refused):
    assert ids.carry(table, old) == (expected, refused)


ASSIGN = [
    # what, table, keys, expected
    ("first key, first uid", {}, [(A, "fs")], {(A, "fs"): 100}),
    ("one name under two state roots: two uids", {(A, "fs"): 100}, [(B, "fs")], {(A, "fs"): 100, (B, "fs"): 101}),
    ("a recorded key keeps its uid", {(A, "fs"): 104}, [(A, "fs")], {(A, "fs"): 104}),
    ("gaps filled, recorded uids skipped", {(A, "x"): 100, (A, "y"): 102}, [(B, "p"), (B, "q")],
     {(A, "x"): 100, (A, "y"): 102, (B, "p"): 101, (B, "q"): 103}),
    ("a key asked twice gets one uid", {}, [(A, "fs"), (A, "fs")], {(A, "fs"): 100}),
]


@pytest.mark.parametrize("table,keys,expected", [r[1:] for r in ASSIGN], ids=[r[0] for r in ASSIGN])
def test_assign(table, keys, expected):
    assert ids.assign(table, keys, RANGE) == expected


def test_assign_refuses_when_the_range_is_spent():
    full = {(A, f"m{i}"): 100 + i for i in range(6)}
    with pytest.raises(ids.IdError, match="no uid left"):
        ids.assign(full, [(B, "fs")], RANGE)


def test_serves_copies_of_the_defaults_are_the_same():
    """serve repeats them for its help (importing ids would load pwd and grp for every command)."""
    from supervisor import serve
    assert (serve.DEFAULT_DYNAMIC_UIDS, serve.DEFAULT_SESSION_GIDS, serve.HOST_TABLE) == (
        ids.DEFAULT_DYNAMIC_UIDS, ids.DEFAULT_SESSION_GIDS, ids.HOST_TABLE)


def test_the_default_state_roots_earlier_table_is_carried_first(tmp_path):
    """A clash of uids between an earlier table of the default state root
    and another's: the default daemon's keeps its uid (its state is owned by it)."""
    table = ids.Table(str(tmp_path / "other"), path=str(tmp_path / "host" / "dynamic-uids"))
    assert list(table.old) == [ids.key_root(ids.ROOT_STATE), str(tmp_path / "other")]


@pytest.mark.parametrize("root", ["/srv/a\rb", "/srv/a\x85b", "/srv/a\u2028b", "/srv/a\x1bb"])
def test_a_state_root_that_would_split_its_line_is_refused(root):
    with pytest.raises(ids.IdError, match="control character or line break"):
        ids.key_root(root)
