"""What learning never grants (secret locations, other users' homes) and the covering set that reads the rest.

Landlock is an allow-list: "everything but ~/.ssh" is written as the
siblings of each excluded path, on the way down from `/`. `covering_set`
is pure (the directory listing is passed in) and tested as a table.
"""
from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..manifests.refusal import Known, why_not
from ..manifests.secrets import HOME_SECRETS, SSH_HOST_KEYS, SYSTEM_SECRETS, is_env_file, within


@dataclass(frozen=True)
class Excluded:
    path: str
    why: str


def own_home() -> str | None:
    """The home a server has: the invoking user's; none as root (a dynamic user)."""
    return None if os.geteuid() == 0 else _passwd_home(os.getuid())


def _passwd_home(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def homes(own: str | None) -> list[str]:
    """Every home directory of a person or of root, but `own` (the server's);
    the invoking user's $HOME among them, wherever it is (passwd may not
    know it)."""
    found = {pw.pw_dir for pw in pwd.getpwall() if pw.pw_uid == 0 or 1000 <= pw.pw_uid < 60000}
    found.add(os.path.realpath(os.environ.get("HOME") or "/"))
    try:
        found |= {os.path.join("/home", n) for n in os.listdir("/home")}
    except OSError:
        pass
    return sorted(h for h in found if h not in ("/", own) and os.path.isdir(h) and not os.path.islink(h))


def excluded(own_home: str | None, project_dirs: Iterable[str], state_roots: Iterable[str]) -> list[Excluded]:
    """The paths of this machine a learning run may not read: secrets, other
    users' homes (all of them, as root: the dynamic user has none), the
    supervisors' state roots (other servers' state), .env files in the
    project directories. Only existing paths: the others need no rule."""
    invoking = {os.path.realpath(os.environ.get("HOME") or "/"), _passwd_home(os.getuid())}
    out = [Excluded(h, "the home of the user running learn" if h in invoking else "another user's home")
           for h in homes(own_home)]
    out += [Excluded(p, "a secret location") for p in SYSTEM_SECRETS]
    out += [Excluded(r, "a supervisor's state root (other servers' state)") for r in state_roots]
    if own_home:
        out += [Excluded(os.path.join(own_home, s), "a secret location") for s in HOME_SECRETS]
    try:
        out += [Excluded(os.path.join(SSH_HOST_KEYS, n), "an ssh host key") for n in os.listdir(SSH_HOST_KEYS)
                if n.startswith("ssh_host_") and n.endswith("_key")]
    except OSError:
        pass
    for d in {*project_dirs, *([own_home] if own_home else [])}:
        try:
            out += [Excluded(os.path.join(d, n), "a .env file") for n in os.listdir(d) if is_env_file(n)]
        except OSError:
            pass
    seen: set[str] = set()
    kept = []
    for e in out:
        path = os.path.normpath(e.path)
        if path not in seen and os.path.lexists(path):
            seen.add(path)
            kept.append(Excluded(path, e.why))
    return kept


def refusal(path: str, excluded: Iterable[Excluded]) -> str | None:
    """Why `path` may not be granted (it is, or is inside, an excluded
    path), or what the supervisor's one table refuses of any path: `/`,
    a secret location wherever it lies (`.ssh`, `.aws`, `.env`...)."""
    for e in excluded:
        if within(path, e.path):
            return e.why
    return why_not(path, ANYWHERE)


ANYWHERE = Known()   # the table's rules that need no knowledge of this host: the excluded paths hold the rest


DIR, LINK, OTHER = "dir", "link", "other"
Entry = tuple[str, str]                  # (name, DIR, LINK or OTHER)
Listing = Callable[[str], list[Entry]]


def list_dir(path: str) -> list[Entry]:
    """A directory's entries and their kinds, links not followed."""
    out = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                out.append((entry.name, DIR if stat.S_ISDIR(mode) else LINK if stat.S_ISLNK(mode) else OTHER))
    except OSError:
        pass
    return out


def covering_set(excluded: Iterable[str], listing: Listing = list_dir) -> list[str]:
    """Paths whose union is everything under / but the excluded paths: the
    siblings of each excluded path and of each of its ancestors. Symlinks
    are left out: what they name is covered (or excluded) on its own."""
    excluded = {os.path.normpath(p) for p in excluded}
    relative = sorted(p for p in excluded if not p.startswith("/"))
    if relative:   # its ancestors never reach /
        raise ValueError(f"excluded paths must be absolute: {', '.join(relative)}")
    if "/" in excluded:
        return []
    ancestors = {a for p in excluded for a in _ancestors(p)}
    out: list[str] = []

    def walk(directory: str) -> None:
        for name, kind in sorted(listing(directory)):
            child = os.path.join(directory, name)
            if child in excluded or kind == LINK:
                continue
            if child in ancestors and kind == DIR:
                walk(child)
            elif child not in ancestors:
                out.append(child)
    walk("/")
    return out


def _ancestors(path: str) -> list[str]:
    """Every ancestor of path but /, nearest first."""
    out = []
    path = os.path.dirname(path)
    while path != "/":
        out.append(path)
        path = os.path.dirname(path)
    return out
