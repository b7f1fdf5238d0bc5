"""Issue 27 under a real root supervisor: a server joins its manifest's `groups:` besides its session gid,
fresh or pooled; a server that fails on file permissions is told so, with the directory that stops it."""
from __future__ import annotations

import grp
import os
import subprocess

import pytest

from svhelpers import run, wait_until

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor switches uids and groups")
USERS = grp.getgrnam("users").gr_gid
STATUS = ["-c", "grep -E '^(Gid|Groups):' /proc/self/status"]


def _ids(text: str) -> tuple[int, set[int]]:
    fields = dict(line.split(":", 1) for line in text.splitlines())
    return int(fields["Gid"].split()[0]), {int(g) for g in fields["Groups"].split()}


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("pool", [0, 1])
def test_a_server_joins_its_groups_besides_its_session_gid(lab, pool: int) -> None:
    lab.manifest("g", command="/bin/sh", args=STATUS, user="dynamic", groups=["users"], pool=pool,
                 sandbox={"profiles": ["system"], "read_only": ["/usr/bin"], "read_only_noexec": ["/proc"]})
    sv = lab.start()
    results = [run(sv.client, "g")]
    if pool:   # the zygote starts with the first spawn; the second is served by a waiting child
        assert wait_until(lambda: sv.client.stats()["pooled"].get("g", 0) == 1, 10), sv.log()
    results.append(run(sv.client, "g"))
    for r in results:
        assert r.code == 0, r
    gids = [_ids(r.out.decode()) for r in results]
    for gid, groups in gids:
        # Joined besides its gid, never instead of it (which gid that is, is the session gids' business).
        assert USERS in groups and gid not in (0, USERS), gids


@needs_root
@pytest.mark.timeout(60)
def test_a_server_stopped_by_file_permissions_is_told_which_directory(lab) -> None:
    private = lab.dir / "private"
    project = private / "project"
    project.mkdir(parents=True)
    private.chmod(0o700)
    project.chmod(0o777)
    lab.manifest("ls", command="/bin/ls", args=[str(project)], user="dynamic",
                 sandbox={"profiles": ["system"], "read_write_noexec": [str(project)]})
    sv = lab.start()
    r = run(sv.client, "ls")
    assert r.code != 0, r
    found = r.child.exited.get("dac") if r.child.exited else None
    assert found and f"cannot search {private} (drwx------ root:root) on the way" in found[0], (r, found)
    assert "read_write_noexec" in found[0] and "fix:" in found[0]
    # `run` writes it where an MCP client shows a server's log.
    result = subprocess.run([sv.argv[0], "-m", "supervisor",
                             "--socket", str(sv.socket_path), "run", "ls"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert (f"landlock-supervisor: ls: file permissions (not Landlock): read_write_noexec {project} "
            f"(drwxrwxrwx root:root): uid ") in result.stderr, result.stderr
    assert f"cannot search {private}" in result.stderr
    # A server that exits 0 is told nothing.
    private.chmod(0o755)
    ok = run(sv.client, "ls")
    assert ok.code == 0 and "dac" not in (ok.child.exited or {}), ok


@needs_root
@pytest.mark.timeout(60)
def test_check_shows_what_file_permissions_stop_and_passes_the_documented_acl(lab) -> None:
    """A 0700 directory on the way is named by check and check --json; the project shared as
    docs/manifests.md says (the group on the way and a default ACL, g::---) has nothing to say."""
    import json
    from svhelpers import PYTHON, REPO
    from supervisor.manifests.dac import (ACCESS_XATTR, DEFAULT_XATTR, GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ,
                                          encode_acl)
    private = lab.dir / "home"
    project = private / "project"
    project.mkdir(parents=True)
    private.chmod(0o700)
    path = lab.manifest("fs", command="/bin/true", user="dynamic", groups=["users"],
                        sandbox={"profiles": ["system"], "read_write_noexec": [str(project)]})

    def check(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, "-m", "supervisor", "check", *flags, str(path), "--state-root",
                               str(lab.state_root)], cwd=REPO, capture_output=True, text=True, timeout=30)
    r = check("--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)["manifests"][0]["dac"]
    assert len(found) == 1 and f"cannot search {private} (drwx------ root:root)" in found[0], found
    assert f"`setfacl -m g:users:--x {private}`" in found[0], found
    assert f"FILE PERMISSIONS (not Landlock): read_write_noexec {project} (drwxr-xr-x root:root): " in check().stdout
    # As docs/manifests.md says: search for the group on the way, rwx and a default ACL on the project.
    os.setxattr(private, ACCESS_XATTR, encode_acl([(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (GROUP, 1, USERS),
                                                   (MASK, 1, 0), (OTHER, 0, 0)]))
    shared = encode_acl([(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (GROUP, 7, USERS), (MASK, 7, 0), (OTHER, 0, 0)])
    os.setxattr(project, ACCESS_XATTR, shared)
    os.setxattr(project, DEFAULT_XATTR, shared)
    assert json.loads(check("--json").stdout)["manifests"][0]["dac"] == []
    # A default ACL that leaves the owning group its access is named.
    os.setxattr(project, DEFAULT_XATTR, encode_acl([(USER_OBJ, 7, 0), (GROUP_OBJ, 6, 0), (GROUP, 7, USERS),
                                                    (MASK, 7, 0), (OTHER, 0, 0)]))
    found = json.loads(check("--json").stdout)["manifests"][0]["dac"]
    assert len(found) == 1 and "default ACL gives the owning group rw-" in found[0], found
