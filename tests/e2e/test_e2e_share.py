"""Issue 27: the servers of a root supervisor work on their user's project, as docs/manifests.md ("Sharing a
project") says, with examples/shared/.

A plain uid, alice, owns a project under her 0700 home; it is a git repository she made. The administrator
made the group (here `users`), let it search her home and gave the project a default ACL (rwx for the group,
nothing for the owning group). Alice's MCP client (`landlock-supervisor run`, as her uid) starts, through
root's daemon, the filesystem server (a dynamic user), which writes a file; the git server (another) commits
it; the uvx git server (a third) reads the log; alice then reads and edits both files."""
from __future__ import annotations

import grp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "clients"))
from clienthelpers import free_uid  # noqa: E402
from e2ehelpers import (EXAMPLES, PYTHON, REPO, SERVERS, McpSession, seed_caches, state_root_for,  # noqa: E402
                        stop_supervisor, tail, tool_text)

from supervisor.manifests.dac import (ACCESS_XATTR, DEFAULT_XATTR, GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ,
                                      encode_acl, parse_acl)  # noqa: E402

GROUP_NAME = "users"    # a group every Debian system has: the test adds no group to the host
GID = grp.getgrnam(GROUP_NAME).gr_gid
GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@localhost",
           "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@localhost"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root supervisor and a plain uid: run as root")


def acl(group_perm: int, named: int) -> bytes:
    return encode_acl([(USER_OBJ, 7, 0), (GROUP_OBJ, group_perm, 0), (GROUP, named, GID), (MASK, named | group_perm, 0),
                       (OTHER, 0, 0)])


class Share:
    def __init__(self, root: Path, uid: int) -> None:
        self.root, self.uid = root, uid
        self.home = root / "home"
        self.project = self.home / "project"
        self.state = state_root_for(root)
        self.socket = root / "run" / "sock"
        self.log = root / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def as_alice(self) -> dict[str, Any]:
        """Alice's process: her uid and gid, a member of the group."""
        return {"user": self.uid, "group": self.uid, "extra_groups": [GID], "umask": 0o022}

    def build(self) -> None:
        self.project.mkdir(parents=True)
        (self.root / "run").mkdir()
        for d in (self.home, self.project):
            os.chown(d, self.uid, self.uid)
        self.home.chmod(0o700)
        # The administrator's part, as setfacl would write it: search on the way, the project rwx and
        # a default ACL giving the group rw(x) and the owning group nothing.
        os.setxattr(self.home, ACCESS_XATTR, acl(0, 1))
        os.setxattr(self.project, ACCESS_XATTR, acl(0, 7))
        os.setxattr(self.project, DEFAULT_XATTR, acl(0, 7))
        # Alice's part: her repository, with a first commit.
        (self.project / "README").write_text("alice's project\n")
        os.chown(self.project / "README", self.uid, self.uid)
        for argv in (["init", "-q"], ["add", "README"], ["commit", "-qm", "alice's first"]):
            subprocess.run(["git", *argv], cwd=self.project, env=GIT_ENV, check=True, capture_output=True,
                           **self.as_alice())
        seed_caches(self.state, npx={}, uvx=["git-uvx-shared"])

    def start(self) -> None:
        argv = [PYTHON, "-m", "supervisor", "--socket", str(self.socket), "serve",
                "--manifests", str(EXAMPLES / "shared"), "--manifests", str(EXAMPLES / "filesystem.yaml"),
                "--state-root", str(self.state), "--grace", "1",
                "--allow-uid", str(self.uid)]
        env = {"PATH": "/usr/bin:/bin", "MCP_SERVERS": str(SERVERS), "MCP_PROJECT": str(self.project),
               "MCP_PROJECTS": str(self.project),
               "MCP_GROUP": GROUP_NAME, "UV_OFFLINE": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the supervisor did not start:\n{tail(self.log)}")
            time.sleep(0.05)

    def run(self, name: str) -> subprocess.CompletedProcess[str]:
        """`landlock-supervisor run NAME` as alice, with nothing on its stdin."""
        return subprocess.run([PYTHON, "-m", "supervisor", "--socket", str(self.socket), "run", name], cwd="/",
                              env={"PATH": "/usr/bin:/bin", "HOME": str(self.home)}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, **self.as_alice())

    def call(self, name: str, tool: str, arguments: Mapping[str, Any]) -> str:
        """One tool call through `landlock-supervisor run NAME`, run as alice: its text."""
        err = self.root / f"{name}.stderr"
        with open(err, "ab") as errf:
            proc = subprocess.Popen([PYTHON, "-m", "supervisor", "--socket", str(self.socket), "run", name],
                                    cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": str(self.home)},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf,
                                    **self.as_alice())
        assert proc.stdin is not None and proc.stdout is not None
        try:
            with McpSession(proc.stdin, proc.stdout, timeout=60) as s:
                s.initialize()
                result = s.call_tool(tool, arguments)
            assert proc.wait(30) == 0, tail(err)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not result.get("isError"), f"{name} {tool}: {tool_text(result)}\n{tail(err)}"
        return tool_text(result)


@pytest.fixture(scope="module")
def share(installed: None) -> Iterator[Share]:
    root = Path(tempfile.mkdtemp(prefix="llsv-share-", dir="/tmp"))
    root.chmod(0o755)
    s = Share(root, free_uid())
    try:
        s.build()
        s.start()
        yield s
        assert stop_supervisor(s.proc) == 0, tail(s.log)
    finally:
        stop_supervisor(s.proc)
        shutil.rmtree(s.state, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(240)
def test_servers_and_their_user_share_a_project(share: Share) -> None:
    project = share.project
    notes = project / "notes.txt"
    share.call("filesystem-shared", "write_file", {"path": str(notes), "content": "written by the server\n"})
    st = notes.stat()
    # Its own uid, not alice's; its mode without group bits (its umask), yet the group may read and write.
    assert st.st_uid not in (0, share.uid), st
    made = parse_acl(os.getxattr(notes, ACCESS_XATTR))
    assert (made.named(GROUP), made.perm(MASK), made.perm(GROUP_OBJ), made.perm(OTHER)) == ([(GID, 7)], 6, 0, 0), made

    text = share.call("git-shared", "git_add", {"repo_path": str(project), "files": ["notes.txt"]})
    text = share.call("git-shared", "git_commit", {"repo_path": str(project), "message": "notes from the server"})
    assert "committed" in text.lower(), text
    text = share.call("git-uvx-shared", "git_log", {"repo_path": str(project)})
    assert "notes from the server" in text and "alice's first" in text, text
    # git status refreshes the index another dynamic user wrote (it failed with 128 before issue 27).
    share.call("git-uvx-shared", "git_status", {"repo_path": str(project)})

    # Alice reads and edits both files, and her git sees the servers' commit.
    def alice(*argv: str) -> str:
        return subprocess.run(argv, cwd=project, env=GIT_ENV, check=True, capture_output=True, text=True,
                              **share.as_alice()).stdout
    assert alice("cat", str(notes)) == "written by the server\n"
    alice("sh", "-c", f"echo 'edited by alice' >> {notes} && echo 'edited by alice' >> {project / 'README'}")
    assert notes.read_text().endswith("edited by alice\n")
    assert "notes from the server" in alice("git", "log", "--format=%s")
    assert alice("git", "status", "--porcelain").split() == ["M", "README", "M", "notes.txt"]

    # No gid of its own but the group's: a process outside the group reads nothing of it.
    outsider = subprocess.run(["cat", str(notes)], capture_output=True, user=share.uid, group=share.uid,
                              extra_groups=[])
    assert outsider.returncode != 0


def test_check_finds_nothing_to_fix(share: Share) -> None:
    """The documented ACLs pass the DAC check for every server of the directory."""
    import json
    env = {"PATH": "/usr/bin:/bin", "MCP_SERVERS": str(SERVERS), "MCP_PROJECT": str(share.project),
           "MCP_GROUP": GROUP_NAME}
    r = subprocess.run([PYTHON, "-m", "supervisor", "check", "--json", "--manifests", str(EXAMPLES / "shared"),
                        "--state-root", str(share.state)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["manifests"]
    assert sorted(e["name"] for e in entries) == ["filesystem-shared", "git-shared", "git-uvx-shared"]
    for e in entries:
        assert e["dac"] == [], e


def test_a_server_outside_the_group_is_told_what_stops_it(share: Share) -> None:
    """examples/filesystem.yaml on the same project, without `groups:`: the filesystem server gives up
    ("Cannot access"), and `run` says that file permissions, not Landlock, stopped it, and where."""
    r = share.run("filesystem")
    assert r.returncode == 1, r
    assert "Cannot access" in r.stderr or "accessible" in r.stderr, r.stderr
    assert (f"landlock-supervisor: filesystem: file permissions (not Landlock): read_write_noexec {share.project} "
            f"(drwxrwx---+ {share.uid}:{share.uid}): uid ") in r.stderr, r.stderr
    assert f"cannot search {share.home} (drwx--x---+ {share.uid}:{share.uid}) on the way" in r.stderr, r.stderr
