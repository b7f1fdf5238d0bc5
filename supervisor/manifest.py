"""Server manifests: one YAML file a server, validated into a Manifest and its Spec.

The policy lives here, in files the supervisor's owner wrote; a client's
request can only name a manifest and narrow what it grants (see policy.py).
Every error names the file, the key and what was expected.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import landlock
from landlock import privileges
from landlock.spec import parse_limit

from . import ids, profiles

MAX_MANIFEST_BYTES = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix")
MAX_POOL = 8
_TOP_KEYS = {"name", "command", "args", "cwd", "env", "inherit_env", "client_env", "client_args",
             "user", "group", "allow_root", "umask", "sandbox", "on_disconnect", "state_dir", "pool",
             "terminal"}
_SANDBOX_KEYS = {*PATH_CLASSES, "profiles", "network", "rlimits", "require", "best_effort",
                 "scopes", "strict_paths", "log", "max_abi"}
_NETWORK_KEYS = {"connect_tcp", "bind_tcp", "connect_udp", "bind_udp", "unrestricted"}


class ManifestError(ValueError):
    pass


@dataclass(frozen=True)
class Manifest:
    name: str
    source: str
    command: str                     # absolute, resolved at load time
    args: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]
    inherit_env: tuple[str, ...]
    client_env: frozenset[str]
    client_args: bool
    umask: int
    on_disconnect: str
    state_dir: str | None
    spec: landlock.Spec
    allow_root: bool = False
    pool: int = 0                    # children kept forked and confined, ready for a request
    terminal: bool = False           # a client may pass a terminal as stdio (it can then inject input)
    warnings: tuple[str, ...] = field(default=())
    area: str | None = None          # <state root>/servers/<name>: the supervisor's, holding state and caches
    dynamic: bool = False            # `user: dynamic`
    uid: int | None = None           # what the child runs as; None: the supervisor's own uid
    runs_as_root: bool = False       # a root supervisor runs it as uid 0 (allow_root, or a user of uid 0)

    def environment(self, supervisor_env: Mapping[str, str],
                    client_env: Mapping[str, str] = {}) -> dict[str, str]:
        """Exactly env + the inherited names + what the client may supply."""
        env = {k: supervisor_env[k] for k in self.inherit_env if k in supervisor_env}
        env.update(self.env)
        env.update(client_env)
        return env


class _Reader:
    """Typed access to one mapping of a manifest, errors naming file and key."""

    def __init__(self, source: str, data: Any, prefix: str, known: set[str]) -> None:
        self.source, self.prefix = source, prefix
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(prefix.rstrip("."), f"expected a mapping, got {_kind(data)}")
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            self.fail(unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
        self.data = data

    def fail(self, key: str, message: str) -> None:
        raise ManifestError(f"{self.source}: {self.prefix}{key}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML's true is an int to isinstance(); a boolean is never a number here.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.fail(key, f"expected {' or '.join(_KIND_NAMES[k] for k in kinds)}, got {_kind(value)}")
        return value

    def strings(self, key: str, default: Iterable[str] = ()) -> list[str]:
        value = self.get(key, list, list(default))
        for i, item in enumerate(value):
            if not isinstance(item, (str, int)) or isinstance(item, bool):
                self.fail(f"{key}[{i}]", f"expected a string, got {_kind(item)}")
        return [str(v) for v in value]

    def mapping(self, key: str) -> dict[str, str]:
        value = self.get(key, dict, {})
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                self.fail(f"{key}.{k}", "not a valid variable name")
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                self.fail(f"{key}.{k}", f"expected a string, got {_kind(v)}")
            out[k] = str(v)
        return out


_KIND_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number", type(None): "nothing"}


def _kind(value: Any) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


class _Expander:
    """${VAR} from the supervisor's environment (plus STATE_DIR), ~ at the start."""

    def __init__(self, reader: _Reader, env: Mapping[str, str]) -> None:
        self.reader, self.env = reader, env

    def __call__(self, key: str, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in self.env:
                self.reader.fail(key, f"${{{m.group(1)}}} is not set in the supervisor's environment")
            return self.env[m.group(1)]
        text = _VAR.sub(sub, text)
        if text == "~" or text.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                self.reader.fail(key, "~ used but HOME is not set")
            text = home + text[1:]
        return text


DynamicUid = Callable[[str], int]


def _read(source: str) -> Any:
    """The YAML document of a manifest file, size-capped, aliases refused."""
    try:
        size = os.stat(source).st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{source}: file of {size} bytes exceeds {MAX_MANIFEST_BYTES}")
        with open(source, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{source}: {e.strerror}") from None
    try:
        # Aliases are refused outright: "billion laughs" anchors expand to
        # gigabytes, and no manifest needs them.
        return yaml.load(text, Loader=_SafeNoAliases)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        # ValueError: a timestamp that is no date, an int of 5,000 digits;
        # RecursionError: nesting thousands deep.
        # One line: PyYAML's own message spans several, with a caret drawing.
        where = " ".join(str(e).split())[:500]
        raise ManifestError(f"{source}: not valid YAML: {type(e).__name__}: {where}") from None


def name_of(path: str) -> str:
    """A manifest's name, read without expanding anything (no ${VAR} needs
    to be set): what a private supervisor for one server looks for."""
    data = _read(path)
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else Path(path).stem


def load(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
         state_root: str | None = None, as_root: bool | None = None,
         dynamic_uid: DynamicUid | None = None) -> Manifest:
    """dynamic_uid(name): the uid of a `user: dynamic` manifest under a root
    supervisor (ids.Table); without it such a manifest runs as the supervisor."""
    source = str(path)
    env = dict(os.environ if env is None else env)
    as_root = os.geteuid() == 0 if as_root is None else as_root
    data = _read(source)
    top = _Reader(source, data, "", _TOP_KEYS)
    name = top.get("name", str, Path(source).stem)
    if not _NAME.match(name):
        top.fail("name", f"{name!r} is not a valid name (letters, digits, '.', '_', '-'; at most 64)")

    state_dir = None
    area = os.path.join(state_root, "servers", name) if state_root else None
    want_state = top.get("state_dir", (bool, str), False)
    if want_state:
        if want_state is True and area is None:
            top.fail("state_dir", "no state root is configured for this supervisor")
        state_dir = os.path.join(area, "state") if want_state is True else want_state
        env = {**env, "STATE_DIR": state_dir}
    expand = _Expander(top, env)
    if isinstance(want_state, str):
        state_dir = expand("state_dir", want_state)
        env["STATE_DIR"] = state_dir
        if not os.path.isabs(state_dir):
            top.fail("state_dir", f"{state_dir!r} is not an absolute path")

    inherit_env = top.strings("inherit_env")
    manifest_env = {k: expand(f"env.{k}", v) for k, v in top.mapping("env").items()}
    path_var = manifest_env.get("PATH") or (env.get("PATH") if "PATH" in inherit_env else None) or os.defpath
    command = top.get("command", str, None)
    if not command:
        top.fail("command", "missing")
    command = expand("command", command)
    resolved = command if "/" in command else shutil.which(command, path=path_var)
    if not resolved or not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
        top.fail("command", f"{command!r} is not an executable file"
                 + ("" if "/" in command else f" on PATH {path_var}"))
    resolved = os.path.abspath(resolved)
    args = [expand(f"args[{i}]", a) for i, a in enumerate(top.strings("args"))]
    cwd = expand("cwd", top.get("cwd", str, state_dir or "/"))
    if not os.path.isabs(cwd):
        top.fail("cwd", f"{cwd!r} is not an absolute path")
    client_env = top.strings("client_env")
    for i, var in enumerate(client_env):
        if not _ENV_NAME.match(var):
            top.fail(f"client_env[{i}]", f"{var!r} is not a valid variable name")
    umask_text = top.get("umask", (str, int), "077")
    if isinstance(umask_text, int) and umask_text != 0:
        # YAML reads 077 as the number 63 (and 22 as 22): only a string says what was meant.
        top.fail("umask", f"expected a quoted octal string such as \"077\", got the number {umask_text} (YAML reads 022 as 18: quote it)")
    try:
        umask = int(str(umask_text), 8)
    except ValueError:
        top.fail("umask", "expected an octal string such as \"077\"")
    if not 0 <= umask <= 0o777:
        top.fail("umask", "expected an octal value from 000 to 777")
    pool = top.get("pool", int, 0)
    terminal = top.get("terminal", bool, False)
    if not 0 <= pool <= MAX_POOL:
        top.fail("pool", f"expected 0 to {MAX_POOL} children, got {pool}")
    on_disconnect = top.get("on_disconnect", str, "kill")
    if on_disconnect not in ("kill", "keep"):
        top.fail("on_disconnect", f"expected kill or keep, got {on_disconnect!r}")
    user = top.get("user", (str, int), None)
    group = top.get("group", (str, int), None)
    allow_root = top.get("allow_root", bool, False)
    dynamic = user == "dynamic"
    if dynamic:
        if allow_root:
            top.fail("allow_root", "contradicts `user: dynamic`")
        # A user's own supervisor cannot switch uids: it runs the server as itself.
        if as_root and dynamic_uid is None and state_root:
            dynamic_uid = lambda n: ids.Table(state_root).peek(n)[0]  # noqa: E731  (what it has or would get)
        try:
            user = dynamic_uid(name) if as_root and dynamic_uid is not None else None
        except (ids.IdError, OSError) as e:
            top.fail("user", f"dynamic: {e}")
        if user is None and as_root:
            top.fail("user", "dynamic: this supervisor has no state root for its table of dynamic users")
        if user is not None and group is None:
            group = user
    if as_root and user is None and not allow_root and not dynamic:
        top.fail("user", "required when the supervisor runs as root "
                 "(user: dynamic, a user name, or allow_root: true with every capability dropped)")

    sandbox = _Reader(source, data.get("sandbox") if isinstance(data, dict) else None, "sandbox.", _SANDBOX_KEYS)
    fragment = profiles.combine(sandbox.strings("profiles"), profiles.Context(
        env={**env, **manifest_env, **{k: env[k] for k in inherit_env if k in env}},
        state_dir=state_dir, command=resolved, area=area), lambda msg: sandbox.fail("profiles", msg))
    paths = {cls: fragment.paths.get(cls, []) + [expand(f"sandbox.{cls}[{i}]", p)
                                                 for i, p in enumerate(sandbox.strings(cls))]
             for cls in PATH_CLASSES}
    if state_dir:
        paths["read_write_noexec"].append(state_dir)
    for cls, items in paths.items():
        for p in items:
            if not os.path.isabs(p):
                sandbox.fail(cls, f"{p!r} is not an absolute path")
    network = _Reader(source, sandbox.data.get("network"), "sandbox.network.", _NETWORK_KEYS)
    ports = {k: _port_list(network, k) for k in ("connect_tcp", "bind_tcp", "connect_udp", "bind_udp")}
    rlimits = {}
    for key, value in sandbox.get("rlimits", dict, {}).items():
        try:
            if isinstance(value, list) and len(value) == 2:
                rlimits[str(key)] = (parse_limit(value[0]), parse_limit(value[1]))
            else:
                rlimits[str(key)] = parse_limit(value)
        except landlock.SpecError as e:
            sandbox.fail(f"rlimits.{key}", str(e))
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
            user=user, group=group, keep_capabilities=False)
        creds = privileges.resolve(user, group)
    except landlock.SpecError as e:
        sandbox.fail("", str(e))
    defaults = {}
    if dynamic and user is not None:
        # No passwd entry outside the supervisor's mount namespace: programs
        # that ask for HOME or the user's name get them here.
        defaults = {k: v for k, v in (("HOME", state_dir or "/"), ("USER", ids.user_name(name)),
                                      ("LOGNAME", ids.user_name(name))) if k not in inherit_env}
    manifest_env = {**defaults, **fragment.env, **manifest_env}  # the manifest's own values win
    warnings = list(fragment.warnings)
    if any(r.name == "NPROC" for r in spec.rlimits) and user is None:
        warnings.append("rlimits.NPROC counts every process of the real uid: without a dedicated "
                        "user it limits the supervisor's own user")
    if resolved.startswith("/snap/"):
        warnings.append(f"command {resolved} is a snap launcher: it fails under no_new_privs; "
                        "name the real binary")
    return Manifest(name=name, source=source, command=resolved, args=tuple(args), cwd=cwd,
                    env=tuple(sorted(manifest_env.items())), inherit_env=tuple(inherit_env),
                    client_env=frozenset(client_env), client_args=top.get("client_args", bool, False),
                    umask=umask, on_disconnect=on_disconnect, state_dir=state_dir, spec=spec,
                    allow_root=allow_root, pool=pool, terminal=terminal, warnings=tuple(warnings), area=area,
                    dynamic=dynamic, uid=creds.uid if creds else None,
                    runs_as_root=as_root and (allow_root or (creds is not None and creds.uid == 0)))


def _port_list(reader: _Reader, key: str) -> list[int]:
    value = reader.get(key, list, [])
    for i, port in enumerate(value):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            reader.fail(f"{key}[{i}]", f"{port!r} is not a port number (0-65535)")
    return value


class _SafeNoAliases(yaml.SafeLoader):
    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # PyYAML keeps the last of two equal keys: a second `sandbox:` would
        # silently replace the first. Refused.
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key_node.value!r}",
                                                            key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def load_all(paths: Iterable[str | os.PathLike[str]], *, only: str | None = None,
             warn: Callable[[str], None] | None = None, **kwargs: Any) -> dict[str, Manifest]:
    """Every *.yaml/*.yml of each directory, or the file itself; names unique.

    only: load just the manifest of that name (a private supervisor for one
    server, started from an MCP client's stripped environment): the other
    files are read for their name only, and one that cannot be is a warning."""
    files: list[str] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            files += sorted(str(f) for f in p.iterdir() if f.suffix in (".yaml", ".yml") and f.is_file())
        elif p.exists():
            files.append(str(p))
        else:
            raise ManifestError(f"{p}: no such file or directory")
    if only is not None:
        wanted = []
        for f in files:
            try:
                if name_of(f) == only:
                    wanted.append(f)
            except ManifestError as e:
                if warn is not None:
                    warn(f"skipped (looking for {only!r}): {e}")
        if not wanted:
            raise ManifestError(f"no manifest named {only!r} in {', '.join(map(str, paths))}")
        files = wanted
    manifests: dict[str, Manifest] = {}
    for f in files:
        m = load(f, **kwargs)
        if m.name in manifests:
            raise ManifestError(f"{f}: name: {m.name!r} is already defined by {manifests[m.name].source}")
        manifests[m.name] = m
    return manifests
