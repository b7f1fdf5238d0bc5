"""Spawn policy as tables: (manifest, request, peer, counts, limits) -> plan or refusal code; (fds, manifest) -> the
stdio check's refusal or none.

No process, no supervisor, no filesystem: paths are resolved through a
table of links (RESOLVE) instead of realpath, and the stdio check's
fstat, F_GETFL and isatty answered from a table of kinds of file (KINDS).
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import replace
from typing import Any

import pytest

import landlock
from supervisor.daemon import policy
from supervisor.errors import Code, Refused
from supervisor.daemon.limits import Limits
from supervisor.manifests.manifest import Manifest
from supervisor.daemon.peers import Peer

SPEC = landlock.Spec(read_only=["/usr"], read_only_noexec=["/etc"], read_write=["/srv/data"],
                     read_write_noexec=["/var/cache/app"], connect_unix=["/run/app.sock"],
                     connect_tcp=[80, 443], bind_udp=[5353], rlimits={"NOFILE": (256, 1024), "CPU": 60})
MANIFEST = Manifest(name="app", source="/etc/m/app.yaml", command="/usr/bin/app", args=("--stdio",), cwd="/srv/data",
                    env=(("MODE", "prod"),), inherit_env=("PATH", "MODE"), client_env=frozenset({"TOKEN"}),
                    client_args=True, umask=0o77, on_disconnect="kill", state_dir=None, spec=SPEC, pool=2)
PEER = Peer(pid=4242, uid=1000, gid=1000)
LIMITS = Limits(children=10, children_per_uid=3, max_args=4, max_arg_bytes=64)
SUPERVISOR_ENV = {"PATH": "/usr/bin:/bin", "MODE": "dev", "HOME": "/root", "SECRET": "no"}
# Links as realpath would follow them; a path in RAISES cannot be resolved.
LINKS = {"/srv/data/link-out": "/etc/shadow", "/home/u/proj": "/srv/data/proj"}
RAISES = {"/srv/data/loop": OSError(40, "Too many levels of symbolic links")}


def resolve(path: str) -> str:
    if path in RAISES:
        raise RAISES[path]
    return LINKS.get(path, path)


def req(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "op": "spawn", "manifest": "app", **fields}


NO_POOL = replace(MANIFEST, pool=0)
AUTO_POOL = replace(MANIFEST, pool="auto")
AUTO_NPROC = replace(MANIFEST, pool="auto", spec=replace(SPEC, rlimits={"NPROC": 50}))
NO_CLIENT_ARGS = replace(MANIFEST, client_args=False)
OWN_GROUP = replace(MANIFEST, spec=replace(SPEC, group="app"))

# (id, manifest, request, counts (total, of the peer's uid), stopping, expected: a Code, or a dict of
# plan fields to compare)
TABLE: list[tuple[str, Manifest, dict[str, Any], tuple[int, int], bool, Any]] = [
    # admit: unknown fields, the name, stopping, in that order
    ("plain", MANIFEST, req(), (0, 0), False,
     {"argv": ["/usr/bin/app", "--stdio"], "pool": ("app", 2), "session_gid": True, "cwd": "/srv/data"}),
    ("unknown field", MANIFEST, req(narow={}), (0, 0), False, Code.BAD_REQUEST),
    ("unknown field first", MANIFEST, req(narow={}, manifest="nope"), (0, 0), True, Code.BAD_REQUEST),
    ("no such manifest", MANIFEST, req(manifest="nope"), (0, 0), False, Code.NO_SUCH_MANIFEST),
    ("manifest not a string", MANIFEST, req(manifest=["app"]), (0, 0), False, Code.NO_SUCH_MANIFEST),
    ("manifest missing", MANIFEST, {"v": 1, "op": "spawn"}, (0, 0), False, Code.NO_SUCH_MANIFEST),
    ("stopping", MANIFEST, req(), (0, 0), True, Code.SHUTTING_DOWN),
    # limits
    ("total children", MANIFEST, req(), (10, 0), False, Code.TOO_MANY_CHILDREN),
    ("children of the uid", MANIFEST, req(), (5, 3), False, Code.TOO_MANY_CHILDREN),
    ("limits before args", MANIFEST, req(args=7), (10, 0), False, Code.TOO_MANY_CHILDREN),
    ("under the limits", MANIFEST, req(), (9, 2), False, {"pool": ("app", 2)}),
    # args
    ("client args", MANIFEST, req(args=["-v", "x"]), (0, 0), False, {"argv": ["/usr/bin/app", "--stdio", "-v", "x"]}),
    ("args not a list", MANIFEST, req(args="-v"), (0, 0), False, Code.BAD_REQUEST),
    ("args not strings", MANIFEST, req(args=[1]), (0, 0), False, Code.BAD_REQUEST),
    ("args with NUL", MANIFEST, req(args=["a\0b"]), (0, 0), False, Code.BAD_REQUEST),
    ("args refused", NO_CLIENT_ARGS, req(args=["-v"]), (0, 0), False, Code.ARGS_REFUSED),
    ("no args, not refused", NO_CLIENT_ARGS, req(args=[]), (0, 0), False, {"argv": ["/usr/bin/app", "--stdio"]}),
    ("too many args", MANIFEST, req(args=["a"] * 5), (0, 0), False, Code.TOO_LARGE),
    ("args too long", MANIFEST, req(args=["a" * 65]), (0, 0), False, Code.TOO_LARGE),
    ("wrong args before env", MANIFEST, req(args=[1], env=[]), (0, 0), False, Code.BAD_REQUEST),
    # cwd: the client's, for its relative args (the manifest's cwd is the server's)
    ("relative args against cwd", MANIFEST, req(args=[".", "./a/", "../b", ".."], cwd="/h/u/p"), (0, 0), False,
     {"argv": ["/usr/bin/app", "--stdio", "/h/u/p", "/h/u/p/a/", "/h/u/b", "/h/u"], "cwd": "/srv/data"}),
    ("only the leading dots", MANIFEST, req(args=["./l/../x", ".//y", "../../.."], cwd="/h/u/p/"), (0, 0), False,
     {"argv": ["/usr/bin/app", "--stdio", "/h/u/p/l/../x", "/h/u/p/y", "/"]}),
    ("not relative: as given", MANIFEST, req(args=["...", ".x", "-o=./x", "/abs"], cwd="/h"), (0, 0), False,
     {"argv": ["/usr/bin/app", "--stdio", "...", ".x", "-o=./x", "/abs"]}),
    ("not relative: dots inside", MANIFEST, req(args=["a/./b", "x"], cwd="/h"), (0, 0), False,
     {"argv": ["/usr/bin/app", "--stdio", "a/./b", "x"]}),
    ("relative args without cwd", MANIFEST, req(args=["."]), (0, 0), False, {"argv": ["/usr/bin/app", "--stdio", "."]}),
    ("cwd alone", NO_CLIENT_ARGS, req(cwd="/h"), (0, 0), False, {"argv": ["/usr/bin/app", "--stdio"]}),
    ("cwd with refused args", NO_CLIENT_ARGS, req(args=["."], cwd="/h"), (0, 0), False, Code.ARGS_REFUSED),
    ("cwd relative", MANIFEST, req(args=["."], cwd="h"), (0, 0), False, Code.BAD_REQUEST),
    ("cwd not a string", MANIFEST, req(args=["."], cwd=["/h"]), (0, 0), False, Code.BAD_REQUEST),
    ("cwd with NUL", MANIFEST, req(cwd="/h\0"), (0, 0), False, Code.BAD_REQUEST),
    ("cwd too long", MANIFEST, req(cwd="/" * 4097), (0, 0), False, Code.BAD_REQUEST),
    ("resolved args too long", MANIFEST, req(args=["."], cwd="/" + "d" * 64), (0, 0), False, Code.TOO_LARGE),
    # env
    ("env", MANIFEST, req(env={"TOKEN": "t"}), (0, 0), False,
     {"env": {"PATH": "/usr/bin:/bin", "MODE": "prod", "TOKEN": "t"}}),
    ("env null", MANIFEST, req(env=None), (0, 0), False, {"env": {"PATH": "/usr/bin:/bin", "MODE": "prod"}}),
    ("env a list", MANIFEST, req(env=[]), (0, 0), False, Code.BAD_REQUEST),
    ("env false", MANIFEST, req(env=False), (0, 0), False, Code.BAD_REQUEST),
    ("env not strings", MANIFEST, req(env={"TOKEN": 1}), (0, 0), False, Code.BAD_REQUEST),
    ("env with NUL", MANIFEST, req(env={"TOKEN": "a\0"}), (0, 0), False, Code.BAD_REQUEST),
    ("env refused", MANIFEST, req(env={"SECRET": "x"}), (0, 0), False, Code.ENV_REFUSED),
    ("env before narrow", MANIFEST, req(env={"SECRET": "x"}, narrow=1), (0, 0), False, Code.ENV_REFUSED),
    # narrowing: shape
    ("narrow not an object", MANIFEST, req(narrow=[]), (0, 0), False, Code.BAD_SPEC),
    ("narrow unknown field", MANIFEST, req(narrow={"read_only": [], "user": "root"}), (0, 0), False, Code.BAD_SPEC),
    ("narrow relative path", MANIFEST, req(narrow={"read_only": ["usr"]}), (0, 0), False, Code.BAD_SPEC),
    ("narrow paths not a list", MANIFEST, req(narrow={"read_only": "/usr"}), (0, 0), False, Code.BAD_SPEC),
    # narrowing: paths
    ("narrow beneath a grant", MANIFEST, req(narrow={"read_only": ["/usr/lib"]}), (0, 0), False,
     {"read_only": ("/usr/lib",), "pool": None}),
    ("narrow to nothing", MANIFEST, req(narrow={"read_write": []}), (0, 0), False, {"read_write": (), "pool": None}),
    ("narrow outside", MANIFEST, req(narrow={"read_only": ["/home"]}), (0, 0), False, Code.BAD_SPEC),
    ("narrow a prefix is no parent", MANIFEST, req(narrow={"read_only": ["/usrx"]}), (0, 0), False, Code.BAD_SPEC),
    ("read_only within read_write", MANIFEST, req(narrow={"read_only": ["/srv/data/x"]}), (0, 0), False,
     {"read_only": ("/srv/data/x",)}),
    ("read_only_noexec within any", MANIFEST, req(narrow={"read_only_noexec": ["/var/cache/app/a", "/usr/x"]}),
     (0, 0), False, {"read_only_noexec": ("/var/cache/app/a", "/usr/x")}),
    ("read_write within read_only", MANIFEST, req(narrow={"read_write": ["/usr/lib"]}), (0, 0), False, Code.BAD_SPEC),
    ("read_write_noexec within rw", MANIFEST, req(narrow={"read_write_noexec": ["/srv/data/tmp"]}), (0, 0), False,
     {"read_write_noexec": ("/srv/data/tmp",)}),
    ("connect_unix beneath", MANIFEST, req(narrow={"connect_unix": ["/run/other.sock"]}), (0, 0), False, Code.BAD_SPEC),
    ("a link out is refused", MANIFEST, req(narrow={"read_write": ["/srv/data/link-out"]}), (0, 0), False,
     Code.BAD_SPEC),
    ("a link in is resolved", MANIFEST, req(narrow={"read_write": ["/home/u/proj"]}), (0, 0), False,
     {"read_write": ("/srv/data/proj",)}),
    ("unresolvable", MANIFEST, req(narrow={"read_write": ["/srv/data/loop"]}), (0, 0), False, Code.BAD_SPEC),
    # narrowing: ports and rlimits
    ("ports subset", MANIFEST, req(narrow={"connect_tcp": [443]}), (0, 0), False, {"connect_tcp": (443,)}),
    ("ports not granted", MANIFEST, req(narrow={"connect_tcp": [22]}), (0, 0), False, Code.BAD_SPEC),
    ("ports of another kind", MANIFEST, req(narrow={"bind_tcp": [5353]}), (0, 0), False, Code.BAD_SPEC),
    ("a port true", MANIFEST, req(narrow={"connect_tcp": [True]}), (0, 0), False, Code.BAD_SPEC),
    ("rlimits lower", MANIFEST, req(narrow={"rlimits": {"NOFILE": 128}}), (0, 0), False,
     {"rlimits": {"NOFILE": (128, 128), "CPU": (60, 60)}}),
    ("rlimits higher", MANIFEST, req(narrow={"rlimits": {"NOFILE": 4096}}), (0, 0), False, Code.BAD_SPEC),
    ("rlimits unlimited", MANIFEST, req(narrow={"rlimits": {"CPU": "unlimited"}}), (0, 0), False, Code.BAD_SPEC),
    ("rlimits new", MANIFEST, req(narrow={"rlimits": {"CORE": 0}}), (0, 0), False,
     {"rlimits": {"NOFILE": (256, 1024), "CPU": (60, 60), "CORE": (0, 0)}}),
    ("rlimits unknown", MANIFEST, req(narrow={"rlimits": {"NOPE": 1}}), (0, 0), False, Code.BAD_SPEC),
    ("rlimits not an object", MANIFEST, req(narrow={"rlimits": [1]}), (0, 0), False, Code.BAD_SPEC),
    # the pool: by Spec equality, so a narrowing equal to the manifest keeps it (issue 12's fix)
    ("narrow {} keeps the pool", MANIFEST, req(narrow={}), (0, 0), False, {"pool": ("app", 2)}),
    ("an equal narrowing keeps the pool", MANIFEST,
     req(narrow={"read_only": ["/usr"], "connect_tcp": [80, 443], "rlimits": {"CPU": 60}}), (0, 0), False,
     {"pool": ("app", 2)}),
    ("no pool", NO_POOL, req(), (0, 0), False, {"pool": None}),
    # pool: auto (the default): adaptive, never under an NPROC limit (waiting children count against it)
    ("auto pool", AUTO_POOL, req(), (0, 0), False, {"pool": ("app", None)}),
    ("auto pool, narrowed", AUTO_POOL, req(narrow={"connect_tcp": [80]}), (0, 0), False, {"pool": None}),
    ("auto pool, NPROC", AUTO_NPROC, req(), (0, 0), False, {"pool": None}),
    # the session gid: kept unless the manifest names its group
    ("own group, no session gid", OWN_GROUP, req(), (0, 0), False, {"session_gid": False}),
]


def _plan(m: Manifest, request: dict[str, Any], counts: tuple[int, int], stopping: bool) -> policy.SpawnPlan:
    admitted = policy.admit(request, {m.name: m}, stopping)
    policy.charge(policy.Counts(*counts), PEER, LIMITS)
    return policy.plan(admitted, request, LIMITS, SUPERVISOR_ENV, resolve)


@pytest.mark.parametrize("manifest, request_, counts, stopping, expected",
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_policy(manifest, request_, counts, stopping, expected):
    if isinstance(expected, Code):
        with pytest.raises(Refused) as e:
            _plan(manifest, request_, counts, stopping)
        assert e.value.code is expected, e.value
        return
    plan = _plan(manifest, request_, counts, stopping)
    for key, want in expected.items():
        if key == "rlimits":
            assert {r.name: (r.soft, r.hard) for r in plan.spec.rlimits} == want
        elif hasattr(plan.spec, key) and not hasattr(plan, key):
            assert getattr(plan.spec, key) == want, key
        else:
            assert getattr(plan, key) == want, key
    # What a narrowing leaves alone, and what it can never change.
    assert plan.spec.untrusted_trees == SPEC.untrusted_trees and plan.spec.user == SPEC.user
    assert plan.program == "/usr/bin/app" and plan.umask == 0o77 and plan.manifest is manifest


# check_stdio's system calls as they answer for a kind of file: (st_mode, F_GETFL flags, isatty), or the
# OSError of an fd that is not open.
KINDS: dict[str, tuple[int, int, bool] | OSError] = {
    "pipe": (stat.S_IFIFO | 0o600, os.O_RDONLY, False),
    "socket": (stat.S_IFSOCK | 0o777, os.O_RDWR, False),
    "file": (stat.S_IFREG | 0o644, os.O_WRONLY | os.O_APPEND, False),
    "null": (stat.S_IFCHR | 0o666, os.O_RDWR, False),   # /dev/null: a character device, no terminal
    "tty": (stat.S_IFCHR | 0o620, os.O_RDWR, True),
    "dir": (stat.S_IFDIR | 0o755, os.O_RDONLY | os.O_DIRECTORY, False),
    "O_PATH": (stat.S_IFREG | 0o644, os.O_PATH, False),
    "closed": OSError(errno.EBADF, os.strerror(errno.EBADF)),
}
TERMINAL = replace(MANIFEST, terminal=True)
TTY_REFUSED = ("a terminal, and manifest 'app' does not take one (terminal: true); pass pipes "
               "(`landlock-supervisor run` relays a terminal through pipes)")

# (id, the fds' kinds, manifest, expected: None (usable), or the refusal's message (its code: bad_fds))
STDIO_TABLE: list[tuple[str, tuple[str, ...], Manifest, str | None]] = [
    ("pipes", ("pipe", "pipe", "pipe"), MANIFEST, None),
    ("a file, a socket", ("null", "file", "socket"), MANIFEST, None),
    # how many: 3, before any is looked at
    ("none", (), MANIFEST, "'spawn' takes exactly 3 fds (stdin, stdout, stderr), got 0"),
    ("two", ("pipe", "pipe"), MANIFEST, "'spawn' takes exactly 3 fds (stdin, stdout, stderr), got 2"),
    ("four", ("pipe",) * 4, MANIFEST, "'spawn' takes exactly 3 fds (stdin, stdout, stderr), got 4"),
    ("the count first", ("closed", "tty"), MANIFEST, "'spawn' takes exactly 3 fds (stdin, stdout, stderr), got 2"),
    # each usable, named by its place; the first unusable one is named
    ("not open", ("pipe", "closed", "pipe"), MANIFEST, "stdout: unusable fd: Bad file descriptor"),
    ("a directory", ("dir", "pipe", "pipe"), MANIFEST, "stdin: a directory or O_PATH fd is no stdio"),
    ("an O_PATH fd", ("pipe", "pipe", "O_PATH"), MANIFEST, "stderr: a directory or O_PATH fd is no stdio"),
    ("the first named", ("pipe", "dir", "closed"), MANIFEST, "stdout: a directory or O_PATH fd is no stdio"),
    # a terminal only for a manifest that takes one (terminal: true); a character device that is none
    # (/dev/null) always
    ("a terminal", ("pipe", "pipe", "tty"), MANIFEST, "stderr: " + TTY_REFUSED),
    ("a terminal, taken", ("tty", "tty", "tty"), TERMINAL, None),
    ("a terminal taken is still checked", ("tty", "dir", "tty"), TERMINAL,
     "stdout: a directory or O_PATH fd is no stdio"),
]


@pytest.mark.parametrize("kinds, manifest, expected", [row[1:] for row in STDIO_TABLE],
                         ids=[row[0] for row in STDIO_TABLE])
def test_check_stdio(kinds, manifest, expected):
    def answer(fd: int) -> tuple[int, int, bool]:
        kind = KINDS[kinds[fd]]
        if isinstance(kind, OSError):
            raise kind
        return kind
    asked_tty = []

    def isatty(fd: int) -> bool:
        asked_tty.append(fd)
        return answer(fd)[2]
    fstat = lambda fd: os.stat_result((answer(fd)[0],) + (0,) * 9)  # noqa: E731
    flags_of = lambda fd: answer(fd)[1]  # noqa: E731
    fds = list(range(len(kinds)))
    if expected is None:
        policy.check_stdio(fds, manifest, fstat, flags_of, isatty)
    else:
        with pytest.raises(Refused) as e:
            policy.check_stdio(fds, manifest, fstat, flags_of, isatty)
        assert (e.value.code, str(e.value)) == (Code.BAD_FDS, expected)
    # isatty only where its answer matters: a character device, for a manifest that takes no terminal.
    assert all(kinds[fd] in ("null", "tty") for fd in asked_tty) and not (manifest.terminal and asked_tty)


def test_messages_name_the_field():
    """The refusals a client sees (docs/protocol.md, tests/supervisor check these over the wire)."""
    def refusal(**fields: Any) -> str:
        with pytest.raises(Refused) as e:
            _plan(MANIFEST, req(**fields), (0, 0), False)
        return str(e.value)
    assert refusal(narrow={"read_only": ["/home"]}) == "narrow.read_only: /home is not within what the manifest grants"
    assert refusal(narrow={"read_write": ["/srv/data/loop"]}) == \
        "narrow.read_write: /srv/data/loop: cannot be resolved: Too many levels of symbolic links"
    assert refusal(env={"SECRET": "x"}) == "env: manifest 'app' does not take SECRET from clients (it takes: TOKEN)"
    assert refusal(narrow={"connect_tcp": [22]}) == "narrow.connect_tcp: only ports the manifest grants ([80, 443])"


@pytest.mark.parametrize("name, message", [
    ("ap", "no manifest named 'ap' (did you mean 'app'?); there are: app, apt-mirror, db"),
    ("zzz", "no manifest named 'zzz'; there are: app, apt-mirror, db"),
    (["app"], "no manifest named ['app']; there are: app, apt-mirror, db"),
    ("broken", "manifest 'broken' is not served: /etc/m/broken.yaml: args[0]: ${X} is not set"),
])
def test_a_name_not_served_says_what_is(name, message):
    """The names served and the nearest one; a withdrawn manifest's own error (file and key)."""
    served = {n: replace(MANIFEST, name=n) for n in ("app", "apt-mirror", "db")}
    withdrawn = {"broken": "/etc/m/broken.yaml: args[0]: ${X} is not set"}
    with pytest.raises(Refused) as e:
        policy.admit(req(manifest=name), served, False, withdrawn)
    assert (e.value.code, str(e.value)) == (Code.NO_SUCH_MANIFEST, message)


def test_adaptive_pool_demand():
    """pool: auto: none for a manifest spawned now and then, one after a
    burst, growing to the cap on misses, drained after `idle` seconds."""
    from supervisor.zygote.pools import Demand
    d = Demand(idle=60)
    assert [d.spawned("a", t) for t in (0, 20, 40, 60)] == [0, 0, 0, 0]  # once every 20 s: never
    assert d.due(60) is None
    assert [d.spawned("b", t) for t in (100, 101, 102, 103)] == [0, 0, 1, 1]
    assert [d.grow("b") for _ in range(4)] == [True, True, True, False] and d.spawned("b", 104) == Demand.CAP
    assert d.due(110) == 54 and d.idle_since(163) == [] and d.idle_since(164) == ["b"]
    assert d.spawned("b", 165) == 0 and d.due(165) is None  # counted afresh
    assert not d.grow("a")  # not engaged: nothing to grow
