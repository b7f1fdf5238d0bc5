"""Landlock confinement for one process: Spec in, Report out.

Knows nothing of the supervisor; the supervisor builds on it. Names are
imported on first use: a process that only enters prepared confinements
(landlock.enter) stays free of the rest, which would slow its every fork.
"""
from __future__ import annotations

import importlib

# Not typing itself at run time: the zygote imports this package, and every
# module it holds makes each of its forks slower (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_EXPORTS = {
    "enforce": ("Confinement", "NotSingleThreaded", "apply", "exec_confined", "prepare"),
    "exits": ("EXIT_EXEC_FAILED", "EXIT_NOT_FOUND", "EXIT_THREADS", "EXIT_UNAVAILABLE", "EXIT_USAGE"),
    "support": ("Support", "abi_version", "available", "keyrings_available", "probe"),
    "report": ("Report",),
    "rights": ("LATEST_ABI",),
    "ruleset": ("LandlockUnavailable", "Ruleset", "build", "downgrade"),
    "spec": ("Rlimit", "Spec", "SpecError", "parse_limit"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
