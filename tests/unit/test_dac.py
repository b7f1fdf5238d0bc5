"""The DAC check as a table: modes, owners, ACLs, groups, a 0700 directory on the way."""
from __future__ import annotations

import os
import re
import stat

import pytest

from supervisor.manifests.dac import (ACL_XATTR_VERSION, GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, Acl,
                                      AclError, Identity, Node, allowed, encode_acl, parse_acl, reach)

ALICE, BOB, SERVER = 1000, 1001, 1879048198
PROJ, SESSION = 2000, 1879113800
D, F = stat.S_IFDIR, stat.S_IFREG


def acl(*entries: tuple[int, int, int]) -> Acl:
    return Acl(tuple(entries))


# rw for the named group, nothing for the owning one: what docs/manifests.md tells the administrator to set.
SHARED = acl((USER_OBJ, 7, 0xFFFFFFFF), (GROUP_OBJ, 0, 0xFFFFFFFF), (GROUP, 7, PROJ), (MASK, 7, 0xFFFFFFFF),
             (OTHER, 0, 0xFFFFFFFF))
OPEN_DEFAULT = acl((USER_OBJ, 7, 0xFFFFFFFF), (GROUP_OBJ, 6, 0xFFFFFFFF), (GROUP, 7, PROJ),
                   (MASK, 7, 0xFFFFFFFF), (OTHER, 0, 0xFFFFFFFF))


def tree(**extra: Node) -> dict[str, Node]:
    """/ and /home (root's, 0755), /home/alice (alice's, 0755), then what a case adds."""
    nodes = {"/": Node(D | 0o755, 0, 0), "/home": Node(D | 0o755, 0, 0),
             "/home/alice": Node(D | 0o755, ALICE, ALICE, owner="alice", group="alice")}
    nodes.update({"/home/alice/" + k.replace("__", "/"): v for k, v in extra.items()})
    return nodes


SERVER_ALONE = Identity(SERVER, frozenset({SESSION, SERVER}))
SERVER_IN_PROJ = Identity(SERVER, frozenset({SESSION, SERVER, PROJ}))
SHARE = (("proj", PROJ),)

# (case, grant, path under /home/alice, nodes, who, share, what the findings say: [] for none[, umask: 077])
CASES = [
    ("readable file", "read_only_noexec", "notes", tree(notes=Node(F | 0o644, ALICE, ALICE)),
     SERVER_ALONE, (), []),
    ("file of another, 0600", "read_only_noexec", "notes", tree(notes=Node(F | 0o600, ALICE, ALICE)),
     SERVER_ALONE, (), ["read_only_noexec /home/alice/notes (-rw------- 1000:1000): "
                        "uid 1879048198 (groups 1879048198,1879113800) lacks r-- on it",
                        "or `chmod o+r /home/alice/notes` for everyone"]),
    ("its own file, 0600", "read_write_noexec", "notes", tree(notes=Node(F | 0o600, SERVER, SESSION)),
     SERVER_ALONE, (), []),
    ("owner bits count for the owner alone, 0077", "read_only_noexec", "notes",
     tree(notes=Node(F | 0o077, SERVER, SESSION)), SERVER_ALONE, (), ["lacks r--"]),
    ("world-writable directory", "read_write_noexec", "p", tree(p=Node(D | 0o777, ALICE, ALICE)),
     SERVER_ALONE, (), ["/home/alice/p (drwxrwxrwx 1000:1000): what the server creates there is its own "
                        "(uid 1879048198, umask 077): 1000 cannot read it; share it with `groups:`"]),
    ("world-writable directory, a umask that lets others read", "read_write_noexec", "p",
     tree(p=Node(D | 0o777, ALICE, ALICE)), SERVER_ALONE, (), [], 0o022),
    ("root's world-writable directory (/tmp)", "read_write_noexec", "p", tree(p=Node(D | 0o1777, 0, 0)),
     SERVER_ALONE, (), []),
    ("directory readable, not writable", "read_write_noexec", "p", tree(p=Node(D | 0o755, ALICE, ALICE)),
     SERVER_ALONE, (), ["/home/alice/p (drwxr-xr-x 1000:1000): uid", "lacks -w- on it; fix: give the server "
                        "a group that may (`groups:` with an ACL, docs/manifests.md \"Sharing a project\")"]),
    ("a 0700 directory on the way", "read_write_noexec", "p",
     {**tree(p=Node(D | 0o777, ALICE, ALICE)), "/home/alice": Node(D | 0o700, ALICE, ALICE, owner="alice",
                                                                  group="alice")},
     SERVER_ALONE, (), ["read_write_noexec /home/alice/p (drwxrwxrwx 1000:1000): uid 1879048198",
                       "cannot search /home/alice (drwx------ alice:alice) on the way", "groups:"]),
    ("the 0700 directory's fix names the manifest's group", "read_write_noexec", "p",
     {**tree(p=Node(D | 0o777, ALICE, ALICE)), "/home/alice": Node(D | 0o700, ALICE, ALICE)},
     SERVER_IN_PROJ, SHARE, ["`setfacl -m g:proj:--x /home/alice`"]),
    ("group bits through a supplementary group", "read_only_noexec", "p", tree(p=Node(D | 0o750, ALICE, PROJ)),
     SERVER_IN_PROJ, (), []),
    ("group bits, not in the group", "read_only_noexec", "p", tree(p=Node(D | 0o750, ALICE, PROJ)),
     SERVER_ALONE, (), ["lacks r-x"]),
    ("a matching group that grants nothing hides other's bits", "read_only_noexec", "notes",
     tree(notes=Node(F | 0o604, ALICE, PROJ)), SERVER_IN_PROJ, (), ["lacks r--"]),
    ("ACL: the named group rw, a default ACL as documented", "read_write_noexec", "p",
     tree(p=Node(D | 0o770, ALICE, ALICE, acl=SHARED, default_acl=SHARED)), SERVER_IN_PROJ, SHARE, []),
    ("ACL: not in the named group", "read_write_noexec", "p",
     tree(p=Node(D | 0o770, ALICE, ALICE, acl=SHARED, default_acl=SHARED)), SERVER_ALONE, SHARE,
     ["read_write_noexec /home/alice/p (drwxrwx---+ 1000:1000): uid", "lacks rwx",
      "`setfacl -m g:proj:rwx,d:g:proj:rwx,d:g::--- /home/alice/p`"]),
    ("ACL: the mask limits the named group", "read_write_noexec", "p",
     tree(p=Node(D | 0o750, ALICE, ALICE, acl=acl((USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (GROUP, 7, PROJ),
                                                   (MASK, 5, 0), (OTHER, 0, 0)), default_acl=SHARED)),
     SERVER_IN_PROJ, SHARE, ["lacks -w-"]),
    ("ACL: a named user", "read_only_noexec", "notes",
     tree(notes=Node(F | 0o640, ALICE, ALICE, acl=acl((USER_OBJ, 6, 0), (USER, 4, SERVER), (GROUP_OBJ, 4, 0),
                                                      (MASK, 4, 0), (OTHER, 0, 0)))), SERVER_ALONE, (), []),
    ("ACL: other", "read_only_noexec", "notes",
     tree(notes=Node(F | 0o604, ALICE, ALICE, acl=acl((USER_OBJ, 6, 0), (USER, 0, BOB), (GROUP_OBJ, 0, 0),
                                                      (MASK, 0, 0), (OTHER, 4, 0)))), SERVER_ALONE, (), []),
    ("default ACL gives the owning group access", "read_write_noexec", "p",
     tree(p=Node(D | 0o770, ALICE, ALICE, acl=SHARED, default_acl=OPEN_DEFAULT)), SERVER_IN_PROJ, SHARE,
     ["default ACL gives the owning group rw-", "`setfacl -d -m g::--- /home/alice/p`"]),
    ("a group to share with, no default ACL", "read_write_noexec", "p",
     tree(p=Node(D | 0o770, ALICE, PROJ)), SERVER_IN_PROJ, SHARE,
     ["no default ACL gives group proj rw", "`setfacl -d -m g:proj:rwX,g::--- /home/alice/p`"]),
    ("its own directory needs no default ACL", "read_write_noexec", "p",
     tree(p=Node(D | 0o700, SERVER, SERVER)), SERVER_IN_PROJ, SHARE, []),
    ("a read-only grant's default ACL is not its business", "read_only_noexec", "p",
     tree(p=Node(D | 0o755, ALICE, ALICE, default_acl=OPEN_DEFAULT)), SERVER_ALONE, SHARE, []),
    ("a path that does not exist", "read_write_noexec", "gone", tree(), SERVER_ALONE, (), []),
    ("a file on the way: the path cannot exist", "read_only_noexec", "notes/x",
     tree(notes=Node(F | 0o600, ALICE, ALICE)), SERVER_ALONE, (), []),
    ("connect_unix: write on the socket", "connect_unix", "sock",
     tree(sock=Node(stat.S_IFSOCK | 0o755, ALICE, ALICE)), SERVER_ALONE, (), ["lacks -w-"]),
]


@pytest.mark.parametrize("case,grant,path,nodes,who,share,expected,umask",
                         [(*c, 0o077)[:8] for c in CASES], ids=[c[0] for c in CASES])
def test_reach(case: str, grant: str, path: str, nodes: dict[str, Node], who: Identity,
               share: tuple[tuple[str, int], ...], expected: list[str], umask: int) -> None:
    found = reach(grant, "/home/alice/" + path, who, nodes.get, share, umask)
    text = "\n".join(str(f) for f in found)
    assert bool(found) == bool(expected), text
    for part in expected:
        assert part in text, text
    assert not re.search(r"chmod o\+\S*w", text), "never proposes writing for everyone"


@pytest.mark.parametrize("node,who,bits", [
    (Node(F | 0o640, ALICE, PROJ), SERVER_IN_PROJ, 4),
    (Node(F | 0o640, ALICE, PROJ), SERVER_ALONE, 0),
    (Node(F | 0o604, ALICE, PROJ), SERVER_ALONE, 4),
    (Node(F | 0o460, SERVER, PROJ), SERVER_IN_PROJ, 4),       # the owner's bits, even when the group's are more
    (Node(F | 0o600, ALICE, ALICE, acl=SHARED), SERVER_IN_PROJ, 7),
    (Node(F | 0o600, ALICE, ALICE, acl=SHARED), Identity(ALICE, frozenset({ALICE})), 6),   # the owner: its bits
])
def test_allowed(node: Node, who: Identity, bits: int) -> None:
    assert allowed(node, who) == bits


def test_acl_xattr_round_trip() -> None:
    entries = ((USER_OBJ, 7, 0xFFFFFFFF), (GROUP_OBJ, 0, 0xFFFFFFFF), (GROUP, 6, PROJ), (MASK, 6, 0xFFFFFFFF),
               (OTHER, 0, 0xFFFFFFFF))
    data = encode_acl(entries)
    assert data[:4] == ACL_XATTR_VERSION.to_bytes(4, "little") and len(data) == 4 + 8 * 5
    assert parse_acl(data) == Acl(entries)
    for bad in (b"", data[:-1], (3).to_bytes(4, "little") + data[4:]):
        with pytest.raises(AclError):
            parse_acl(bad)


def test_acl_read_from_the_kernel(tmp_path: "os.PathLike[str]") -> None:
    """What setfacl writes, the kernel keeps and parse_acl reads (tmpfs and ext4 have POSIX ACLs)."""
    from supervisor.manifests.dac import ACCESS_XATTR, DEFAULT_XATTR, file_system
    d = os.path.join(tmp_path, "p")
    os.mkdir(d, 0o770)
    value = encode_acl(SHARED.entries)
    os.setxattr(d, DEFAULT_XATTR, value)
    os.setxattr(d, ACCESS_XATTR, value)
    node_of = file_system()
    node = node_of(d)
    assert node is not None and node.default_acl is not None and node.acl is not None
    assert node.default_acl.named(GROUP) == [(PROJ, 7)] and node.default_acl.perm(GROUP_OBJ) == 0
    # A file made in it takes the default ACL whatever the umask: the named group keeps rw.
    old = os.umask(0o077)
    try:
        os.close(os.open(os.path.join(d, "f"), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
    finally:
        os.umask(old)
    made = node_of(os.path.join(d, "f"))
    assert made is not None and made.acl is not None
    assert made.acl.named(GROUP) == [(PROJ, 7)] and made.acl.perm(MASK) == 6 and made.acl.perm(GROUP_OBJ) == 0
    assert allowed(made, SERVER_IN_PROJ) == 6 and allowed(made, SERVER_ALONE) == 0


def test_findings_leave_out_proc_and_what_the_server_could_redirect() -> None:
    """A grant inside the server's own writable tree resolves through links it could plant: not described."""
    from types import SimpleNamespace
    from typing import cast

    import landlock
    from landlock.privileges import Credentials
    from supervisor.manifests.dac import findings
    from supervisor.manifests.manifest import Manifest
    spec = landlock.Spec(read_write_noexec=("/home/alice/p",),
                         read_only_noexec=("/home/alice/p/sub", "/proc/self"), untrusted_trees=("/home/alice/p",))
    m = cast(Manifest, SimpleNamespace(spec=spec, credentials=Credentials(SERVER, SERVER, (SERVER,)), umask=0o077))
    nodes = tree(p=Node(D | 0o777, ALICE, ALICE), p__sub=Node(D | 0o700, ALICE, ALICE))
    nodes["/proc"] = Node(D | 0o700, 0, 0)
    found = findings(m, nodes.get)
    assert [(f.grant, f.line.split(":")[0]) for f in found] == [
        ("read_write_noexec", "what the server creates there is its own (uid 1879048198, umask 077)")]
