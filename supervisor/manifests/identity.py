"""A manifest's identity keys: `user`, `group`, `allow_root`, `groups`; a
`user: dynamic`'s uid, and the HOME/USER/LOGNAME it gets without a passwd
entry. Loader steps (manifest._Loader), each failing on the key it reads."""
from __future__ import annotations

import grp
from collections.abc import Callable

from . import ids
from .file import Expander, Reader

DynamicUid = Callable[[str], int]


def identity(top: Reader, name: str, as_root: bool, dynamic_uid: DynamicUid | None,
             state_root: str | None) -> tuple[str | int | None, str | int | None, bool, bool]:
    """user, group, allow_root, dynamic."""
    user = top.get("user", (str, int), None)
    group = top.get("group", (str, int), None)
    allow_root = top.get("allow_root", bool, False)
    dynamic = user == "dynamic"
    if dynamic:
        if allow_root:
            top.fail("allow_root", "contradicts `user: dynamic`")
        # No group: its gid is the uid's number, and under a root
        # supervisor each session gets a gid of its own instead, as for
        # any manifest that names no `group:` (its sessions must not
        # prlimit each other).
        user = _dynamic_uid(top, name, as_root, dynamic_uid, state_root)
    if as_root and user is None and not allow_root and not dynamic:
        top.fail("user", "required when the supervisor runs as root "
                 "(user: dynamic, a user name, or allow_root: true with every capability dropped)")
    return user, group, allow_root, dynamic


def _dynamic_uid(top: Reader, name: str, as_root: bool, dynamic_uid: DynamicUid | None,
                 state_root: str | None) -> int | None:
    """A `user: dynamic` manifest's uid; None under a user's own supervisor,
    which cannot switch uids: it runs the server as itself."""
    if as_root and dynamic_uid is None and state_root:
        dynamic_uid = lambda n: ids.Table(state_root).peek(n)[0]  # noqa: E731  (what it has or would get)
    try:
        user = dynamic_uid(name) if as_root and dynamic_uid is not None else None
    except (ids.IdError, OSError) as e:
        top.fail("user", f"dynamic: {e}")
    if user is None and as_root:
        top.fail("user", "dynamic: this supervisor has no state root for its table of dynamic users")
    return user


def groups(top: Reader, expand: Expander, user: str | int | None, allow_root: bool, as_root: bool) -> list[str]:
    """`groups:`, supplementary groups the server joins to share files
    (docs/manifests.md, "Sharing a project"): names the administrator
    made, joined by a root supervisor's server that runs as a user."""
    names = [expand(f"groups[{i}]", g) for i, g in enumerate(top.strings("groups"))]
    if not names:
        return names
    if not as_root:
        top.fail("groups", "needs a root supervisor: a user's own supervisor runs its servers as "
                 "itself, with its own groups")
    if allow_root or user is None:
        top.fail("groups", "needs `user:` (dynamic or a user name): a server that stays root "
                 "joins no group")
    for i, name in enumerate(names):
        try:
            gid = grp.getgrnam(name).gr_gid
        except KeyError:
            top.fail(f"groups[{i}]", f"no such group {name!r} (a group name, made by the administrator)")
        if gid == 0:
            top.fail(f"groups[{i}]", f"{name!r} is gid 0: root's group owns system files")
    return names


def dynamic_defaults(name: str, state_dir: str | None, inherit_env: list[str]) -> dict[str, str]:
    """No passwd entry outside the supervisor's mount namespace: programs
    that ask for HOME or the user's name get them here."""
    return {k: v for k, v in (("HOME", state_dir or "/"), ("USER", ids.user_name(name)),
                              ("LOGNAME", ids.user_name(name))) if k not in inherit_env}
