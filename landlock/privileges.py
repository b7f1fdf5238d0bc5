"""Leaving root: a uid/gid drop, or every capability dropped and locked.

A confined process that keeps root's capabilities can still chmod and chown
outside its rules, open raw sockets, mknod and ignore RLIMIT_NPROC.
"""
from __future__ import annotations

import grp
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

import _prctl
import prctl

from .spec import SpecError


@dataclass(frozen=True)
class Credentials:
    """The uid, gid and groups a child switches to."""
    uid: int
    gid: int
    groups: tuple[int, ...]


def resolve(user: str | int | None, group: str | int | None,
            groups: tuple[str | int, ...] = ()) -> Credentials | None:
    """Look names up before fork: NSS must not run in the child. groups:
    supplementary groups joined besides the user's own."""
    if user is None:
        if group is not None or groups:
            raise SpecError(f"{'group' if group is not None else 'groups'}: needs a user as well")
        return None
    creds = _user(user, group)
    extra = {_gid(g, "groups") for g in groups}
    return Credentials(creds.uid, creds.gid, tuple(sorted({*creds.groups, *extra})))


def _user(user: str | int, group: str | int | None) -> Credentials:
    try:
        pw = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        if isinstance(user, int) or user.isdigit():
            uid = int(user)
            gid = uid if group is None else _gid(group)
            return Credentials(uid, gid, (gid,))
        raise SpecError(f"user: no such user {user!r}") from None
    gid = pw.pw_gid if group is None else _gid(group)
    groups = {gid} | {g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem}
    return Credentials(pw.pw_uid, gid, tuple(sorted(groups)))


def _gid(group: str | int, key: str = "group") -> int:
    if isinstance(group, int) or group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SpecError(f"{key}: no such group {group!r}") from None


def bounding_set() -> tuple[int, ...]:
    """The capabilities still in this process's bounding set; dropping them
    takes CAP_SETPCAP, so without it there is nothing to drop."""
    if not prctl.cap_effective.setpcap:
        return ()
    return tuple(c for c in prctl.ALL_CAPS if prctl.capbset_read(c))


def limit_bounding_set(keep: Iterable[int]) -> None:
    """Drop from this process's bounding set every capability but `keep`: a
    long-lived root process gives up what it never needs, and each child it
    starts has fewer left to drop."""
    keep = set(keep)
    for cap in bounding_set():
        if cap not in keep:
            _prctl.prctl(_prctl.PR_CAPBSET_DROP, cap)
