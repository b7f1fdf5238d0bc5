"""What no proposal names, one table for learn and the denial lines: `/`, a home or what holds one, a secret location wherever it lies, the supervisor's own directories.

A proposal ("allow with `read_only_noexec: [...]`", a learnt grant) is a
line someone may paste into a manifest without reading it: it must never
widen a server to a home, credentials, or the supervisor's state (other
servers' state, the parsed manifests its policies come from, its socket).
Pure: `why_not` is tested as a table (tests/unit/test_refusal.py).
"""
from __future__ import annotations

import bisect
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass

from . import secrets
from .secrets import within


@dataclass(frozen=True)
class Known:
    """What the supervisor knows must not be proposed."""
    homes: frozenset[str] = frozenset()       # passwd's, its own $HOME, its servers' HOME
    own: tuple[str, ...] = ()                 # its state root, parsed-manifest and socket directories

    @functools.cached_property
    def home_secrets(self) -> tuple[str, ...]:
        """Every home's secret locations, sorted: made once, not for each
        denial (a few hundred joins each time, most of a denial's cost in
        the supervisor)."""
        return tuple(sorted(os.path.join(h, s) for h in self.homes for s in secrets.HOME_SECRETS))


def known(homes: Iterable[str | None], own: Iterable[str | None]) -> Known:
    """A Known of absolute paths, normalized, `/` and empties left out (`/`
    is refused on its own; a HOME of `/` is no home)."""
    def norm(paths: Iterable[str | None]) -> list[str]:
        return [p for p in (os.path.normpath(q) for q in paths if q and q.startswith("/")) if p != "/"]
    return Known(frozenset(norm(homes)), tuple(sorted(set(norm(own)))))


def why_not(path: str, known: Known) -> str | None:
    """Why no line is proposed for path (absolute), or None."""
    path = os.path.normpath(path) if path.startswith("/") else path
    if path == "/":
        return "the whole filesystem"
    if path in known.homes:
        return "a whole home directory"
    if any(within(h, path) for h in known.homes):
        return "a directory holding home directories"
    if any(within(path, d) or within(d, path) for d in known.own):
        return "the supervisor's own files (its state, parsed manifests or socket)"
    if any(secrets.is_env_file(p) for p in path.split("/")):
        return "a .env file"
    if secrets.secret(path):
        return "a location holding secrets"
    if _holds_any(path, known.home_secrets):
        return "a directory holding a home's secrets"
    return None


def _holds_any(path: str, paths: tuple[str, ...]) -> bool:
    """Whether one of `paths` (sorted) is path or lies under it (as
    secrets.within(one, path)): the ones under it are the block that starts
    at path + "/"."""
    at = bisect.bisect_left(paths, path)
    if at < len(paths) and paths[at] == path:
        return True
    prefix = path.rstrip("/") + "/"   # as secrets.within reads it
    under = bisect.bisect_left(paths, prefix)
    return under < len(paths) and paths[under].startswith(prefix)
