"""Leaving root: a uid/gid drop, or every capability dropped and locked.

A confined process that keeps root's capabilities can still chmod and chown
outside its rules, open raw sockets, mknod and ignore RLIMIT_NPROC.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

import _prctl
import prctl

from . import syscalls
from .spec import SpecError

# Root stays powerless: no fixups on uid changes, no caps for uid 0 on exec,
# and nobody (not even this process) may unset that.
_SECUREBITS = (prctl.SECBIT_NOROOT | prctl.SECBIT_NOROOT_LOCKED
               | prctl.SECBIT_NO_SETUID_FIXUP | prctl.SECBIT_NO_SETUID_FIXUP_LOCKED
               | prctl.SECBIT_KEEP_CAPS_LOCKED)
# _prctl.set_caps(effective_on, permitted_on, inheritable_on, effective_off, ...)
_CLEAR_ALL = ([], [], [], list(prctl.ALL_CAPS), list(prctl.ALL_CAPS), list(prctl.ALL_CAPS))


@dataclass(frozen=True)
class Credentials:
    uid: int
    gid: int
    groups: tuple[int, ...]


def resolve(user: str | int | None, group: str | int | None) -> Credentials | None:
    """Look names up before fork: NSS must not run in the child."""
    if user is None:
        if group is not None:
            raise SpecError("group: needs a user as well")
        return None
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


def _gid(group: str | int) -> int:
    if isinstance(group, int) or group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SpecError(f"group: no such group {group!r}") from None


def switch_to(creds: Credentials) -> None:
    """setgroups, setgid, setuid; then verified, root's way back included."""
    if os.geteuid() != 0 and (creds.uid, creds.gid) != (os.getuid(), os.getgid()):
        raise PermissionError(errno.EPERM, "changing user needs root")
    os.setgroups(list(creds.groups))
    os.setresgid(creds.gid, creds.gid, creds.gid)
    os.setresuid(creds.uid, creds.uid, creds.uid)
    if os.getresuid() != (creds.uid,) * 3 or os.getresgid() != (creds.gid,) * 3:
        raise PermissionError(errno.EPERM, "uid/gid change did not take")
    if creds.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PermissionError(errno.EPERM, "uid drop is reversible")


@dataclass(frozen=True)
class CapabilityDrop:
    """Which syscalls dropping every capability takes here, read before fork:
    each bounding-set drop commits new credentials (~5 us in the kernel), and
    each Python-level look-up in a fresh child costs page faults."""
    bounding: tuple[int, ...]   # the caps still in the bounding set
    lock_securebits: bool       # we hold CAP_SETPCAP, which both need

    def apply(self) -> None:
        for cap in self.bounding:
            _prctl.prctl(_prctl.PR_CAPBSET_DROP, cap)
        if self.lock_securebits:
            _prctl.prctl(_prctl.PR_SET_SECUREBITS, _SECUREBITS)
        syscalls.clear_ambient_capabilities()
        _prctl.set_caps(*_CLEAR_ALL)


def capability_drop() -> CapabilityDrop:
    setpcap = prctl.cap_effective.setpcap
    bounding = tuple(c for c in prctl.ALL_CAPS if prctl.capbset_read(c)) if setpcap else ()
    return CapabilityDrop(bounding, setpcap)


def drop_capabilities() -> None:
    """Bounding, ambient, inheritable, permitted, effective; securebits locked."""
    capability_drop().apply()


def limit_bounding_set(keep: Iterable[int]) -> None:
    """Drop from this process's bounding set every capability but `keep`: a
    long-lived root process gives up what it never needs, and each child it
    starts has fewer left to drop."""
    keep = set(keep)
    for cap in capability_drop().bounding:
        if cap not in keep:
            _prctl.prctl(_prctl.PR_CAPBSET_DROP, cap)
