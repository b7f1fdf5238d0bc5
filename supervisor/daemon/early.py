"""What a supervisor does before its zygote, which inherits it; light to import.

A private supervisor does it first thing and spawns its zygote before it
imports the server's modules and loads its manifest (serve.main): the
zygote's start-up (~13 ms, a fresh interpreter) then runs meanwhile on the
other core. A daemon does it in Supervisor.serve.
"""
from __future__ import annotations

import os

import prctl

from . import namespaces
from ..stdio import keep_stdio_open
from .log import log

__all__ = ["KEEP_CAPABILITIES", "keep_stdio_open", "prepare"]

# What a root supervisor keeps in its bounding set: users and groups to
# switch to, capabilities and securebits to drop, state directories to chown,
# paths of other users to read, children of other uids to signal, its own
# resource limits to restore.
KEEP_CAPABILITIES = (prctl.CAP_CHOWN, prctl.CAP_DAC_OVERRIDE, prctl.CAP_DAC_READ_SEARCH,
                     prctl.CAP_FOWNER, prctl.CAP_KILL, prctl.CAP_SETGID, prctl.CAP_SETUID,
                     prctl.CAP_SETPCAP, prctl.CAP_SYS_RESOURCE)


def prepare(state_root: str | None) -> namespaces.Isolation | None:
    """What comes before the zygote, which inherits it: a subreaper, a root
    supervisor's namespaces (its dynamic users' entries come with the
    manifests), the bounding set shrunk."""
    keep_stdio_open()
    prctl.set_child_subreaper(1)
    isolation = None
    if os.geteuid() == 0:
        # Before the zygote: it and every child inherit the namespaces.
        isolation = namespaces.isolate(log, None, os.path.join(state_root, "nss") if state_root else None)
    if prctl.cap_effective.setpcap:
        from landlock import privileges
        privileges.limit_bounding_set(KEEP_CAPABILITIES)
    return isolation
