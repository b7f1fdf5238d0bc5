"""What the running kernel really enforces, probed once per process."""
from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass, field

from . import rights, syscalls


@dataclass(frozen=True)
class Support:
    """What this kernel offers Landlock-wise: its ABI, errata, usable features."""
    kernel_abi: int          # what the kernel reports (0: no Landlock)
    abi: int                 # what this library uses: kernel_abi capped by max_abi
    errata: int
    features: frozenset[str]
    missing: dict[str, str] = field(default_factory=dict)  # feature -> why unusable

    def mask(self, kind: str) -> int:
        return functools.reduce(lambda acc, f: acc | getattr(f, kind),
                                (rights.FEATURE_BY_NAME[n] for n in self.features), 0)


def _accepted(feature: rights.Feature) -> bool:
    attr = syscalls.RulesetAttr(feature.fs, feature.net, feature.scope)
    size = (syscalls.ATTR_SIZE_SCOPED if feature.scope else
            syscalls.ATTR_SIZE_NET if feature.net else syscalls.ATTR_SIZE_FS)
    try:
        fd = syscalls.create_ruleset(attr, size)
    except OSError:
        return False
    os.close(fd)
    return True


@functools.lru_cache(maxsize=None)
def probe(max_abi: int | None = None) -> Support:
    kernel_abi = syscalls.kernel_abi()
    abi = kernel_abi if max_abi is None else min(kernel_abi, max_abi)
    features, missing = set(), {}
    for feature in rights.FEATURES:
        if kernel_abi == 0:
            missing[feature.name] = "Landlock is not available in this kernel (or not enabled in lsm=)"
        elif feature.abi > abi:
            capped = "" if abi == kernel_abi else f", capped at ABI {abi}"
            missing[feature.name] = f"needs Landlock ABI {feature.abi}; kernel has {kernel_abi}{capped}"
            if feature.name == "refer":
                missing[feature.name] += " (stricter, not looser: every rename or link across directories is denied)"
        elif feature.restrict or _accepted(feature):
            # restrict_self flags cannot be probed without restricting: the ABI decides.
            features.add(feature.name)
        else:
            missing[feature.name] = f"kernel reports ABI {kernel_abi} but refuses this feature"
    return Support(kernel_abi, abi, syscalls.errata() if kernel_abi else 0, frozenset(features), missing)


def abi_version() -> int:
    return syscalls.kernel_abi()


def available() -> bool:
    return "filesystem" in probe().features


@functools.lru_cache(maxsize=None)
def keyrings_available() -> bool:
    """Whether the kernel has keyrings, so that a child joins a session keyring of its own."""
    try:
        syscalls.keyctl(syscalls.KEYCTL_GET_KEYRING_ID, syscalls.KEY_SPEC_SESSION_KEYRING, 0)
    except OSError as e:
        return e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP)
    return True
