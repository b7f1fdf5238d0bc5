"""What a client may ask of a manifest: a spawn request and its fds -> a SpawnPlan, or Refused(code); pure, table-tested.

The checks run in the order a refusal's code depends on:

    admit()        unknown fields, the manifest's name, stopping
    stdio_pipes()  the client's stdio (3 fds) or pipes the supervisor makes (`stdio: "pipes"`, no fds)
    check_stdio()  3 fds, each usable as stdio; a terminal only if the manifest takes one
    charge()       child limits: the supervisor's, the peer's uid's
    plan()         args (relative ones against the client's cwd), env, narrowing
                   (paths, ports, rlimits), then the plan: argv, environment,
                   the pool (by Spec equality), a session gid or not (none to
                   make for a warm server's hand-over: its plan is made already)

Nothing here makes a system call but through the functions passed in:
plan's `resolve` (realpath: which paths get resolved, and where a
failure to resolve one is reported, depend on the checks around it, so
the caller cannot resolve them first without repeating those checks), and
check_stdio's fstat, F_GETFL and isatty (isatty only where the answer
matters).
"""
from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import landlock
from landlock.spec import parse_limit

from .. import protocol
from ..errors import Code, Refused
from .limits import Limits
from ..manifests.manifest import Manifest, unknown_name
from ..manifests.sandbox import PATH_CLASSES, PORT_KEYS
from ..manifests.serving import AUTO_POOL
from .peers import Peer

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

SPAWN_FIELDS = frozenset({"v", "op", "manifest", "args", "env", "narrow", "cwd", "stdio"})
MAX_CWD = 4096   # PATH_MAX
NARROWABLE = frozenset({*PATH_CLASSES, *PORT_KEYS, "rlimits"})
# A narrowed path may lie within a grant of its own class or of a stronger one.
_STRONGER = {"read_only": ("read_only", "read_write"), "read_only_noexec": PATH_CLASSES[:4],
             "read_write": ("read_write",), "read_write_noexec": ("read_write", "read_write_noexec"),
             "connect_unix": ("connect_unix",)}
Resolve = Callable[[str], str]
STDIO_NAMES = ("stdin", "stdout", "stderr")


@dataclass(frozen=True)
class Counts:
    """The children running now: in total, and for the asking peer's uid."""
    children: int
    of_peer: int


@dataclass(frozen=True)
class SpawnPlan:
    """Everything a launch needs but the prepared confinement of `spec`
    (zygote.process.Launch pairs the two, from here to the zygote)."""
    manifest: Manifest
    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    spec: landlock.Spec
    pool: tuple[str, int | None] | None   # (manifest, size; None: adaptive): its pool may serve the request
    session_gid: bool              # the child gets a session gid of its own (if the supervisor hands them out)


def admit(request: Mapping[str, Any], manifests: Mapping[str, Manifest], stopping: bool,
          withdrawn: Mapping[str, str] = {}) -> Manifest:
    """The manifest a spawn request names, before its fds are looked at."""
    unknown = sorted(set(request) - SPAWN_FIELDS)
    if unknown:  # a misspelt "narrow" must not go unnoticed: the child would get more
        raise Refused(Code.BAD_REQUEST, f"spawn: unknown field(s) {', '.join(unknown)[:200]}")
    m = named(request.get("manifest"), manifests, withdrawn)
    if stopping:
        raise Refused(Code.SHUTTING_DOWN, "the supervisor is shutting down")
    return m


def named(name: object, manifests: Mapping[str, Manifest], withdrawn: Mapping[str, str]) -> Manifest:
    """The manifest of that name; refused saying why when none is served:
    its file is broken or refused (withdrawn: name -> that one line), or
    the name is unknown (the names served, the nearest one)."""
    if isinstance(name, str) and name in manifests:
        return manifests[name]
    if isinstance(name, str) and name in withdrawn:
        raise Refused(Code.NO_SUCH_MANIFEST, f"manifest {name!r} is not served: {withdrawn[name]}")
    raise Refused(Code.NO_SUCH_MANIFEST, unknown_name(name, manifests))


def _status_flags(fd: int) -> int:
    """The fd's file status flags (F_GETFL): check_stdio's default."""
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def check_stdio(fds: Sequence[int], m: Manifest, fstat: Callable[[int], os.stat_result] = os.fstat,
                flags_of: Callable[[int], int] = _status_flags,
                isatty: Callable[[int], bool] = os.isatty) -> None:
    """The request's fds: 3, each one a child can use as stdio."""
    if len(fds) != 3:
        raise Refused(Code.BAD_FDS, f"'spawn' takes exactly 3 fds (stdin, stdout, stderr), got {len(fds)}")
    for name, fd in zip(STDIO_NAMES, fds):
        try:
            st = fstat(fd)
            flags = flags_of(fd)
        except OSError as e:
            raise Refused(Code.BAD_FDS, f"{name}: unusable fd: {e.strerror}") from None
        if flags & os.O_PATH or stat.S_ISDIR(st.st_mode):
            raise Refused(Code.BAD_FDS, f"{name}: a directory or O_PATH fd is no stdio")
        # The child leads a session without a terminal: it could make this one
        # its controlling terminal (TIOCSCTTY) and type into it (TIOCSTI).
        if stat.S_ISCHR(st.st_mode) and not m.terminal and isatty(fd):
            raise Refused(Code.BAD_FDS, f"{name}: a terminal, and manifest {m.name!r} does not take one "
                          "(terminal: true); pass pipes (`landlock-supervisor run` relays a "
                          "terminal through pipes)")


def charge(counts: Counts, peer: Peer, limits: Limits) -> None:
    """Refused unless one more child of peer's fits, a fresh one or a warm
    server handed over (charged to its uid then)."""
    room(counts.children, limits)
    if counts.of_peer >= limits.children_per_uid:
        raise Refused(Code.TOO_MANY_CHILDREN, f"uid {peer.uid} has {limits.children_per_uid} children, its limit")


def room(children: int, limits: Limits) -> None:
    """Refused unless one more child fits (a warm server handed over adds
    none: the caller counts it out, and asks again before a fresh fork)."""
    if children >= limits.children:
        raise Refused(Code.TOO_MANY_CHILDREN, f"the supervisor runs {children} children, its limit")


def plan(m: Manifest, request: Mapping[str, Any], limits: Limits, supervisor_env: Mapping[str, str],
         resolve: Resolve = os.path.realpath) -> SpawnPlan:
    """What an admitted request whose stdio was checked asks of m, nobody's
    limits counted (a warm server's: the manifest's own process, request {});
    raises Refused."""
    args = _args(m, request.get("args", []), request.get("cwd"), limits)
    client_env = _client_env(m, request.get("env"))
    try:
        spec = narrow(m.spec, request.get("narrow"), resolve)
    except landlock.SpecError as e:
        raise Refused(Code.BAD_SPEC, str(e)) from None
    return SpawnPlan(m, m.command, [m.command, *m.args, *args], m.environment(supervisor_env, client_env),
                     m.cwd, m.umask, spec,
                     pool=pool_of(m) if spec == m.spec else None,
                     # A manifest that names its group keeps it.
                     session_gid=m.spec.group is None)


def stdio_pipes(request: Mapping[str, Any]) -> bool:
    """Whether the client asks for pipes (sent with `spawned`) instead of
    passing its own stdio."""
    stdio = request.get("stdio")
    if stdio not in (None, "pipes"):
        raise Refused(Code.BAD_REQUEST, "stdio: expected \"pipes\" (or no field, and 3 fds)")
    return stdio == "pipes"


def pool_of(m: Manifest) -> tuple[str, int | None] | None:
    """The pool that may serve the manifest's own spec (or a narrowing
    equal to it): (name, size), size None when adaptive. `pool: auto` never
    engages under an NPROC limit: waiting children count against it."""
    if m.pool == AUTO_POOL:
        return None if any(r.name == "NPROC" for r in m.spec.rlimits) else (m.name, None)
    assert isinstance(m.pool, int)
    return (m.name, m.pool) if m.pool else None


def _args(m: Manifest, args: Any, cwd: Any, limits: Limits) -> list[str]:
    """The client's args, the relative ones resolved against its cwd."""
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise Refused(Code.BAD_REQUEST, "args: expected a list of strings")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd
                            or len(cwd) > MAX_CWD):
        raise Refused(Code.BAD_REQUEST, "cwd: expected an absolute path")
    if args and not m.client_args:
        raise Refused(Code.ARGS_REFUSED, f"manifest {m.name!r} does not let clients add arguments")
    if cwd is not None:
        args = [against(cwd, a) for a in args]
    if len(args) > limits.max_args or sum(map(len, args)) > limits.max_arg_bytes:
        raise Refused(Code.TOO_LARGE, "args: too many or too long")
    return args


def against(cwd: str, arg: str) -> str:
    """A client's argument `.`, `..`, `./...` or `../...` made absolute
    against the client's cwd (the manifest's cwd is not the client's: a
    project-scoped config passing `.` means its project); any other as it
    is. Only the leading `.` and `..` are taken away, on the string: the rest
    stays for the kernel to resolve as the server walks it (a `..` after a
    symlink is the link target's parent). No more than the client could
    have said with an absolute path."""
    if not protocol.relative_arg(arg):
        return arg
    base, parts = os.path.normpath(cwd), arg.split("/")
    while parts and parts[0] in (".", "..", ""):
        if parts.pop(0) == "..":
            base = os.path.dirname(base)
    return os.path.join(base, *parts) if parts else base


def _client_env(m: Manifest, client_env: Any) -> dict[str, str]:
    client_env = {} if client_env is None else client_env  # [] or false is a wrong type, not "none"
    if not isinstance(client_env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\0" not in v for k, v in client_env.items()):
        raise Refused(Code.BAD_REQUEST, "env: expected an object of strings")
    refused = sorted(set(client_env) - m.client_env)
    if refused:
        raise Refused(Code.ENV_REFUSED, f"env: manifest {m.name!r} does not take {', '.join(refused)} from "
                      f"clients (it takes: {', '.join(sorted(m.client_env)) or 'nothing'})")
    return client_env


def narrow(spec: landlock.Spec, request: Any, resolve: Resolve = os.path.realpath) -> landlock.Spec:
    """spec narrowed by a client: never wider; raises landlock.SpecError.

    Each path class given replaces the manifest's list for that class; every
    path must be a granted path of that class (or a stronger one) or lie
    beneath one. Ports must be granted ones; rlimits may only go down.
    """
    if request is None:
        return spec
    if not isinstance(request, dict):
        raise landlock.SpecError("narrow: expected an object")
    unknown = sorted(set(request) - NARROWABLE)
    if unknown:
        raise landlock.SpecError(f"narrow: unknown field(s) {', '.join(unknown)} "
                                 f"(may narrow: {', '.join(sorted(NARROWABLE))})")
    changes: dict[str, Any] = {}
    for cls in PATH_CLASSES:
        if cls in request:
            changes[cls] = _paths(spec, cls, request[cls], resolve)
    for key in PORT_KEYS:
        if key in request:
            ports = request[key]
            if (not isinstance(ports, list) or not all(type(p) is int for p in ports)
                    or not set(ports) <= set(getattr(spec, key))):
                raise landlock.SpecError(f"narrow.{key}: only ports the manifest grants ({list(getattr(spec, key))})")
            changes[key] = ports
    if "rlimits" in request:
        changes["rlimits"] = _rlimits(spec, request["rlimits"])
    return replace(spec, **changes)


def _paths(spec: landlock.Spec, cls: str, items: Any, resolve: Resolve) -> list[str]:
    if not isinstance(items, list) or not all(isinstance(p, str) and p.startswith("/") and "\0" not in p
                                              for p in items):
        raise landlock.SpecError(f"narrow.{cls}: expected a list of absolute paths")
    grants = [_resolved(resolve, cls, g) for c in _STRONGER[cls] for g in getattr(spec, c)]
    out = []
    for p in items:
        real = _resolved(resolve, cls, p)
        if not any(real == g or real.startswith(g.rstrip("/") + "/") for g in grants):
            raise landlock.SpecError(f"narrow.{cls}: {p} is not within what the manifest grants")
        out.append(real)
    return out


def _rlimits(spec: landlock.Spec, request: Any) -> dict[str, tuple[int, int]]:
    if not isinstance(request, dict):
        raise landlock.SpecError("narrow.rlimits: expected an object")
    current = {r.name: r for r in spec.rlimits}
    merged = {r.name: (r.soft, r.hard) for r in spec.rlimits}
    for r in landlock.spec.parse_rlimits({k: parse_limit(v) for k, v in request.items()}):
        old = current.get(r.name)
        if old is not None and (_above(r.soft, old.soft) or _above(r.hard, old.hard)):
            raise landlock.SpecError(f"narrow.rlimits.{r.name}: may only lower the manifest's limit")
        merged[r.name] = (r.soft, r.hard)
    return merged


def _resolved(resolve: Resolve, cls: str, path: str) -> str:
    """resolve(path), whose readlink may fail (EACCES on /proc/1/root, ELOOP...)."""
    try:
        return resolve(path)
    except (OSError, ValueError) as e:
        raise landlock.SpecError(f"narrow.{cls}: {path}: cannot be resolved: {getattr(e, 'strerror', None) or e}") \
            from None


def _above(new: int, old: int) -> bool:
    inf = 2**64 - 1
    as_num = lambda v: float("inf") if v in (-1, inf) else v  # noqa: E731
    return as_num(new) > as_num(old)
