"""Manifest keys a root supervisor's servers alone may use, and where each is
refused: `groups:` (supplementary groups joined to share a project) and
`warm:` (servers started ahead, supervisor/daemon/warm.py)."""
from __future__ import annotations

import grp
from pathlib import Path

import pytest

from manifest_text import DYNAMIC_UID, load_text as _load
from supervisor.manifests.manifest import ManifestError

USERS = grp.getgrnam("users").gr_gid   # a group every Debian system has


def test_joined_besides_the_users_own(tmp_path: Path) -> None:
    m = _load(tmp_path, "user: dynamic\ngroups: [users]\n")
    assert m.spec.groups == ("users",)
    assert m.credentials is not None
    assert (m.credentials.uid, m.credentials.gid) == (DYNAMIC_UID, DYNAMIC_UID)
    assert set(m.credentials.groups) == {DYNAMIC_UID, USERS}


REFUSED = [
    ("a user's own supervisor", "user: dynamic\ngroups: [users]\n", False, "groups: needs a root supervisor"),
    ("a server that stays root", "allow_root: true\ngroups: [users]\n", True, "groups: needs `user:`"),
    ("a server that runs as uid 0", "user: root\ngroups: [users]\n", True, "groups: needs `user:` other than root"),
    ("an unknown group", "user: dynamic\ngroups: [no-such-group-llsv]\n", True,
     "groups[0]: no such group 'no-such-group-llsv'"),
    ("a gid, not a name", "user: dynamic\ngroups: [100]\n", True, "groups[0]: no such group '100'"),
    ("root's group", "user: dynamic\ngroups: [root]\n", True, "groups[0]: 'root' is gid 0"),
    ("not a list", "user: dynamic\ngroups: users\n", True, "groups: expected a list"),
    ("warm with a terminal", "user: dynamic\nwarm: 1\nterminal: true\n", True, "warm: contradicts `terminal: true`"),
    ("warm with a group", "user: dynamic\ngroup: users\nwarm: 1\n", True, "warm: contradicts `group:`"),
    ("warm under a user's own supervisor", "warm: 1\n", False, "warm: needs a root supervisor"),
    ("too many warm", "user: dynamic\nwarm: 9\n", True, "warm: expected 0 to 8 servers"),
    ("negative warm", "user: dynamic\nwarm: -1\n", True, "warm: expected 0 to 8 servers"),
    ("warm a boolean", "user: dynamic\nwarm: true\n", True, "warm: expected an integer"),
    ("warm_max_age 0", "user: dynamic\nwarm: 1\nwarm_max_age: 0\n", True, "warm_max_age"),
]


@pytest.mark.parametrize("case,text,as_root,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(tmp_path: Path, case: str, text: str, as_root: bool, message: str) -> None:
    with pytest.raises(ManifestError) as e:
        _load(tmp_path, text, as_root)
    assert message in str(e.value)
    assert "\n" not in str(e.value)   # one line
