"""A manifest's `sandbox:` keys: its profiles' fragment, path classes,
network and rlimits → the landlock.Spec and the credentials it runs with;
and the warnings about what it grants. Loader steps (manifest._Loader),
each failing on the key it reads."""
from __future__ import annotations

import os

import landlock
from landlock import privileges
from landlock.spec import parse_limit

from . import profiles
from .file import Expander, Reader, port_list

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix")
PORT_KEYS = ("connect_tcp", "bind_tcp", "connect_udp", "bind_udp")
KEYS = {*PATH_CLASSES, "profiles", "network", "rlimits", "require", "best_effort",
        "scopes", "strict_paths", "log", "max_abi"}
_NETWORK_KEYS = {*PORT_KEYS, "unrestricted"}


def sandbox(sandbox: Reader, context: profiles.Context, expand: Expander, user: str | int | None,
            group: str | int | None, groups: list[str]
            ) -> tuple[profiles.Fragment, landlock.Spec, privileges.Credentials | None]:
    """The profiles' fragment, the Spec, its credentials."""
    fragment = profiles.combine(sandbox.strings("profiles"), context, lambda msg: sandbox.fail("profiles", msg))
    spec, creds = _spec(sandbox, _paths(sandbox, fragment, context.state_dir, expand), user, group, groups)
    return fragment, spec, creds


def _paths(sandbox: Reader, fragment: profiles.Fragment, state_dir: str | None,
           expand: Expander) -> dict[str, list[str]]:
    paths = {cls: fragment.paths.get(cls, []) + [expand(f"sandbox.{cls}[{i}]", p)
                                                 for i, p in enumerate(sandbox.strings(cls))]
             for cls in PATH_CLASSES}
    if state_dir:
        paths["read_write_noexec"].append(state_dir)
    for cls, items in paths.items():
        for p in items:
            if not os.path.isabs(p):
                sandbox.fail(cls, f"{p!r} is not an absolute path")
    return paths


def _spec(sandbox: Reader, paths: dict[str, list[str]], user: str | int | None,
          group: str | int | None, groups: list[str]) -> tuple[landlock.Spec, privileges.Credentials | None]:
    """The Spec, and the credentials it runs with (looked up here, once)."""
    network = Reader(sandbox.source, sandbox.data.get("network"), "sandbox.network.", _NETWORK_KEYS)
    ports = {k: port_list(network, k) for k in PORT_KEYS}
    rlimits = _rlimits(sandbox)
    try:
        spec = landlock.Spec(
            **paths, **ports,
            # Carried into every narrowing of it: a narrowed spec may drop a
            # writable grant, not the server's power to plant links there.
            untrusted_trees=(*paths["read_write"], *paths["read_write_noexec"]),
            unrestricted_network=network.get("unrestricted", bool, False),
            scopes=sandbox.strings("scopes", landlock.spec.DEFAULT_SCOPES),
            rlimits=rlimits, require=sandbox.strings("require"),
            best_effort=sandbox.get("best_effort", bool, False),
            strict_paths=sandbox.get("strict_paths", bool, False),
            log=sandbox.strings("log"), max_abi=sandbox.get("max_abi", int, None),
            user=user, group=group, groups=tuple(groups), keep_capabilities=False)
        return spec, privileges.resolve(user, group, spec.groups)
    except landlock.SpecError as e:
        sandbox.fail("", str(e))


def _rlimits(sandbox: Reader) -> dict[str, Any]:
    rlimits: dict[str, Any] = {}
    for key, value in sandbox.get("rlimits", dict, {}).items():
        try:
            if isinstance(value, list) and len(value) == 2:
                rlimits[str(key)] = (parse_limit(value[0]), parse_limit(value[1]))
            else:
                rlimits[str(key)] = parse_limit(value)
        except landlock.SpecError as e:
            sandbox.fail(f"rlimits.{key}", str(e))
    return rlimits


def warnings(fragment: profiles.Fragment, spec: landlock.Spec, user: str | int | None,
             command: str, state_root: str | None) -> tuple[str, ...]:
    """What the manifest loads with but should know: a grant over the
    state root, an NPROC limit on a shared uid, a snap launcher."""
    said = list(fragment.warnings)
    if state_root:
        root = os.path.realpath(state_root)
        for cls in ("read_write", "read_write_noexec"):
            for path in getattr(spec, cls):
                real = os.path.realpath(path)
                if root == real or root.startswith(real.rstrip("/") + "/"):
                    said.append(f"{cls} {path} holds the supervisor's state root {state_root}: the "
                                "server can rewrite every server's state and the parsed manifests")
    if any(r.name == "NPROC" for r in spec.rlimits) and user is None:
        said.append("rlimits.NPROC counts every process of the real uid: without a dedicated "
                    "user it limits the supervisor's own user")
    if command.startswith("/snap/"):
        said.append(f"command {command} is a snap launcher: it fails under no_new_privs; "
                    "name the real binary")
    return tuple(said)
