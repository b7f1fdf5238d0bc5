"""File permissions (DAC), not Landlock: whether a server's uid and groups can reach each of its grants.

Landlock only ever takes rights away: a grant the server's uid cannot
reach by mode bits and ACLs is useless, and the server's own message
("Cannot access", exit 128) does not say why. `reach` is the rule, a pure
function over a `lookup` of each path's owner, mode and ACLs; `findings`
runs it on a manifest's grants with the real file system (`file_system`).
POSIX ACLs are read as their xattrs and parsed here (stdlib only).
"""
from __future__ import annotations

import grp
import os
import pwd
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from .manifest import Manifest

R, W, X = 4, 2, 1

# <linux/posix_acl.h>, <linux/posix_acl_xattr.h>: a little-endian u32
# version (2), then (u16 tag, u16 perm, u32 id) entries.
ACL_XATTR_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
ACCESS_XATTR, DEFAULT_XATTR = "system.posix_acl_access", "system.posix_acl_default"
_HEADER, _ENTRY = struct.Struct("<I"), struct.Struct("<HHI")

# Per-process views whose permissions are the reader's own, not the server's.
NOT_CHECKED = ("/proc", "/sys")


class AclError(ValueError):
    pass


@dataclass(frozen=True)
class Acl:
    """An ACL's entries as (tag, perm, id); id is meaningful for USER and GROUP only."""
    entries: tuple[tuple[int, int, int], ...]

    def perm(self, tag: int) -> int | None:
        return next((p for t, p, _ in self.entries if t == tag), None)

    def named(self, tag: int) -> list[tuple[int, int]]:
        return [(i, p) for t, p, i in self.entries if t == tag]


def parse_acl(data: bytes) -> Acl:
    """The binary xattr value of system.posix_acl_access or _default."""
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size:
        raise AclError(f"an ACL xattr of {len(data)} bytes")
    (version,) = _HEADER.unpack_from(data)
    if version != ACL_XATTR_VERSION:
        raise AclError(f"ACL xattr version {version}, expected {ACL_XATTR_VERSION}")
    return Acl(tuple(_ENTRY.iter_unpack(data[_HEADER.size:])))


def encode_acl(entries: Iterable[tuple[int, int, int]]) -> bytes:
    """The xattr value for entries (what setfacl writes): tests, and
    administrators without the acl package."""
    return _HEADER.pack(ACL_XATTR_VERSION) + b"".join(_ENTRY.pack(*e) for e in entries)


@dataclass(frozen=True)
class Node:
    """What DAC looks at on one path."""
    mode: int                       # st_mode: type and permission bits
    uid: int
    gid: int
    acl: Acl | None = None          # the access ACL, when it has more than the mode bits
    default_acl: Acl | None = None  # a directory's default ACL
    owner: str = ""                 # names to show (the numbers when empty)
    group: str = ""


@dataclass(frozen=True)
class Identity:
    """Who the server runs as: its uid, and every gid it holds (its gid and supplementary groups)."""
    uid: int
    gids: frozenset[int]


@dataclass(frozen=True)
class Finding:
    """One grant the server cannot use as asked, or a default ACL that shares too much."""
    grant: str          # its class (read_write_noexec ...)
    path: str           # the path, its mode and owner
    line: str           # what stops it, and what would fix it

    def __str__(self) -> str:
        return f"{self.grant} {self.path}: {self.line}"


Lookup = Callable[[str], "Node | None"]
Share = tuple[tuple[str, int], ...]


def allowed(node: Node, who: Identity) -> int:
    """The rwx bits (R|W|X) node grants who: the POSIX.1e access check, no capability
    (a server has none)."""
    bits = node.mode & 0o777
    if who.uid == node.uid:
        return bits >> 6 & 7
    acl = node.acl
    if acl is None:
        return bits >> 3 & 7 if node.gid in who.gids else bits & 7
    mask = acl.perm(MASK)
    mask = 7 if mask is None else mask
    for uid, perm in acl.named(USER):
        if uid == who.uid:
            return perm & mask
    groups = [acl.perm(GROUP_OBJ) or 0] if node.gid in who.gids else []
    groups += [perm for gid, perm in acl.named(GROUP) if gid in who.gids]
    if groups:
        # The kernel grants what one matching entry grants whole; as bits, the union
        # answers each single right, which is how reach asks.
        union = 0
        for perm in groups:
            union |= perm
        return union & mask
    return acl.perm(OTHER) or 0


def wanted(grant: str, is_dir: bool) -> int:
    """The rights a grant is of use with: a directory is listed and entered; writing adds write."""
    if grant == "connect_unix":
        return W
    base = R | X if is_dir else R
    return base | W if grant.startswith("read_write") else base


def reach(grant: str, path: str, who: Identity, lookup: Lookup, share: Share = (),
          umask: int = 0o077) -> list[Finding]:
    """What stops who from using path (absolute, links resolved) as the grant asks;
    [] when nothing does or the path does not exist. share: the manifest's `groups:`
    as (name, gid), which the fixes name and a writable directory's default ACL should;
    umask: the server's, which decides whether others read what it creates without one."""
    node = lookup(path)
    if node is None:
        return []
    groups, shown = tuple(name for name, _ in share), _shown(path, node)
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        walked = "/" + "/".join(parts[:i])
        on_the_way = lookup(walked)
        if on_the_way is None or not stat.S_ISDIR(on_the_way.mode):
            return []
        if not allowed(on_the_way, who) & X:
            return [Finding(grant, shown, f"{_who(who)} cannot search {_shown(walked, on_the_way)} on the way; "
                                          f"fix: {_fix(walked, X, groups)}")]
    is_dir = stat.S_ISDIR(node.mode)
    need = wanted(grant, is_dir)
    missing = need & ~allowed(node, who)
    if missing:
        return [Finding(grant, shown, f"{_who(who)} lacks {_rights(missing)} on it; "
                                      f"fix: {_fix(path, need, groups, is_dir)}")]
    if grant.startswith("read_write") and is_dir:   # what it will make there
        return _default_acl(Finding(grant, shown, ""), path, node, who, share, umask)
    return []


def _default_acl(about: Finding, path: str, node: Node, who: Identity, share: Share,
                 umask: int) -> list[Finding]:
    """A writable directory's default ACL: what the files the server creates there will give."""
    default = node.default_acl
    out = []
    owning = default.perm(GROUP_OBJ) or 0 if default is not None else 0
    if owning:
        out.append(replace(
            about, line=f"its default ACL gives the owning group {_rights(owning)}: what the server creates there "
                        "is open to the gid it was created with (a session gid, given to later sessions of any "
                        f"server); fix: `setfacl -d -m g::--- {path}`"))
    if node.uid in (who.uid, 0):
        return out      # its own (its state), or root's (/tmp): nobody to share with
    given = {gid for gid, perm in default.named(GROUP) if perm & (R | W) == R | W} if default else set()
    for name, gid in share:
        if gid not in given:
            out.append(replace(about, line=f"no default ACL gives group {name} rw: what the server creates there "
                                           f"stays its own; fix: `setfacl -d -m g:{name}:rwX,g::--- {path}`"))
    if not share and not given and umask & 0o004:
        out.append(replace(about, line=f"what the server creates there is its own (uid {who.uid}, umask {umask:03o}): "
                                       f"{node.owner or node.uid} cannot read it; share it with `groups:` and a "
                                       "default ACL (docs/manifests.md \"Sharing a project\")"))
    return out


def _who(who: Identity) -> str:
    return f"uid {who.uid} (groups {','.join(map(str, sorted(who.gids))) or 'none'})"


def _shown(path: str, node: Node) -> str:
    return (f"{path} ({stat.filemode(node.mode)}{'+' if node.acl else ''} "
            f"{node.owner or node.uid}:{node.group or node.gid})")


def _rights(bits: int) -> str:
    return "".join(c if bits & b else "-" for c, b in (("r", R), ("w", W), ("x", X)))


def _fix(path: str, need: int, groups: tuple[str, ...], is_dir: bool = True) -> str:
    if not groups:
        share = "give the server a group that may (`groups:` with an ACL, docs/manifests.md \"Sharing a project\")"
        # Never proposed: writing for everyone.
        return share if need & W else f"{share}, or `chmod o+{_rights(need).replace('-', '')} {path}` for everyone"
    acl = f"g:{groups[0]}:{_rights(need)}"
    if need & W and is_dir:
        return f"`setfacl -m {acl},d:{acl},d:g::--- {path}` (docs/manifests.md \"Sharing a project\")"
    return f"`setfacl -m {acl} {path}`"


# ---- the real file system ----------------------------------------------------

def file_system() -> Lookup:
    """A lookup of the real file system, naming owners once per uid and gid (NSS may be slow)."""
    users: dict[int, str] = {}
    groups: dict[int, str] = {}

    def lookup(path: str) -> Node | None:
        try:
            st = os.lstat(path)   # not following a last link: the caller resolved them
        except OSError:
            return None
        if st.st_uid not in users:
            users[st.st_uid] = _user(st.st_uid)
        if st.st_gid not in groups:
            groups[st.st_gid] = _group(st.st_gid)
        default = _xattr_acl(path, DEFAULT_XATTR) if stat.S_ISDIR(st.st_mode) else None
        return Node(st.st_mode, st.st_uid, st.st_gid, _xattr_acl(path, ACCESS_XATTR), default,
                    users[st.st_uid], groups[st.st_gid])
    return lookup


def _xattr_acl(path: str, name: str) -> Acl | None:
    try:
        return parse_acl(os.getxattr(path, name, follow_symlinks=False))
    except (OSError, AclError):
        return None     # none (ENODATA), or no ACLs on this file system


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return ""


def _gid(name: str | int) -> int | None:
    """A `groups:` name's gid; None once the group is gone (the server joined it at its start)."""
    try:
        return name if isinstance(name, int) else grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def identity_of(m: Manifest) -> Identity:
    """Who the server runs as: its credentials (gid and groups), or this process's own."""
    creds = m.credentials
    if creds is None:
        return Identity(os.geteuid(), frozenset({os.getegid(), *os.getgroups()}))
    return Identity(creds.uid, frozenset({creds.gid, *creds.groups}))


def findings(m: Manifest, lookup: Lookup | None = None) -> list[Finding]:
    """Every grant of m its user cannot use by DAC. Left out: /proc and /sys, and a grant
    inside a tree the server may write (it could plant the links that path resolves through:
    the lines would then describe a path of its choosing; `check` warns of such grants)."""
    lookup = lookup or file_system()
    who = identity_of(m)
    share = tuple((str(name), gid) for name in m.spec.groups if (gid := _gid(name)) is not None)
    trees = tuple(t.rstrip("/") + "/" for t in m.spec.untrusted_trees)
    out: list[Finding] = []
    for grant, path in m.spec.path_rules:
        if path.startswith(trees):
            continue
        real = os.path.realpath(path)
        if any(real == d or real.startswith(d + "/") for d in NOT_CHECKED):
            continue
        out += reach(grant, real, who, lookup, share, m.umask)
    return out
