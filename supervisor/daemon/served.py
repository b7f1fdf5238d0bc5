"""Which manifests a supervisor serves, and why each other one is not: loaded one by one, refused here (a writable grant holding it, root without `--allow-root-servers`, its state), each told in one line.

A manifest that does not load, or is refused, never stops the others;
none served while some are named stops the start.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

from . import denials
from ..manifests import ids, refusal, state
from ..manifests import manifest as manifests
from .log import log
from ..manifests.manifest import Manifest, ManifestError

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Sources(Protocol):
        """Where manifests come from and what this supervisor accepts (server.Config's)."""
        manifest_paths: list[str]
        only: str | None
        state_root: str | None
        dynamic_uids: tuple[int, int]
        dynamic_uids_of: str | None
        allow_root_servers: bool


def load(sources: Sources, logged: Callable[[Any], tuple[Any, str | None]]) -> tuple[dict[str, Manifest], dict[str, str]]:
    """The manifests served, and why each other one is not (name -> one
    line naming its file). logged: a Spec with the log flags the denial
    mode gives its domains, and a warning (audit.Visibility.logged)."""
    table = None
    if os.geteuid() == 0 and sources.state_root:
        table = ids.Table(sources.dynamic_uids_of or sources.state_root, sources.dynamic_uids)
    parsed = state.parsed_directory(sources.state_root, log) if sources.state_root else None
    loaded, broken = manifests.load_each(
        sources.manifest_paths, only=sources.only, warn=log, state_root=sources.state_root,
        parsed=parsed, dynamic_uid=(lambda name: table.assign([name], log)[name]) if table else None)
    withdrawn = {b.name: b.error for b in broken}
    served = {}
    for m in loaded.values():
        held = manifests.writable_holding(m.source, loaded.values())
        if held:
            withdrawn[m.name] = (f"{m.source}: refused: it lies inside {held[0].name}'s writable grant "
                                 f"{held[1]}, where that server could rewrite it")
            continue
        spec, warning = logged(m.spec)
        m = dataclasses.replace(m, spec=spec)
        if warning:
            log(f"{m.source}: warning: {warning}")
        why = _refusal(m, sources.allow_root_servers)
        if why is not None:
            withdrawn[m.name] = f"{m.source}: refused: {why}"
            continue
        for warning in m.warnings:
            log(f"{m.source}: warning: {warning}")
        served[m.name] = m
    return served, withdrawn


def _refusal(m: Manifest, allow_root_servers: bool) -> str | None:
    """Why a manifest that loads is not served by this supervisor, or None.
    Each reason is one check here; state.prepare, which creates its
    state, comes last."""
    if m.runs_as_root and not allow_root_servers:
        why = "allow_root: true" if m.allow_root else f"user {m.spec.user!r} is uid 0"
        return f"it runs as root ({why}), which needs `serve --allow-root-servers`"
    return state.prepare(m, log)


def protected(served: Iterable[Manifest], state_root: str | None, socket_path: str | None) -> refusal.Known:
    """What the denial lines never propose (refusal.py): the homes of
    passwd and ours, each server's HOME, our state root, parsed
    manifests and socket directory."""
    homes = {*denials.home_dirs(), *(dict(m.env).get("HOME") for m in served)}
    own = [state_root, state_root and os.path.join(state_root, "parsed"),
           socket_path and os.path.dirname(os.path.abspath(socket_path))]
    return refusal.known(homes, own)


def starting(served: dict[str, Manifest], withdrawn: dict[str, str]) -> None:
    """Each manifest not served, one line; none served while some are
    named: not starting (with the one's own error when it is one)."""
    if withdrawn and not served:
        if len(withdrawn) == 1:
            raise ManifestError(next(iter(withdrawn.values())))
        for why in withdrawn.values():
            log(why)
        raise ManifestError(f"none of the {len(withdrawn)} manifests is served (each is named above)")
    for why in withdrawn.values():
        log(f"{why}: not served")


def dynamic_users(loaded: dict[str, Manifest]) -> dict[int, str]:
    """The passwd entries of the dynamic users the served manifests run as (namespaces.Isolation.users)."""
    return {m.uid: ids.user_name(m.name) for m in loaded.values() if m.dynamic and m.uid is not None}
