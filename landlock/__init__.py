"""Landlock confinement for one process: Spec in, Report out.

Knows nothing of the supervisor; the supervisor builds on it.
"""
from .enforce import (EXIT_EXEC_FAILED, EXIT_NOT_FOUND, EXIT_THREADS, EXIT_UNAVAILABLE,
                      EXIT_USAGE, Confinement, NotSingleThreaded, apply, exec_confined, prepare)
from .probe import Support, abi_version, available, probe
from .report import Report
from .rights import LATEST_ABI
from .ruleset import LandlockUnavailable, Ruleset, build
from .spec import Rlimit, Spec, SpecError, parse_limit

__all__ = [
    "Confinement", "EXIT_EXEC_FAILED", "EXIT_NOT_FOUND", "EXIT_THREADS", "EXIT_UNAVAILABLE",
    "EXIT_USAGE", "LATEST_ABI", "LandlockUnavailable", "NotSingleThreaded", "Report", "Rlimit",
    "Ruleset", "Spec", "SpecError", "Support", "abi_version", "apply", "available", "build",
    "exec_confined", "parse_limit", "prepare", "probe",
]
