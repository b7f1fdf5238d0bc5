"""The kernels of the matrix as a table: how each is had, and the Landlock ABI it should show."""
from __future__ import annotations

import re
from typing import Any

# name -> how to get it. "expect" for Debian kernels comes from ABI_SINCE.
# "patched": one kernel built from PATCHED_SOURCE_PKG with landlock-abi.patch,
# booted with the parameters of "append".
KERNELS: dict[str, dict[str, Any]] = {
    f"patched-abi{n}": {"kind": "patched", "expect": str(n), "append": [f"landlock_abi={n}"]} for n in range(1, 11)}
KERNELS["patched-nolandlock"] = {"kind": "patched", "expect": "0",
                                 "append": ["lsm=capability"]}  # -> EOPNOTSUPP
# Suites whose linux-image-amd64 is booted: the first names the kernel, the
# others carry its updates ("-security" ones come from the security mirror).
KERNELS.update({
    "bullseye": {"kind": "qemu", "suites": ["bullseye", "bullseye-security"]},
    "bookworm": {"kind": "qemu", "suites": ["bookworm", "bookworm-updates",
                                            "bookworm-security"]},
    "trixie": {"kind": "qemu", "suites": ["trixie", "trixie-updates",
                                          "trixie-security"]},
    "sid": {"kind": "qemu", "suites": ["sid"]},
})
GROUPS = ("patched", "qemu")
# First kernel version of each Landlock ABI (docs/kernel history). A newer
# kernel than the table's top row is expected to have "at least" that ABI.
ABI_SINCE = [((7, 2), 10), ((7, 1), 9), ((7, 0), 8), ((6, 15), 7),
             ((6, 12), 6), ((6, 10), 5), ((6, 7), 4), ((6, 2), 3),
             ((5, 19), 2), ((5, 13), 1)]
PATCHED_SOURCE_PKG = "linux-source-7.2"
PATCHED_SOURCE_SUITES = ["sid", "trixie-backports"]


def expected_abi(kver: str) -> str:
    """The ABI a Debian kernel of version kver should show: "N", "N+" past the table, "0" before Landlock."""
    m = re.match(r"(\d+)\.(\d+)", kver)
    if not m:
        raise ValueError(f"not a kernel version: {kver}")
    v = (int(m.group(1)), int(m.group(2)))
    for since, abi in ABI_SINCE:
        if v >= since:
            return f"{abi}+" if v[:2] > ABI_SINCE[0][0] else str(abi)
    return "0"


def select(only: str | None) -> list[str]:
    """The kernels --only names (kernel names or groups), in table order.
    Raises ValueError naming what is unknown."""
    if not only:
        return list(KERNELS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    bad = [w for w in wanted if w not in KERNELS and w not in GROUPS]
    if bad or not wanted:
        raise ValueError(f"unknown kernel {bad}; known: {', '.join(KERNELS)}, {', '.join(GROUPS)}")
    return [n for n in KERNELS if n in wanted or KERNELS[n]["kind"] in wanted]


def kind(name: str) -> str:
    return str(KERNELS[name]["kind"])
