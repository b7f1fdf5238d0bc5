"""`groups:` (issue 27): what servers joining one group share, and only that.

A project shared as docs/manifests.md says ("Sharing a project"): the group
`users` has rwx on it and in its default ACL, the owning group nothing.
Two servers of their own dynamic uids join the group; a third has the same
Landlock grant without it. Rows: docs/security.md (escape catalogue and
Limits).
"""
from __future__ import annotations

import grp
import os

import pytest

from sechelpers import case, check_limit
from svhelpers import run

from supervisor.manifests.dac import (ACCESS_XATTR, DEFAULT_XATTR, GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ,
                                      encode_acl)

pytestmark = [pytest.mark.enforcement,
              pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor switches uids and groups")]
GID = grp.getgrnam("users").gr_gid


@pytest.fixture
def shared(lab):
    project = lab.dir / "project"
    project.mkdir(mode=0o770)
    outside = lab.dir / "outside"
    outside.mkdir(mode=0o777)
    acl = encode_acl([(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (GROUP, 7, GID), (MASK, 7, 0), (OTHER, 0, 0)])
    os.setxattr(project, ACCESS_XATTR, acl)
    os.setxattr(project, DEFAULT_XATTR, acl)
    # The owner's own file, kept out of the group: no ACL, 0600.
    (project / "private.txt").write_text("the owner's alone\n")
    os.removexattr(project / "private.txt", ACCESS_XATTR)
    os.chmod(project / "private.txt", 0o600)
    # A file of the group's outside the project: Landlock grants no server it.
    (outside / "group.txt").write_text("the group's, elsewhere\n")
    os.chown(outside / "group.txt", 0, GID)
    os.chmod(outside / "group.txt", 0o660)
    grants = {"profiles": ["system"], "read_only": ["/usr/bin"], "read_write_noexec": [str(project)]}
    for name, groups in (("member-a", ["users"]), ("member-b", ["users"]), ("outsider", [])):
        lab.manifest(name, command="/bin/sh", args=["-c"], client_args=True, user="dynamic",
                     env={"PATH": "/usr/bin:/bin"}, sandbox=grants, **({"groups": groups} if groups else {}))
    return lab.start(), project, outside


@pytest.mark.timeout(60)
def test_members_share_what_the_group_is_given(shared) -> None:
    """One member, compromised, reads and rewrites what another member (or the owner) writes in the project."""
    sv, project, _ = shared
    assert run(sv.client, "member-a", [f"echo from-a > {project}/a.txt"]).code == 0
    r = run(sv.client, "member-b", [f"cat {project}/a.txt && echo from-b >> {project}/a.txt"])
    check_limit("shared-group", r.code == 0 and r.out == b"from-a\n")
    assert (project / "a.txt").read_text() == "from-a\nfrom-b\n"


@case("shared-group-bounds")
@pytest.mark.timeout(60)
def test_the_group_reaches_only_what_it_is_given(shared) -> None:
    """A member cannot read the owner's file the ACL leaves out, nor the group's file outside its grants;
    a server with the same Landlock grant but not in the group reaches nothing of the project."""
    sv, project, outside = shared
    assert run(sv.client, "member-a", [f"echo from-a > {project}/a.txt"]).code == 0
    for name, script in (("member-b", f"cat {project}/private.txt"),
                         ("member-b", f"cat {outside}/group.txt"),
                         ("outsider", f"cat {project}/a.txt"),
                         ("outsider", f"ls {project}"),
                         ("outsider", f"echo x > {project}/planted.txt")):
        r = run(sv.client, name, [script])
        assert r.code != 0 and b"Permission denied" in r.err, (name, script, r)
    assert not (project / "planted.txt").exists()
