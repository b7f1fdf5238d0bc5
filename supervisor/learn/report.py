"""What learn says of its own work: each run, the calls that failed, the grants no run confirmed, the denials that remained.

A manifest that looks validated while a call failed, or a grant the last
round added with no run after it, would be a lie the reader pastes into
production: each is named here (the summary on stderr, the manifest's
header) and the exit code says the same (learner.exit_code). What the
server chose (its messages, paths, comm) is one escaped token each.
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..manifests.secrets import within
from .collapse import RIGHTS, Proposal, describe
from . import temporary
from ..denied import clean
from ..manifests.scalar import q
from .runner import Run
from .session import RPC_ERROR, TIMEOUT, TOOL_ERROR, Outcome
from .trace import BIND_TCP, CONNECT_TCP, CONNECT_UNIX, EXEC, WRITE_KINDS, Access

if TYPE_CHECKING:
    from .learner import Learner

SHOWN = 12   # lines of a kind in the summary; the rest are in the manifest


@dataclass
class Round:
    what: str               # "learning run", "validation run"
    run: Run
    denials: list[Access]   # counted: the reads left out as optional are not


def timed_out(run: Run) -> Outcome | None:
    """The request that got no reply in time (a server that closed its stdout, denied its script say, is
    retried as any run with denials)."""
    return next((o for o in run.outcomes if o.failure == TIMEOUT), None)


def failures(run: Run, allow_tool_errors: bool = False) -> list[Outcome]:
    """The requests of a run that failed; a tool's error reply is none with --allow-tool-errors."""
    return [o for o in run.outcomes
            if not o.ok and not (allow_tool_errors and o.failure in (TOOL_ERROR, RPC_ERROR) and o.tool)]


def failure_text(o: Outcome) -> str:
    """`tools/call fetch (request 3, tool error): "the server's own message"`, one line."""
    return f"{o.call} (request {o.number}, {o.failure}): \"{clean(o.detail)}\""


def outcome_text(o: Outcome) -> str:
    return f"{o.call}: ok" if o.ok else f"FAILED {failure_text(o)}"


def outcomes_text(outcomes: Sequence[Outcome]) -> str:
    return ", ".join(map(outcome_text, outcomes)) or "no reply"


def allowing(a: Access, p: Proposal) -> str:
    """The line of a proposal that allows a denied access, as a person would add it."""
    if a.kind in (CONNECT_TCP, BIND_TCP):
        ports = p.connect_tcp if a.kind == CONNECT_TCP else p.bind_tcp
        return f"allowed by `network: {a.kind}: [{a.port}]`" if a.port in ports else "no line proposed"
    key = f"{a.kind} {a.path}"
    if key in p.refused:
        return f"never proposed ({clean(p.refused[key])})"
    where = next((t for t in p.temporary if within(a.path, t)), None)
    if where is not None:
        return f"never proposed ({temporary.WHY})"
    if a.path in p.writes:
        return f"learn again with --write {shlex.quote(clean(a.path))} to allow it"
    if a.kind == CONNECT_UNIX:
        return f"allowed by `connect_unix: [{q(a.path)}]`" if a.path in p.connect_unix else "no line proposed"
    rights = RIGHTS["read_write_noexec" if a.kind in WRITE_KINDS else "read_only" if a.kind == EXEC
                    else "read_only_noexec"]
    grant = next((g for g in p.grants if within(a.path, g.path) and rights <= g.rights | {"r"}), None)
    return f"allowed by `{grant.cls}: [{q(grant.path)}]`" if grant else "no line proposed (its profiles give it)"


def remaining(learner: Learner) -> list[tuple[int, Access]]:
    """The denials the last run met (or the run a call timed out in), with their run's number."""
    found = learner.held or learner.rounds[-1].denials
    # strace's and the kernel's word for the same denial: once.
    once: dict[tuple[str, str, int], Access] = {}
    for a in found:
        once.setdefault((a.kind, a.path, a.port), a)
    return [(len(learner.rounds), a) for a in once.values()]


def verdict(learner: Learner, validated: bool) -> str:
    """The manifest's first line's account of the last run."""
    if not validated:
        return "NOT validated: see the summary on stderr"
    met = len(remaining(learner))
    return (f"the last needed no new grant; the {met} denial{'s' * (met != 1)} it met, nothing here allows"
            if met else "the last had no denial")


def failed_calls_header(learner: Learner) -> list[str]:
    """For the manifest's header: the calls of the last run that failed (with --allow-tool-errors, allowed)."""
    run = learner.rounds[-1].run
    allowed = learner.opts.allow_tool_errors
    return [f"FAILED in the last run: {failure_text(o)}" for o in failures(run, allowed)] + \
        [f"Failed, allowed by --allow-tool-errors: {failure_text(o)}" for o in run.outcomes
         if not o.ok and o not in failures(run, allowed)]


def summary(learner: Learner, proposal: Proposal, validated: bool, seconds: float) -> list[str]:
    out = [f"learn: {learner.name}: {len(learner.rounds)} runs in {seconds:.1f}s"]
    for number, r in enumerate(learner.rounds, 1):
        tail = f", {len(r.denials)} denial{'s' * (len(r.denials) != 1)}" if number > 1 else ""
        out.append(f"  run {number} ({r.what}, {r.run.seconds:.1f}s): {outcomes_text(r.run.outcomes)}{tail}")
    grants = len(proposal.connect_tcp) + len(proposal.bind_tcp)
    out.append(f"  grants: profiles {', '.join(proposal.profiles)}; {len(proposal.grants)} paths; "
               f"{grants} port{'s' * (grants != 1)}")
    out += [f"  broad: {g.cls} {clean(g.path)}: {g.flag}" for g in proposal.grants if g.flag]
    out += [f"  network: {key} {port}: {clean(why)}" for key, ports in (("connect_tcp", proposal.connect_tcp),
                                                                       ("bind_tcp", proposal.bind_tcp))
            for port, why in sorted(ports.items())]
    out += _limited([f"  NOT VALIDATED: {clean(key)}: the last round added it, no run confirmed it"
                     for key in sorted(proposal.untested)])
    would = learner.would or proposal
    out += _limited([f"  denied in run {number}: {clean(describe(a))}: {allowing(a, would)}"
                     for number, a in remaining(learner)])
    # Paths and evidence are the server's: one escaped token each (the
    # --write suggestion one shell word too).
    items = [f"  not granted (learn again with --write {shlex.quote(clean(path))} to allow it): {clean(why)}"
             for path, why in sorted(proposal.writes.items())]
    items += [f"  refused: {clean(what)}: {clean(why)}" for what, why in sorted(proposal.refused.items())]
    items += [f"  temporary, not granted ({temporary.WHY}): {clean(path)}: {clean(why)}"
              for path, why in sorted(proposal.temporary.items())]
    out += _limited(items)
    last = learner.rounds[-1].run
    stopped = timed_out(last)
    if stopped is not None and len(learner.rounds) < learner.opts.rounds:
        out.append(f"  stopped after run {len(learner.rounds)}: {stopped.call} got {stopped.failure}: no round "
                   "is started after it (its denials are listed above, not granted)")
    out += [f"  FAILED: {failure_text(o)}" for o in failures(last, learner.opts.allow_tool_errors)]
    if not validated:
        out.append("  NOT validated: " + ("grants the last round added were never run" if proposal.untested else
                                         "the last run met denials it was not given" if remaining(learner) else
                                         f"the session failed ({outcomes_text(last.outcomes)})"))
        if last.stderr.strip():
            out.append("  its stderr ends with: " + last.stderr.strip()[-600:])   # the server's own, as it is
    return out


def _limited(items: list[str]) -> list[str]:
    return items[:SHOWN] + ([f"  ... and {len(items) - SHOWN} more: see the manifest"] if len(items) > SHOWN else [])
