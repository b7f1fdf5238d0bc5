"""A proposal -> the commented YAML manifest `serve` loads as it is (and the variants learn's runs load).

PyYAML writes no comments, so the text is written here: every string is
double-quoted with every character but printable ASCII escaped (manifests/scalar.q),
every grant has its why on its line. What a server chose reaches a comment escaped
(denied.clean): a line break there would end the comment and start YAML.
`${STATE_DIR}` is left for the loader to expand.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .collapse import Grant, Proposal
from ..denied import clean
from ..manifests.scalar import q

PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec")
_WIDTH = 48   # the column comments start at
_ENV_NOTES = {"HOME": "programs that look for a home find their state directory",
              "TMPDIR": "its temporary files in its own directory, never the shared /tmp"}


@dataclass(frozen=True)
class Draft:
    """The manifest but its sandbox: what the supervisor will give the server."""
    name: str
    command: str
    args: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: tuple[str, ...] = ("PATH",)
    dynamic: bool = False      # `user: dynamic` (a root supervisor's)
    uid: int | None = None     # otherwise: the invoking user, whose own supervisor runs it as itself


def _line(text: str, comment: str = "") -> str:
    return f"{text:<{_WIDTH}} # {clean(comment)}".rstrip() if comment else text


def top(draft: Draft, command: str | None = None, args: Sequence[str] | None = None) -> list[str]:
    """Every key but `sandbox`; command and args replaced for a traced variant."""
    out = [f"name: {q(draft.name)}", f"command: {q(command or draft.command)}", "args:"]
    out[-1] += "" if (args if args is not None else draft.args) else " []"
    out += [f"  - {q(a)}" for a in (args if args is not None else draft.args)]
    if draft.cwd:
        out.append(f"cwd: {q(draft.cwd)}")
    out.append("env:" if draft.env else "env: {}")
    out += [_line(f"  {k}: {q(v)}", _ENV_NOTES.get(k, "") if v == "${STATE_DIR}" else "")
            for k, v in sorted(draft.env.items())]
    out.append(f"inherit_env: [{', '.join(q(n) for n in draft.inherit_env)}]")
    out.append(_line("state_dir: true", "its own writable directory, and its caches beside it"))
    if draft.dynamic:
        out.append(_line("user: dynamic", "a root supervisor gives it a uid of its own"))
    elif draft.uid is not None:
        out.append(f"# no user: a user's own supervisor runs it as itself (learnt as uid {draft.uid})")
    return out


UNTESTED = "NOT VALIDATED (the last round added it, no run has confirmed it): "


def _grant_line(g: Grant, untested: bool) -> str:
    why = (UNTESTED if untested else "") + g.reason + (f"; {g.flag}" if g.flag else "")
    seen = "; ".join(g.evidence) + (f" and {g.seen - len(g.evidence)} more" if g.seen > len(g.evidence) else "")
    return _line(f"    - {q(g.path)}", f"{why}: {seen}" if seen else why)


def sandbox(p: Proposal, extra: Mapping[str, Sequence[str]] | None = None,
            profile_notes: Mapping[str, str] | None = None) -> list[str]:
    """The sandbox key of a proposal; `extra` adds paths per class (a traced variant's)."""
    notes = profile_notes or {}
    out = ["sandbox:", f"  profiles: [{', '.join(p.profiles)}]"]
    out += [f"  # {name}: {notes[name]}" for name in p.profiles if name in notes]
    for cls in PATH_CLASSES:
        grants = [g for g in p.grants if g.cls == cls]
        more = list((extra or {}).get(cls, ()))
        if grants or more:
            out.append(f"  {cls}:")
            out += [_grant_line(g, f"{g.cls} {g.path}" in p.untested) for g in grants]
            out += [f"    - {q(path)}" for path in more]
    if p.connect_unix:
        out.append("  connect_unix:")
        out += [_line(f"    - {q(path)}", _mark(p, f"connect_unix {path}") + why)
                for path, why in sorted(p.connect_unix.items())]
    if p.connect_tcp or p.bind_tcp:
        out.append("  network:")
        for key, ports in (("connect_tcp", p.connect_tcp), ("bind_tcp", p.bind_tcp)):
            if ports:
                out.append(f"    {key}:")
                out += [_line(f"      - {port}", _mark(p, f"{key} {port}") + why)
                        for port, why in sorted(ports.items())]
    return out


def _mark(p: Proposal, key: str) -> str:
    return UNTESTED if key in p.untested else ""


def not_granted(p: Proposal) -> list[str]:
    """The closing comment: what the server tried and did not get, and how to give it."""
    out = []
    if p.writes:
        out.append("# Writes it attempted outside what learning let it write (not granted;")
        out.append("# learn again with --write PATH to allow one):")
        out += [f"#   {clean(path)}: {clean(why)}" for path, why in sorted(p.writes.items())]
    if p.temporary:
        out.append("# Temporary names (not granted, never a --write: the manifest's TMPDIR, its state")
        out.append("# directory, takes their place):")
        out += [f"#   {clean(path)}: {clean(why)}" for path, why in sorted(p.temporary.items())]
    if p.optional:
        out.append("# Left out: reads its profiles' programs do without (denied, they are harmless, and")
        out.append("# counted as suppressed where denials are seen):")
        out += [f"#   {clean(path)}: {clean(why)}" for path, why in sorted(p.optional.items())]
    if p.refused:
        out.append("# Refused (never proposed):")
        out += [f"#   {clean(what)}: {clean(why)}" for what, why in sorted(p.refused.items())]
    return out


def manifest(draft: Draft, p: Proposal, header: Sequence[str], profile_notes: Mapping[str, str]) -> str:
    lines = [f"# {clean(h)}" if h else "#" for h in header]
    lines += top(draft) + sandbox(p, profile_notes=profile_notes) + not_granted(p)
    return "\n".join(lines) + "\n"
