"""Server manifests: one YAML file a server, validated into a Manifest and its Spec.

The policy lives here, in files the supervisor's owner wrote; a client's
request can only name a manifest and narrow what it grants (see policy.py).
Every error names the file, the key and what was expected.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import landlock
from landlock import privileges

from . import (identity as manifest_identity, process as manifest_process, sandbox as manifest_sandbox,
               serving as manifest_serving, profiles)
from .file import MAX_MANIFEST_BYTES, Expander, ManifestError, Reader, read
from .identity import DynamicUid
from .sandbox import PATH_CLASSES
from .serving import AUTO_POOL, WARM_MAX_AGE
from .secrets import within

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MAX_MANIFEST_BYTES", "Broken", "Manifest", "ManifestError", "load", "load_all", "load_each", "name_of",
           "unknown_name", "writable_grants", "writable_holding"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TOP_KEYS = {"name", "command", "args", "cwd", "env", "inherit_env", "client_env", "client_args",
             "user", "group", "groups", "allow_root", "umask", "sandbox", "on_disconnect", "state_dir", "pool",
             "terminal", "warm", "warm_max_age"}


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
    warm: int = 0                    # servers started ahead, each handed whole to one client (supervisor/daemon/warm.py)
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
    parsed: the supervisor's directory of parsed manifests (manifests/file.read)."""
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
        command = manifest_process.command(top, self.expand, self.env, inherit_env, manifest_env)
        args = [self.expand(f"args[{i}]", a) for i, a in enumerate(top.strings("args"))]
        cwd, client_env = manifest_process.cwd(top, self.expand, state_dir), manifest_process.client_env(top)
        umask = manifest_process.umask(top)
        pool, terminal, on_disconnect = manifest_serving.serving(top)
        user, group, allow_root, dynamic = manifest_identity.identity(top, name, self.as_root, self.dynamic_uid,
                                                                      self.state_root)
        warm, warm_max_age = manifest_serving.warm(top, terminal, group, self.as_root)
        groups = manifest_identity.groups(top, self.expand, user, allow_root, self.as_root)
        fragment, spec, creds = self._sandbox(command, manifest_env, inherit_env, state_dir, area, user, group,
                                              groups)
        if groups and creds is not None and creds.uid == 0:
            top.fail("groups", "needs `user:` other than root: a server of uid 0 joins no group")
        defaults = {}
        if dynamic and user is not None:
            defaults = manifest_identity.dynamic_defaults(name, state_dir, inherit_env)
        manifest_env = {**defaults, **fragment.env, **manifest_env}  # the manifest's own values win
        return Manifest(name=name, source=self.source, command=command, args=tuple(args), cwd=cwd,
                        env=tuple(sorted(manifest_env.items())), inherit_env=tuple(inherit_env),
                        client_env=frozenset(client_env), client_args=top.get("client_args", bool, False),
                        umask=umask, on_disconnect=on_disconnect, state_dir=state_dir, spec=spec,
                        allow_root=allow_root, pool=pool, terminal=terminal, warm=warm,
                        warm_max_age=warm_max_age, area=area, dynamic=dynamic,
                        warnings=manifest_sandbox.warnings(fragment, spec, user, command, self.state_root),
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

    def _sandbox(self, command: str, manifest_env: dict[str, str], inherit_env: list[str], state_dir: str | None,
                 area: str | None, user: str | int | None, group: str | int | None, groups: list[str]
                 ) -> tuple[profiles.Fragment, landlock.Spec, privileges.Credentials | None]:
        """The profiles' fragment, the Spec, its credentials."""
        sandbox = Reader(self.source, self.data.get("sandbox") if isinstance(self.data, dict) else None,
                         "sandbox.", manifest_sandbox.KEYS)
        inherited = {k: self.env[k] for k in inherit_env if k in self.env}
        context = profiles.Context(env={**self.env, **manifest_env, **inherited}, state_dir=state_dir,
                                   command=command, area=area, given=frozenset({*manifest_env, *inherited}))
        return manifest_sandbox.sandbox(sandbox, context, self.expand, user, group, groups)


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _items(key: str, value: Any) -> list[tuple[str, Any]]:
    return [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else []


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
