"""Resource limits: planned (clamped) before fork; enter.set_rlimits sets them."""
from __future__ import annotations

import resource
from collections.abc import Iterable

from .report import Report
from .spec import Rlimit

Plan = tuple[tuple[int, int, int], ...]  # (resource, soft, hard)


def _finite(v: int) -> float:
    return float("inf") if v == resource.RLIM_INFINITY else v


def plan(rlimits: Iterable[Rlimit], report: Report) -> Plan:
    """Clamp each limit to the current hard limit: a sandbox only lowers limits."""
    out = []
    for r in rlimits:
        _, cur_hard = resource.getrlimit(r.resource)
        soft, hard = r.soft, r.hard
        if _finite(hard) > _finite(cur_hard):
            report.clamped_rlimits[r.name] = f"asked {r.soft}/{r.hard}, hard limit is {cur_hard}"
            hard = cur_hard
        if _finite(soft) > _finite(hard):
            soft = hard
        report.rlimits[r.name] = [soft, hard]
        out.append((r.resource, soft, hard))
    report.rlimits_set = len(out)
    return tuple(out)

