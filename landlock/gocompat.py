"""The seed's re-exec wrapper protocol, so a Go proxy can use landlock-exec.

The Go package encodes its Spec as JSON in MCPPROXY_SANDBOX_SPEC, with the
Go field names. Its semantics are kept here, and only here: the zero value
restricts no filesystem path, and the environment passes through.
"""
from __future__ import annotations

import json
import resource
from collections.abc import Mapping

from .spec import DEFAULT_SCOPES as landlock_scopes
from .spec import RLIMIT_NAMES, Spec, SpecError

ENV_GO_SPEC = "MCPPROXY_SANDBOX_SPEC"
ENV_NATIVE_SPEC = "LANDLOCK_EXEC_SPEC"

_RLIMIT_BY_NUMBER = {getattr(resource, "RLIMIT_" + n): n for n in RLIMIT_NAMES}
_GO_FIELDS = {"ReadOnlyPaths", "ReadWritePaths", "Rlimits", "BestEffort"}


def spec_from_go(text: str) -> Spec:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SpecError(f"{ENV_GO_SPEC} is not valid JSON: {e}") from None
    if not isinstance(data, Mapping):
        raise SpecError(f"{ENV_GO_SPEC}: expected an object")
    unknown = sorted(set(data) - _GO_FIELDS)
    if unknown:
        raise SpecError(f"{ENV_GO_SPEC}: unknown field(s) {', '.join(unknown)}")
    # Go encodes nil slices as null.
    ro = data.get("ReadOnlyPaths") or []
    rw = data.get("ReadWritePaths") or []
    limits: dict[str, tuple[int, int]] = {}
    for item in data.get("Rlimits") or []:
        if not isinstance(item, Mapping) or item.get("Resource") not in _RLIMIT_BY_NUMBER:
            raise SpecError(f"{ENV_GO_SPEC}: Rlimits: bad entry {item!r}")
        limits[_RLIMIT_BY_NUMBER[item["Resource"]]] = (_go_limit(item.get("Cur")), _go_limit(item.get("Max")))
    return Spec.of(read_only=ro, read_write=rw, rlimits=limits,
                best_effort=bool(data.get("BestEffort", False)),
                unrestricted_filesystem=not ro and not rw,
                # The zero value asks nothing of Landlock: no scopes either.
                scopes=landlock_scopes if (ro or rw) else (),
                # The seed restricted the filesystem only.
                unrestricted_network=True)


def _go_limit(v: object) -> int:
    # Go's RLIM_INFINITY is the all-ones uint64.
    if v == 2**64 - 1:
        return -1
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(f"{ENV_GO_SPEC}: Rlimits: {v!r} is not a limit")
    return v


def spec_from_environ(environ: Mapping[str, str]) -> tuple[Spec | None, dict[str, str]]:
    """A spec carried by the environment, and that environment without it."""
    env = dict(environ)
    go, native = env.pop(ENV_GO_SPEC, None), env.pop(ENV_NATIVE_SPEC, None)
    if go is not None and native is not None:
        raise SpecError(f"both {ENV_GO_SPEC} and {ENV_NATIVE_SPEC} are set")
    if go is not None:
        return spec_from_go(go), env
    if native is not None:
        return Spec.from_json(native), env
    return None, env
