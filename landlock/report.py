"""Report: an honest account of what a confinement really enforced."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any


@dataclass
class Report:
    """What was actually enforced on a child (the seed's Report, and more)."""
    # The seed's fields. abi: the Landlock ABI enforced (>= 1), 0 when
    # Landlock was not asked for (unrestricted filesystem and network),
    # -1 when it is unavailable (only possible under best_effort).
    abi: int = 0
    note: str = ""
    rlimits_set: int = 0
    no_new_privs: bool = False
    tid: int = 0
    # Ours.
    kernel_abi: int = 0
    errata: int = 0
    enforced: bool = False
    handled_fs: list[str] = field(default_factory=list)
    handled_net: list[str] = field(default_factory=list)
    scoped: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    downgraded: dict[str, str] = field(default_factory=dict)
    skipped_paths: list[str] = field(default_factory=list)
    rlimits: dict[str, list[int]] = field(default_factory=dict)
    clamped_rlimits: dict[str, str] = field(default_factory=dict)
    capabilities_dropped: bool = False
    uid: int | None = None
    gid: int | None = None
    # A fresh anonymous session keyring, not the caller's (false: no keyrings in the kernel).
    session_keyring: bool = False
    # Holes the kernel leaves open whatever the spec says.
    unix_connect_unrestricted: bool = True
    udp_unrestricted: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text
