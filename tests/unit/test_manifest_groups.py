"""`groups:`: supplementary groups a root supervisor's server joins to share a project; refused where pointless."""
from __future__ import annotations

import grp
from pathlib import Path

import pytest

from supervisor.manifest import Manifest, ManifestError, load

DYNAMIC_UID = 1879048198
USERS = grp.getgrnam("users").gr_gid   # a group every Debian system has


def _load(tmp_path: Path, text: str, as_root: bool = True) -> Manifest:
    path = tmp_path / "m.yaml"
    path.write_text("command: /bin/true\n" + text)
    return load(path, env={}, state_root=str(tmp_path / "state"), as_root=as_root,
                dynamic_uid=lambda name: DYNAMIC_UID)


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
]


@pytest.mark.parametrize("case,text,as_root,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(tmp_path: Path, case: str, text: str, as_root: bool, message: str) -> None:
    with pytest.raises(ManifestError) as e:
        _load(tmp_path, text, as_root)
    assert message in str(e.value)
