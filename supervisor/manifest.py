"""Server manifests: one YAML file a server, validated into a Manifest and its Spec.

The policy lives here, in files the supervisor's owner wrote; a client's
request can only name a manifest and narrow what it grants (see policy.py).
Every error names the file, the key and what was expected.
"""
from __future__ import annotations

import grp
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import landlock
from landlock import privileges
from landlock.spec import parse_limit

from . import ids, profiles
from .secrets import within
from .manifest_file import ENV_NAME, MAX_MANIFEST_BYTES, Expander, ManifestError, Reader, port_list, read

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MAX_MANIFEST_BYTES", "Broken", "Manifest", "ManifestError", "load", "load_all", "load_each", "name_of",
           "unknown_name", "writable_grants", "writable_holding"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PATH_CLASSES = ("read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix")
PORT_KEYS = ("connect_tcp", "bind_tcp", "connect_udp", "bind_udp")
MAX_POOL = 8
MAX_WARM = 8
WARM_MAX_AGE = 600   # seconds a warm server waits, unused, before it is replaced
AUTO_POOL = "auto"   # the default: a pool kept while the manifest is in demand (zygote.pools.Demand)
_TOP_KEYS = {"name", "command", "args", "cwd", "env", "inherit_env", "client_env", "client_args",
             "user", "group", "groups", "allow_root", "umask", "sandbox", "on_disconnect", "state_dir", "pool",
             "terminal", "warm", "warm_max_age"}
_SANDBOX_KEYS = {*PATH_CLASSES, "profiles", "network", "rlimits", "require", "best_effort",
                 "scopes", "strict_paths", "log", "max_abi"}
_NETWORK_KEYS = {*PORT_KEYS, "unrestricted"}


@dataclass(frozen=True)
class Manifest:
    """A loaded manifest: what to run, as whom, in which confinement; immutable."""
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
    pool: int | str = AUTO_POOL      # children kept forked and confined, ready for a request; "auto": adaptive
    terminal: bool = False           # a client may pass a terminal as stdio (it can then inject input)
    warm: int = 0                    # servers started ahead, each handed whole to one client (supervisor/warm.py)
    warm_max_age: int = WARM_MAX_AGE  # seconds one waits unused before it is replaced
    warnings: tuple[str, ...] = field(default=())
    area: str | None = None          # <state root>/servers/<name>: the supervisor's, holding state and caches
    dynamic: bool = False            # `user: dynamic`
    uid: int | None = None           # what the child runs as; None: the supervisor's own uid
    runs_as_root: bool = False       # a root supervisor runs it as uid 0 (allow_root, or a user of uid 0)
    credentials: privileges.Credentials | None = None   # of spec.user and spec.group, looked up once at load
    quiet_denials: tuple[str, ...] = ()   # its profiles' harmless denials (profiles.Fragment.quiet)
    variables: frozenset[str] = frozenset()   # the ${VAR}s it expands (from the supervisor's environment)

    def environment(self, supervisor_env: Mapping[str, str],
                    client_env: Mapping[str, str] = {}) -> dict[str, str]:
        """Exactly env + the inherited names + what the client may supply."""
        env = {k: supervisor_env[k] for k in self.inherit_env if k in supervisor_env}
        env.update(self.env)
        env.update(client_env)
        return env


@dataclass(frozen=True)
class Broken:
    """A manifest file that does not load: not served, the others are."""
    name: str      # its `name`, or its file's stem when not even that can be read
    source: str
    error: str     # one line: file, key, what is wrong


DynamicUid = Callable[[str], int]
_EVERYONES = ("/dev/null", "/dev/zero", "/dev/full")   # writable to every server, holding no file


def writable_grants(m: Manifest) -> list[str]:
    """m's writable grants, resolved (the devices every server writes left out)."""
    return [os.path.realpath(p) for p in (*m.spec.read_write, *m.spec.read_write_noexec) if p not in _EVERYONES]


def writable_holding(path: str, held_by: Iterable[Manifest]) -> tuple[Manifest, str] | None:
    """The first manifest whose writable grant holds path (resolved), and
    that grant: its server could rewrite what lies there (its own manifest,
    another's) before the next load."""
    real = os.path.realpath(path)
    return next(((m, grant) for m in held_by for grant in writable_grants(m) if within(real, grant)), None)


def stem(path: str) -> str:
    """A file's name without its extension (pathlib's Path.stem: pathlib
    itself costs a private supervisor 2.5 ms of imports)."""
    return os.path.splitext(os.path.basename(path))[0]


def name_of(path: str, parsed: str | None = None) -> str:
    """A manifest's name, read without expanding anything (no ${VAR} needs
    to be set): what a private supervisor for one server looks for."""
    data = read(path, parsed)
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else stem(path)


def load(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
         state_root: str | None = None, as_root: bool | None = None,
         dynamic_uid: DynamicUid | None = None, parsed: str | None = None) -> Manifest:
    """dynamic_uid(name): the uid of a `user: dynamic` manifest under a root
    supervisor (ids.Table); without it such a manifest runs as the supervisor.
    parsed: the supervisor's directory of parsed manifests (manifest_file.read)."""
    return _Loader(str(path), dict(os.environ if env is None else env), state_root,
                   os.geteuid() == 0 if as_root is None else as_root, dynamic_uid, parsed).load()


class _Loader:
    """One manifest file, read one key group after the other: the order
    decides which error a file with several is reported with."""

    def __init__(self, source: str, env: dict[str, str], state_root: str | None, as_root: bool,
                 dynamic_uid: DynamicUid | None, parsed: str | None) -> None:
        self.source, self.env, self.state_root, self.as_root = source, env, state_root, as_root
        self.dynamic_uid = dynamic_uid
        self.data = read(source, parsed)
        self.top = Reader(source, self.data, "", _TOP_KEYS)
        self.expand = Expander(self.top, self.env)   # sees STATE_DIR once _state_dir has set it

    def load(self) -> Manifest:
        top = self.top
        name = self._name()
        variables = self._all_variables_set()
        state_dir, area = self._state_dir(name)
        inherit_env = top.strings("inherit_env")
        manifest_env = {k: self.expand(f"env.{k}", v) for k, v in top.mapping("env").items()}
        command = self._command(inherit_env, manifest_env)
        args = [self.expand(f"args[{i}]", a) for i, a in enumerate(top.strings("args"))]
        cwd, client_env, umask = self._cwd(state_dir), self._client_env(), self._umask()
        pool, terminal, on_disconnect = self._serving()
        user, group, allow_root, dynamic = self._identity(name)
        warm = self._warm(terminal, group)
        warm_max_age = self.top.get("warm_max_age", int, WARM_MAX_AGE)
        if not 1 <= warm_max_age <= 86400:
            self.top.fail("warm_max_age", f"expected 1 to 86400 seconds, got {warm_max_age}")
        groups = self._groups(user, allow_root)
        fragment, spec, creds = self._sandbox(command, manifest_env, inherit_env, state_dir, area, user, group,
                                              groups)
        if groups and creds is not None and creds.uid == 0:
            self.top.fail("groups", "needs `user:` other than root: a server of uid 0 joins no group")
        defaults = self._dynamic_defaults(name, state_dir, inherit_env) if dynamic and user is not None else {}
        manifest_env = {**defaults, **fragment.env, **manifest_env}  # the manifest's own values win
        return Manifest(name=name, source=self.source, command=command, args=tuple(args), cwd=cwd,
                        env=tuple(sorted(manifest_env.items())), inherit_env=tuple(inherit_env),
                        client_env=frozenset(client_env), client_args=top.get("client_args", bool, False),
                        umask=umask, on_disconnect=on_disconnect, state_dir=state_dir, spec=spec,
                        allow_root=allow_root, pool=pool, terminal=terminal, warm=warm,
                        warm_max_age=warm_max_age,
                        warnings=self._warnings(fragment, spec, user, command, self.state_root), area=area,
                        dynamic=dynamic,
                        uid=creds.uid if creds else None, credentials=creds, quiet_denials=tuple(fragment.quiet),
                        variables=variables - {"STATE_DIR"},
                        runs_as_root=self.as_root and (allow_root or (creds is not None and creds.uid == 0)))

    def _name(self) -> str:
        name = self.top.get("name", str, stem(self.source))
        if not _NAME.match(name):
            self.top.fail("name", f"{name!r} is not a valid name (letters, digits, '.', '_', '-'; at most 64)")
        return name

    def _all_variables_set(self) -> frozenset[str]:
        """The ${VAR}s the manifest expands; every one the environment lacks
        in one error, not one per attempt."""
        data = self.data if isinstance(self.data, dict) else {}
        sandbox, env = (_mapping(data.get(key)) for key in ("sandbox", "env"))
        texts = [("command", data.get("command")), ("cwd", data.get("cwd")), ("state_dir", data.get("state_dir")),
                 *_items("args", data.get("args")), *((f"env.{k}", v) for k, v in env.items()),
                 *(item for cls in PATH_CLASSES for item in _items(f"sandbox.{cls}", sandbox.get(cls)))]
        return self.expand.all_set(texts, {"STATE_DIR"} if data.get("state_dir") else set())

    def _state_dir(self, name: str) -> tuple[str | None, str | None]:
        """(state dir, area); STATE_DIR set for what is expanded after."""
        top, state_dir = self.top, None
        area = os.path.join(self.state_root, "servers", name) if self.state_root else None
        want = top.get("state_dir", (bool, str), False)
        if want:
            if want is True and area is None:
                top.fail("state_dir", "no state root is configured for this supervisor")
            state_dir = os.path.join(area, "state") if want is True and area else want
            self.env["STATE_DIR"] = state_dir
        if isinstance(want, str):
            state_dir = self.expand("state_dir", want)
            self.env["STATE_DIR"] = state_dir
            if not os.path.isabs(state_dir):
                top.fail("state_dir", f"{state_dir!r} is not an absolute path")
        return state_dir, area

    def _command(self, inherit_env: list[str], manifest_env: dict[str, str]) -> str:
        """The command, expanded and found on PATH: absolute."""
        path_var = (manifest_env.get("PATH") or (self.env.get("PATH") if "PATH" in inherit_env else None)
                    or os.defpath)
        command = self.top.get("command", str, None)
        if not command:
            self.top.fail("command", "missing")
        command = self.expand("command", command)
        if "/" in command:
            resolved: str | None = command
        else:
            import shutil   # here: ~1.7 ms of a private supervisor's start, for a command on PATH only
            resolved = shutil.which(command, path=path_var)
        if not resolved or not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
            self.top.fail("command", f"{command!r} is not an executable file"
                          + ("" if "/" in command else f" on PATH {path_var}"))
        return os.path.abspath(resolved)

    def _cwd(self, state_dir: str | None) -> str:
        cwd = self.expand("cwd", self.top.get("cwd", str, state_dir or "/"))
        if not os.path.isabs(cwd):
            self.top.fail("cwd", f"{cwd!r} is not an absolute path")
        return cwd

    def _client_env(self) -> list[str]:
        client_env = self.top.strings("client_env")
        for i, var in enumerate(client_env):
            if not ENV_NAME.match(var):
                self.top.fail(f"client_env[{i}]", f"{var!r} is not a valid variable name")
        return client_env

    def _umask(self) -> int:
        text = self.top.get("umask", (str, int), "077")
        if isinstance(text, int) and text != 0:
            # YAML reads 077 as the number 63 (and 22 as 22): only a string says what was meant.
            self.top.fail("umask", f"expected a quoted octal string such as \"077\", got the number {text} "
                          "(YAML reads 022 as 18: quote it)")
        try:
            umask = int(str(text), 8)
        except ValueError:
            self.top.fail("umask", "expected an octal string such as \"077\"")
        if not 0 <= umask <= 0o777:
            self.top.fail("umask", "expected an octal value from 000 to 777")
        return umask

    def _serving(self) -> tuple[int | str, bool, str]:
        """pool, terminal, on_disconnect."""
        pool = self.top.get("pool", (int, str), AUTO_POOL)
        terminal = self.top.get("terminal", bool, False)
        if pool != AUTO_POOL and not (isinstance(pool, int) and 0 <= pool <= MAX_POOL):
            self.top.fail("pool", f"expected {AUTO_POOL} or 0 to {MAX_POOL} children, got {pool!r}")
        on_disconnect = self.top.get("on_disconnect", str, "kill")
        if on_disconnect not in ("kill", "keep"):
            self.top.fail("on_disconnect", f"expected kill or keep, got {on_disconnect!r}")
        return pool, terminal, on_disconnect

    def _warm(self, terminal: bool, group: str | int | None) -> int:
        """`warm: N`: only where no other process shares a warm server's uid
        and gid (a root supervisor's session gid), and never on a terminal
        (it would hold the client's terminal before it is the client's)."""
        warm = self.top.get("warm", int, 0)
        if not 0 <= warm <= MAX_WARM:
            self.top.fail("warm", f"expected 0 to {MAX_WARM} servers, got {warm!r}")
        if not warm:
            return warm
        if terminal:
            self.top.fail("warm", "contradicts `terminal: true`: a warm server's stdio are pipes, made before "
                          "its client is known")
        if group is not None:
            self.top.fail("warm", "contradicts `group:`: other processes of that gid could change a warm "
                          "server's limits while it waits for its client")
        if not self.as_root:
            self.top.fail("warm", "needs a root supervisor: under a user's own supervisor every process of "
                          "that user could change a warm server while it waits for its client")
        return warm

    def _identity(self, name: str) -> tuple[str | int | None, str | int | None, bool, bool]:
        """user, group, allow_root, dynamic."""
        user = self.top.get("user", (str, int), None)
        group = self.top.get("group", (str, int), None)
        allow_root = self.top.get("allow_root", bool, False)
        dynamic = user == "dynamic"
        if dynamic:
            if allow_root:
                self.top.fail("allow_root", "contradicts `user: dynamic`")
            # No group: its gid is the uid's number, and under a root
            # supervisor each session gets a gid of its own instead, as for
            # any manifest that names no `group:` (its sessions must not
            # prlimit each other).
            user = self._dynamic_uid(name)
        if self.as_root and user is None and not allow_root and not dynamic:
            self.top.fail("user", "required when the supervisor runs as root "
                          "(user: dynamic, a user name, or allow_root: true with every capability dropped)")
        return user, group, allow_root, dynamic

    def _groups(self, user: str | int | None, allow_root: bool) -> list[str]:
        """`groups:`, supplementary groups the server joins to share files
        (docs/manifests.md, "Sharing a project"): names the administrator
        made, joined by a root supervisor's server that runs as a user."""
        groups = [self.expand(f"groups[{i}]", g) for i, g in enumerate(self.top.strings("groups"))]
        if not groups:
            return groups
        if not self.as_root:
            self.top.fail("groups", "needs a root supervisor: a user's own supervisor runs its servers as "
                          "itself, with its own groups")
        if allow_root or user is None:
            self.top.fail("groups", "needs `user:` (dynamic or a user name): a server that stays root "
                          "joins no group")
        for i, name in enumerate(groups):
            try:
                gid = grp.getgrnam(name).gr_gid
            except KeyError:
                self.top.fail(f"groups[{i}]", f"no such group {name!r} (a group name, made by the administrator)")
            if gid == 0:
                self.top.fail(f"groups[{i}]", f"{name!r} is gid 0: root's group owns system files")
        return groups

    def _dynamic_uid(self, name: str) -> int | None:
        """A `user: dynamic` manifest's uid; None under a user's own supervisor,
        which cannot switch uids: it runs the server as itself."""
        dynamic_uid, state_root = self.dynamic_uid, self.state_root
        if self.as_root and dynamic_uid is None and state_root:
            dynamic_uid = lambda n: ids.Table(state_root).peek(n)[0]  # noqa: E731  (what it has or would get)
        try:
            user = dynamic_uid(name) if self.as_root and dynamic_uid is not None else None
        except (ids.IdError, OSError) as e:
            self.top.fail("user", f"dynamic: {e}")
        if user is None and self.as_root:
            self.top.fail("user", "dynamic: this supervisor has no state root for its table of dynamic users")
        return user

    def _sandbox(self, command: str, manifest_env: dict[str, str], inherit_env: list[str], state_dir: str | None,
                 area: str | None, user: str | int | None, group: str | int | None, groups: list[str]
                 ) -> tuple[profiles.Fragment, landlock.Spec, privileges.Credentials | None]:
        """The profiles' fragment, the Spec, its credentials."""
        sandbox = Reader(self.source, self.data.get("sandbox") if isinstance(self.data, dict) else None,
                          "sandbox.", _SANDBOX_KEYS)
        fragment = profiles.combine(sandbox.strings("profiles"), profiles.Context(
            env={**self.env, **manifest_env, **{k: self.env[k] for k in inherit_env if k in self.env}},
            state_dir=state_dir, command=command, area=area,
            given=frozenset({*manifest_env, *(k for k in inherit_env if k in self.env)})),
            lambda msg: sandbox.fail("profiles", msg))
        spec, creds = self._spec(sandbox, self._paths(sandbox, fragment, state_dir), user, group, groups)
        return fragment, spec, creds

    def _paths(self, sandbox: Reader, fragment: profiles.Fragment, state_dir: str | None) -> dict[str, list[str]]:
        paths = {cls: fragment.paths.get(cls, []) + [self.expand(f"sandbox.{cls}[{i}]", p)
                                                     for i, p in enumerate(sandbox.strings(cls))]
                 for cls in PATH_CLASSES}
        if state_dir:
            paths["read_write_noexec"].append(state_dir)
        for cls, items in paths.items():
            for p in items:
                if not os.path.isabs(p):
                    sandbox.fail(cls, f"{p!r} is not an absolute path")
        return paths

    def _spec(self, sandbox: Reader, paths: dict[str, list[str]], user: str | int | None,
              group: str | int | None, groups: list[str]) -> tuple[landlock.Spec, privileges.Credentials | None]:
        """The Spec, and the credentials it runs with (looked up here, once)."""
        network = Reader(self.source, sandbox.data.get("network"), "sandbox.network.", _NETWORK_KEYS)
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

    def _dynamic_defaults(self, name: str, state_dir: str | None, inherit_env: list[str]) -> dict[str, str]:
        """No passwd entry outside the supervisor's mount namespace: programs
        that ask for HOME or the user's name get them here."""
        return {k: v for k, v in (("HOME", state_dir or "/"), ("USER", ids.user_name(name)),
                                  ("LOGNAME", ids.user_name(name))) if k not in inherit_env}

    @staticmethod
    def _warnings(fragment: profiles.Fragment, spec: landlock.Spec, user: str | int | None,
                  command: str, state_root: str | None) -> tuple[str, ...]:
        warnings = list(fragment.warnings)
        if state_root:
            root = os.path.realpath(state_root)
            for cls in ("read_write", "read_write_noexec"):
                for path in getattr(spec, cls):
                    real = os.path.realpath(path)
                    if root == real or root.startswith(real.rstrip("/") + "/"):
                        warnings.append(f"{cls} {path} holds the supervisor's state root {state_root}: the "
                                        "server can rewrite every server's state and the parsed manifests")
        if any(r.name == "NPROC" for r in spec.rlimits) and user is None:
            warnings.append("rlimits.NPROC counts every process of the real uid: without a dedicated "
                            "user it limits the supervisor's own user")
        if command.startswith("/snap/"):
            warnings.append(f"command {command} is a snap launcher: it fails under no_new_privs; "
                            "name the real binary")
        return tuple(warnings)


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _items(key: str, value: Any) -> list[tuple[str, Any]]:
    return [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else []


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


def load_all(paths: Iterable[str | os.PathLike[str]], **kwargs: Any) -> dict[str, Manifest]:
    """load_each's manifests when every one loads; else its first error."""
    loaded, broken = load_each(paths, **kwargs)
    if broken:
        raise ManifestError(broken[0].error)
    return loaded


def load_each(paths: Iterable[str | os.PathLike[str]], *, only: str | None = None,
              warn: Callable[[str], None] | None = None, **kwargs: Any) -> tuple[dict[str, Manifest], list[Broken]]:
    """Every *.yaml/*.yml of each directory, or the file itself: those that
    load, and those that do not (one bad file never stops the others). A
    name two files give is served by neither: which policy was meant?

    only: load just the manifest of that name (a private supervisor for one
    server, started from an MCP client's stripped environment): the other
    files are read for their name only, and one that cannot be is a warning;
    no such name raises ManifestError."""
    names = [os.fspath(p) for p in paths]
    files, broken = _files(names)
    if only is not None:
        if broken:   # (a private supervisor: its one manifest is named by a path that is not there)
            raise ManifestError(broken[0].error)
        files = _named(files, names, only, warn, kwargs.get("parsed"))
    loaded: dict[str, Manifest] = {}
    for f in files:
        try:
            m = load(f, **kwargs)
        except ManifestError as e:
            broken.append(Broken(_name_or_stem(f, kwargs.get("parsed")), f, str(e)))
            continue
        if m.name in loaded:
            broken.append(Broken(m.name, f, f"{f}: name: {m.name!r} is also the name of "
                                 f"{loaded[m.name].source}: neither is served"))
        else:
            loaded[m.name] = m
    for b in list(broken):
        if b.name in loaded:
            m = loaded.pop(b.name)
            broken.append(Broken(m.name, m.source, f"{m.source}: name: {m.name!r} is also the name of "
                                 f"{b.source}: neither is served"))
    return loaded, broken


def _files(paths: list[str]) -> tuple[list[str], list[Broken]]:
    """The manifest files the paths name; a path that cannot be read, broken."""
    files: list[str] = []
    broken: list[Broken] = []
    for path in paths:
        try:
            if os.path.isdir(path):
                files += sorted(os.path.join(path, f) for f in os.listdir(path) if os.path.splitext(f)[1]
                                in (".yaml", ".yml") and os.path.isfile(os.path.join(path, f)))
            elif os.path.exists(path):
                files.append(path)
            else:
                broken.append(Broken(stem(path), path, f"{path}: no such file or directory"))
        except OSError as e:
            broken.append(Broken(stem(path), path, f"{path}: {e.strerror}"))
    return files, broken


def _name_or_stem(path: str, parsed: str | None) -> str:
    try:
        return name_of(path, parsed)
    except ManifestError:
        return stem(path)


def _named(files: list[str], paths: list[str], only: str, warn: Callable[[str], None] | None,
           parsed: str | None) -> list[str]:
    """The files of that name. One whose name cannot be read is that name's
    when its file is (it then fails to load with its own error), else a warning."""
    wanted, names = [], set()
    for f in files:
        try:
            name = name_of(f, parsed)
        except ManifestError as e:
            if stem(f) == only:
                wanted.append(f)
            elif warn is not None:
                warn(f"skipped (looking for {only!r}): {e}")
            continue
        names.add(name)
        if name == only:
            wanted.append(f)
    if not wanted:
        raise ManifestError(unknown_name(only, names, f" in {', '.join(paths)}"))
    return wanted


def unknown_name(name: object, names: Iterable[str], where: str = "") -> str:
    """No manifest of that name: the names there are, and the nearest one."""
    names = sorted(names)
    if not names:
        return f"no manifest named {name!r}{where}; there are none"
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    import difflib
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.6) if isinstance(name, str) else []
    return (f"no manifest named {name!r}{where}" + (f" (did you mean {near[0]!r}?)" if near else "")
            + f"; there are: {listed}")
