"""Landlock rights, and which ABI brought each: the one table of the library.

Everything else (what a ruleset handles, what a path class grants, what
the Report calls a downgrade) is derived from this table, so teaching the
library a new ABI means adding one row here.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class FS(enum.IntFlag):
    EXECUTE = 1 << 0
    WRITE_FILE = 1 << 1
    READ_FILE = 1 << 2
    READ_DIR = 1 << 3
    REMOVE_DIR = 1 << 4
    REMOVE_FILE = 1 << 5
    MAKE_CHAR = 1 << 6
    MAKE_DIR = 1 << 7
    MAKE_REG = 1 << 8
    MAKE_SOCK = 1 << 9
    MAKE_FIFO = 1 << 10
    MAKE_BLOCK = 1 << 11
    MAKE_SYM = 1 << 12
    REFER = 1 << 13
    TRUNCATE = 1 << 14
    IOCTL_DEV = 1 << 15
    RESOLVE_UNIX = 1 << 16


class Net(enum.IntFlag):
    BIND_TCP = 1 << 0
    CONNECT_TCP = 1 << 1
    BIND_UDP = 1 << 2
    CONNECT_SEND_UDP = 1 << 3


class Scope(enum.IntFlag):
    ABSTRACT_UNIX_SOCKET = 1 << 0
    SIGNAL = 1 << 1


class RestrictFlag(enum.IntFlag):
    LOG_SAME_EXEC_OFF = 1 << 0
    LOG_NEW_EXEC_ON = 1 << 1
    LOG_SUBDOMAINS_OFF = 1 << 2
    TSYNC = 1 << 3


NONE = 0


@dataclass(frozen=True)
class Feature:
    """A unit of enforcement a spec can require and a kernel may lack."""
    name: str
    abi: int
    fs: int = NONE
    net: int = NONE
    scope: int = NONE
    restrict: int = NONE


_ABI1_FS = (FS.EXECUTE | FS.WRITE_FILE | FS.READ_FILE | FS.READ_DIR | FS.REMOVE_DIR
            | FS.REMOVE_FILE | FS.MAKE_CHAR | FS.MAKE_DIR | FS.MAKE_REG | FS.MAKE_SOCK
            | FS.MAKE_FIFO | FS.MAKE_BLOCK | FS.MAKE_SYM)

# The table. Order is by ABI; a feature is usable when the kernel's ABI
# reaches it *and* a probe ruleset using it is accepted (vendor kernels
# report ABIs without all of their features).
FEATURES: tuple[Feature, ...] = (
    Feature("filesystem", 1, fs=_ABI1_FS),
    Feature("refer", 2, fs=FS.REFER),
    Feature("truncate", 3, fs=FS.TRUNCATE),
    Feature("tcp", 4, net=Net.BIND_TCP | Net.CONNECT_TCP),
    Feature("ioctl_dev", 5, fs=FS.IOCTL_DEV),
    Feature("scope_abstract_unix_socket", 6, scope=Scope.ABSTRACT_UNIX_SOCKET),
    Feature("scope_signal", 6, scope=Scope.SIGNAL),
    Feature("logging", 7, restrict=RestrictFlag.LOG_SAME_EXEC_OFF
            | RestrictFlag.LOG_NEW_EXEC_ON | RestrictFlag.LOG_SUBDOMAINS_OFF),
    Feature("tsync", 8, restrict=RestrictFlag.TSYNC),
    Feature("unix", 9, fs=FS.RESOLVE_UNIX),
    Feature("udp", 10, net=Net.BIND_UDP | Net.CONNECT_SEND_UDP),
)
FEATURE_BY_NAME = {f.name: f for f in FEATURES}
LATEST_ABI = max(f.abi for f in FEATURES)

# Names a spec may use in `require`, beyond the feature names themselves.
ALIASES: dict[str, tuple[str, ...]] = {
    "network": ("tcp",),
    "scopes": ("scope_abstract_unix_socket", "scope_signal"),
}


def expand_requirements(names: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for name in names:
        if name in ALIASES:
            out.update(ALIASES[name])
        elif name in FEATURE_BY_NAME:
            out.add(name)
        else:
            known = sorted(set(FEATURE_BY_NAME) | set(ALIASES))
            raise ValueError(f"unknown feature {name!r} (known: {', '.join(known)})")
    return frozenset(out)


# Rights that make sense on a rule whose path is not a directory; the
# directory-only rights there make add_rule fail with EINVAL.
FILE_RIGHTS = FS.EXECUTE | FS.WRITE_FILE | FS.READ_FILE | FS.TRUNCATE | FS.IOCTL_DEV | FS.RESOLVE_UNIX

# What each path class grants, before masking to the running ABI. Write
# classes never grant MAKE_CHAR/MAKE_BLOCK: a tool server needs no device
# nodes. RESOLVE_UNIX is granted only by explicit socket paths: a writable
# tree such as /tmp holds other programs' sockets (X11, agents).
READ = FS.READ_FILE | FS.READ_DIR
WRITE = (FS.WRITE_FILE | FS.REMOVE_DIR | FS.REMOVE_FILE | FS.MAKE_DIR | FS.MAKE_REG
         | FS.MAKE_SOCK | FS.MAKE_FIFO | FS.MAKE_SYM | FS.REFER | FS.TRUNCATE | FS.IOCTL_DEV)
PATH_CLASSES: dict[str, int] = {
    "read_only": READ | FS.EXECUTE,
    "read_only_noexec": READ,
    "read_write": READ | WRITE | FS.EXECUTE,
    "read_write_noexec": READ | WRITE,
    "connect_unix": FS.RESOLVE_UNIX,
}


def names(flag_type: type[enum.IntFlag], value: int) -> list[str]:
    return [m.name.lower() for m in flag_type if m.name and m.value & value]
