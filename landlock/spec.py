"""Spec: what a confinement should be, validated, with no system calls made."""
from __future__ import annotations

import dataclasses
import json
import resource
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import rights

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SCOPES = ("abstract_unix_socket", "signal")
LOG_FLAGS = {
    "same_exec_off": rights.RestrictFlag.LOG_SAME_EXEC_OFF,
    "new_exec_on": rights.RestrictFlag.LOG_NEW_EXEC_ON,
    "subdomains_off": rights.RestrictFlag.LOG_SUBDOMAINS_OFF,
}
# Other names of the same resource (Python has RLIMIT_OFILE, the BSD name).
RLIMIT_ALIASES = {"OFILE": "NOFILE"}
RLIMIT_NAMES = sorted(n[len("RLIMIT_"):] for n in dir(resource)
                      if n.startswith("RLIMIT_") and n[len("RLIMIT_"):] not in RLIMIT_ALIASES)
# Memory limits are set last: they can break the (Python) process setting them.
MEMORY_RLIMITS = frozenset({"AS", "DATA", "STACK", "MEMLOCK", "RSS"})


class SpecError(ValueError):
    """A spec that cannot be enforced as written (exit code 2)."""


@dataclass(frozen=True)
class Rlimit:
    """One resource limit: its name (NOFILE...), soft and hard values."""
    name: str
    soft: int
    hard: int

    @property
    def resource(self) -> int:
        number: int = getattr(resource, "RLIMIT_" + self.name)
        return number


@dataclass(frozen=True)
class Spec:
    """A confinement. The empty Spec denies everything Landlock can deny.

    Path classes: read_only (read + execute), read_only_noexec,
    read_write (read + write + execute), read_write_noexec; connect_unix
    names pathname sockets the process may connect to (ABI 9).
    `require` names features that must be enforced (see rights.FEATURES);
    the filesystem is required unless best_effort, the rest is enforced
    where the kernel has it and reported where it does not.
    """
    read_only: tuple[str, ...] = ()
    read_only_noexec: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    read_write_noexec: tuple[str, ...] = ()
    connect_unix: tuple[str, ...] = ()
    # Trees a confined process may change (beyond this spec's own writable
    # grants, which always are): no symlink below them is followed when rule
    # paths are opened. A spec narrowed from a wider one names the wider
    # one's writable grants here.
    untrusted_trees: tuple[str, ...] = ()
    bind_tcp: tuple[int, ...] = ()
    connect_tcp: tuple[int, ...] = ()
    bind_udp: tuple[int, ...] = ()
    connect_udp: tuple[int, ...] = ()
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    unrestricted_filesystem: bool = False
    unrestricted_network: bool = False
    rlimits: tuple[Rlimit, ...] = ()
    require: frozenset[str] = frozenset()
    best_effort: bool = False
    strict_paths: bool = False
    log: tuple[str, ...] = ()
    user: str | int | None = None
    group: str | int | None = None
    # Supplementary groups joined besides the user's own (names or gids).
    groups: tuple[str | int, ...] = ()
    keep_capabilities: bool = False
    # Caps the ABI the library uses, to exercise downgrades on a newer
    # kernel; 0 behaves as a kernel without Landlock.
    max_abi: int | None = None

    def __post_init__(self) -> None:
        for name in ("read_only", "read_only_noexec", "read_write", "read_write_noexec",
                     "connect_unix", "untrusted_trees", "scopes", "log"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise SpecError(f"{name}: expected a list of strings, got {value!r}")
            value = tuple(value)
            for item in value:
                if not isinstance(item, str) or not item:
                    raise SpecError(f"{name}: expected non-empty strings, got {item!r}")
            object.__setattr__(self, name, value)
        for name in ("bind_tcp", "connect_tcp", "bind_udp", "connect_udp"):
            object.__setattr__(self, name, _ports(name, getattr(self, name)))
        object.__setattr__(self, "groups", _groups(self.groups))
        for name in ("read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix",
                     "untrusted_trees"):
            for path in getattr(self, name):
                if not path.startswith("/"):
                    raise SpecError(f"{name}: {path!r} is not an absolute path")
        unknown = set(self.scopes) - set(DEFAULT_SCOPES)
        if unknown:
            raise SpecError(f"scopes: unknown {sorted(unknown)} (known: {', '.join(DEFAULT_SCOPES)})")
        unknown = set(self.log) - set(LOG_FLAGS)
        if unknown:
            raise SpecError(f"log: unknown {sorted(unknown)} (known: {', '.join(LOG_FLAGS)})")
        if isinstance(self.require, str):
            raise SpecError(f"require: expected a list of feature names, got {self.require!r}")
        try:
            object.__setattr__(self, "require", rights.expand_requirements(self.require))
        except ValueError as e:
            raise SpecError(f"require: {e}") from None
        object.__setattr__(self, "rlimits", parse_rlimits(self.rlimits))
        if self.max_abi is not None and (isinstance(self.max_abi, bool) or not isinstance(self.max_abi, int)
                                         or self.max_abi < 0):
            raise SpecError(f"max_abi: expected an integer >= 0, got {self.max_abi!r}")
        for name in ("unrestricted_filesystem", "unrestricted_network", "best_effort",
                     "strict_paths", "keep_capabilities"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        if self.unrestricted_filesystem and "filesystem" in self.require:
            raise SpecError("require: filesystem contradicts unrestricted_filesystem")

    @classmethod
    def of(cls, **fields: Any) -> "Spec":
        """A Spec from looser values than its fields' types: any iterable for
        a tuple or for `require`, a {NAME: limit or (soft, hard)} mapping for
        `rlimits`. __post_init__ checks them and makes them the fields' types."""
        return cls(**fields)

    @property
    def path_rules(self) -> list[tuple[str, str]]:
        """(class, path) for every path rule, in a stable order."""
        return [(cls, path) for cls in rights.PATH_CLASSES for path in getattr(self, cls)]

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["require"] = sorted(self.require)
        data["rlimits"] = {r.name: [r.soft, r.hard] for r in self.rlimits}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Spec":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise SpecError(f"spec is not valid JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Spec":
        if not isinstance(data, Mapping):
            raise SpecError(f"spec: expected an object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"spec: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


def _groups(value: Any) -> tuple[str | int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise SpecError(f"groups: expected a list of group names or gids, got {value!r}")
    out = tuple(value)
    for group in out:
        if isinstance(group, bool) or not isinstance(group, (str, int)) or group == "" \
                or isinstance(group, int) and not 0 <= group < 2**32 - 1:
            raise SpecError(f"groups: {group!r} is not a group name or gid")
    return out


def _ports(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise SpecError(f"{name}: expected a list of ports, got {value!r}")
    out = []
    for port in value:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise SpecError(f"{name}: {port!r} is not a port number (0-65535)")
        out.append(port)
    return tuple(out)


def parse_rlimits(value: Any) -> tuple[Rlimit, ...]:
    """Rlimits from {NAME: value | [soft, hard]} or Rlimit objects; memory ones last."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        items = []
        for item in value:
            if not isinstance(item, Rlimit):
                raise SpecError(f"rlimits: expected a mapping of NAME: value, got {item!r}")
            items.append((item.name, (item.soft, item.hard)))
    else:
        raise SpecError(f"rlimits: expected a mapping of NAME: value, got {value!r}")
    out: list[Rlimit] = []
    for name, limit in items:
        key = str(name).upper().removeprefix("RLIMIT_")
        key = RLIMIT_ALIASES.get(key, key)
        if key not in RLIMIT_NAMES:
            raise SpecError(f"rlimits: unknown resource {name!r} (known: {', '.join(RLIMIT_NAMES)})")
        if any(r.name == key for r in out):
            raise SpecError(f"rlimits: {key} given twice")
        if isinstance(limit, (list, tuple)) and len(limit) == 2:
            soft, hard = limit
        else:
            soft = hard = limit
        for v in (soft, hard):
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise SpecError(f"rlimits: {key}: {limit!r} is not a limit (an integer, -1 for unlimited)")
        soft = resource.RLIM_INFINITY if soft == -1 else soft
        hard = resource.RLIM_INFINITY if hard == -1 else hard
        if soft > hard and hard != resource.RLIM_INFINITY:
            raise SpecError(f"rlimits: {key}: soft limit {soft} above hard limit {hard}")
        out.append(Rlimit(key, soft, hard))
    # A canonical order (memory limits last), so equal specs compare equal
    # whatever order they were written in, and to_json round-trips.
    out.sort(key=lambda r: (r.name in MEMORY_RLIMITS, r.name))
    return tuple(out)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_limit(value: int | str) -> int:
    """An rlimit value: an integer, a size with a binary unit (512MiB, 2G), or unlimited."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise SpecError(f"{value!r} is not a limit")
    text = value.strip().lower()
    if text in ("unlimited", "infinity", "-1"):
        return -1
    number = text.rstrip("bi").rstrip("kmgt")
    unit = text[len(number):].rstrip("b").rstrip("i")
    if not number.isdigit() or unit not in _UNITS:
        raise SpecError(f"{value!r} is not a limit (an integer, a size such as 512MiB or 2G, or unlimited)")
    return int(number) * _UNITS[unit]
