"""Accesses -> a proposed sandbox (profiles, access classes, ports), each grant with its why; pure.

The rules (docs/manifests.md, "learn"): an executable is granted as the
exact file; a tree where one is cheaper to keep than its files (/usr/lib,
a node_modules, a venv, /usr/share/<pkg>, ~/.cache/<tool>); /etc file by
file; /proc/<pid> as /proc (it binds one process), flagged; writes only
where learning let the server write (its state directory, /tmp, the
--write paths): an attempt elsewhere is a proposal, never a grant. Never
/, a whole home, or a path holding a secret location; never a path a
manifest cannot name exactly (manifests/scalar.writable): refused, listed.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..manifests.refusal import known, why_not
from ..manifests.secrets import within
from . import temporary as temporaries
from .exclude import Excluded, refusal
from ..manifests.scalar import writable as nameable
from .trace import BIND_TCP, CONNECT_TCP, CONNECT_UNIX, CREATE, EXEC, LIST, READ, REMOVE, WRITE, WRITE_KINDS, Access

R, W, X = "r", "w", "x"
STATE_DIR = "${STATE_DIR}"
# A class, by the rights it gives.
CLASSES = {frozenset({R}): "read_only_noexec", frozenset({R, X}): "read_only",
           frozenset({R, W}): "read_write_noexec", frozenset({R, W, X}): "read_write"}
RIGHTS = {cls: rights for rights, cls in CLASSES.items()}
OPTIONAL_PROFILES = ("dns-tls", "node", "python")
_SYSTEM_TREES = ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/lib", "/lib32", "/lib64")
_PACKAGE_PARENTS = ("/usr/share", "/opt", "/usr/local/share", "/usr/local/lib")
SYSTEM_DIRECTORIES = frozenset({
    "/usr", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/share",
    "/usr/include", "/usr/local", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib", "/usr/local/share",
    "/var/lib", "/var/cache", "/var/log", "/var/spool", "/var/mail", "/var/run", "/run/user", "/dev/shm"})
_HOME_TOOL_PARENTS = (".cache", ".config", ".local/share", ".local/lib", ".local/state")
_EVIDENCE = 2        # examples kept per grant
UNNAMEABLE = "no manifest can name it exactly (its name is no UTF-8, or holds ${...}, which the loader expands)"


@dataclass(frozen=True)
class Layout:
    """Where things were during the runs, and what the server will have anyway."""
    cwd: str                                   # the manifest's working directory
    state_dir: str                             # $STATE_DIR during the runs
    area: str                                  # <state root>/servers/<name> during the runs
    scratch: str                               # learn's own files
    home: str | None = None                    # the server's user's home (None: a dynamic user has none)
    writable: tuple[str, ...] = ()             # --write
    excluded: tuple[Excluded, ...] = ()
    homes: tuple[str, ...] = ()                # every home directory (never granted whole)
    chosen: tuple[str, ...] = ("system",)      # profiles from the command
    fragments: Mapping[str, Mapping[str, list[str]]] = field(default_factory=dict)   # profile -> class -> paths
    package_roots: tuple[str, ...] = ()        # virtual environments the server used
    ports: tuple[int, ...] = ()                # connect_tcp its profile gives (npx, uvx: 443)
    write_files: tuple[str, ...] = ()          # the --write paths that are files
    quiet: tuple[str, ...] = ()                # reads its profiles' programs do without (profiles.Fragment.quiet)


@dataclass
class Grant:
    path: str
    rights: set[str]
    reason: str
    evidence: list[str] = field(default_factory=list)
    seen: int = 0
    flag: str = ""

    @property
    def cls(self) -> str:
        return CLASSES[frozenset(self.rights | {R})]

    def note(self, evidence: str) -> None:
        self.seen += 1
        if evidence not in self.evidence and len(self.evidence) < _EVIDENCE:
            self.evidence.append(evidence)


@dataclass
class Proposal:
    profiles: list[str]
    grants: list[Grant]
    connect_tcp: dict[int, str]
    bind_tcp: dict[int, str]
    connect_unix: dict[str, str]
    refused: dict[str, str]           # "read /root/.ssh/id_rsa" -> why
    writes: dict[str, str]            # a write attempted outside what learning allowed -> evidence
    optional: dict[str, str]          # a read its profile says it does without (left out) -> evidence
    covered: dict[str, int]           # profile -> accesses it covers
    temporary: dict[str, str] = field(default_factory=dict)   # a temporary name (temporary.py) -> evidence
    untested: set[str] = field(default_factory=set)   # keys() no run has confirmed (the last round added them)

    def keys(self) -> set[str]:
        """What it grants, one key each ("read_only /usr/bin/x", "connect_tcp 443"): two proposals
        with the same keys allow the same (their comments may differ)."""
        return ({f"profile {name}" for name in self.profiles} | {f"{g.cls} {g.path}" for g in self.grants}
                | {f"connect_tcp {port}" for port in self.connect_tcp} | {f"bind_tcp {port}" for port in self.bind_tcp}
                | {f"connect_unix {path}" for path in self.connect_unix})


_VERBS = {READ: "read", LIST: "listed", EXEC: "ran", WRITE: "wrote", CREATE: "made an entry in",
          REMOVE: "removed an entry from", CONNECT_UNIX: "connected to", CONNECT_TCP: "connected to port",
          BIND_TCP: "bound port"}


def describe(a: Access) -> str:
    """An access as a sentence: `node read /etc/hosts (openat, round 2, denied)`."""
    how = ", ".join(filter(None, (a.evidence, "denied" if a.denied else "")))
    return (f"{a.program or 'the server'} {_VERBS.get(a.kind, a.kind)} {a.path or a.port}"
            + (f" ({how})" if how else ""))


def reach(a: Access) -> str:
    """What a port grant reaches, and who asked: Landlock's network rules name a port, never an address."""
    verb = "connected to" if a.kind == CONNECT_TCP else "bound"
    seen = f"{a.program or 'the server'} {verb} {a.address or 'an address'} port {a.port}"
    every = "to every address" if a.kind == CONNECT_TCP else "on every address"
    return f"port {a.port} {every} (a Landlock port rule names no address): {seen} ({a.evidence})"


def collapse(accesses: Iterable[Access], layout: Layout) -> Proposal:
    profile_ports = {port: f"port {port} to every address (a Landlock port rule names no address): "
                     "its profile's network" for port in layout.ports}
    p = Proposal(profiles=list(layout.chosen), grants=[], connect_tcp=profile_ports, bind_tcp={}, connect_unix={},
                 refused={}, writes={}, optional={}, covered={})
    wants: dict[str, Grant] = {}
    accesses = list(accesses)
    own = temporaries.made(a for a in accesses if not any(within(a.path, w) for w in layout.writable))
    for a in accesses:
        if a.kind in (CONNECT_TCP, BIND_TCP):
            (p.connect_tcp if a.kind == CONNECT_TCP else p.bind_tcp).setdefault(a.port, reach(a))
            continue
        _place(a, layout, p, wants, own)
    grants = _subsume(_upgrade(wants), layout, p.profiles)
    for g in grants:
        g.flag = broad(g.path)
    p.grants = sorted(grants, key=lambda g: (g.cls, g.path))
    return p


def _place(a: Access, layout: Layout, p: Proposal, wants: dict[str, Grant], own: set[str]) -> None:
    """One path access: dropped (learn's own, covered), refused, proposed, or wanted."""
    path = a.path
    if a.kind != CONNECT_UNIX:
        # What the user gave with --write (never a secret: the command
        # checked) is granted as given, writable, even inside a home.
        if a.kind == CREATE and any(os.path.dirname(f) == path for f in layout.write_files):
            return   # an O_CREAT open of a --write file that was there: a CREATE names the directory
        given = next((w for w in layout.writable if within(path, w)), None)
        if given is not None:
            _want(p, wants, given, {R, W, X} if a.kind == EXEC else {R, W}, "given with --write", a)
            return
    why = refusal(path, layout.excluded)
    if why:
        p.refused.setdefault(f"{a.kind} {path}", why)
        return
    if within(path, layout.state_dir):
        if a.kind == EXEC:   # it runs what it put there: its state directory must execute
            _want(p, wants, STATE_DIR, {R, W, X}, "its state directory, where it runs what it fetched", a)
        return
    if within(path, layout.area) or within(path, layout.scratch):
        return   # the caches its profile keeps beside the state directory, or learn's own files
    temporary = temporaries.temporary(a, own)
    if temporary is not None:
        p.temporary.setdefault(temporary, describe(a))
        return
    if a.kind in WRITE_KINDS:
        # A directory of its own in /tmp (where learning let it write), never /tmp.
        mine = temporaries.entry(path) if within(path, "/tmp") else None
        if mine is not None and not (a.kind == WRITE and mine == path) and not _unsafe(mine, layout):
            _want(p, wants, mine, {R, W}, "a directory of its own in /tmp, where learning let it write", a)
        else:
            p.writes.setdefault(path, describe(a))
        return
    if a.kind == CONNECT_UNIX:
        if nameable(path):
            p.connect_unix.setdefault(path, describe(a))
        else:
            p.refused.setdefault(f"{a.kind} {path}", UNNAMEABLE)
        return
    quiet = optional(a, layout)
    if quiet is not None:
        p.optional.setdefault(quiet, describe(a))
        return
    rights = {R, X} if a.kind == EXEC else {R}
    for name in (*p.profiles, *OPTIONAL_PROFILES):
        if _covers(layout.fragments.get(name, {}), path, rights):
            if name not in p.profiles:
                p.profiles.append(name)
            p.covered[name] = p.covered.get(name, 0) + 1
            return
    target, reason = tree(path, a.kind, layout)
    unsafe = _unsafe(target, layout)
    if unsafe and target != path:
        target, reason, unsafe = path, f"the path itself: {target}, {reason}, would be {unsafe}", _unsafe(path, layout)
    if unsafe:
        p.refused.setdefault(f"{a.kind} {path}", unsafe)
        return
    _want(p, wants, target, rights, reason, a)


def optional(a: Access, layout: Layout) -> str | None:
    """The profile's quiet path a read falls under (node's /proc probes):
    left out, its denial harmless (the supervisor counts it as suppressed)."""
    if a.kind not in (READ, LIST):
        return None
    return next((q for q in layout.quiet if within(a.path, q)), None)


def _want(p: Proposal, wants: dict[str, Grant], path: str, rights: set[str], reason: str, a: Access) -> None:
    if path != STATE_DIR and not nameable(path):   # (${STATE_DIR}: ours, for the loader to expand)
        p.refused.setdefault(f"{a.kind} {a.path}", UNNAMEABLE)
        return
    g = wants.setdefault(path, Grant(path, set(), reason))
    if W in rights and W not in g.rights:
        g.reason = reason   # why it is writable says more than why it is readable
    g.rights |= rights
    g.note(describe(a))


def _covers(fragment: Mapping[str, list[str]], path: str, rights: set[str]) -> bool:
    return any(rights <= RIGHTS[cls] and any(within(path, root) for root in roots)
               for cls, roots in fragment.items() if cls in RIGHTS)


def tree(path: str, kind: str, layout: Layout) -> tuple[str, str]:
    """The path to grant for an access to `path`, and why that one."""
    parts = path.split("/")
    if path.startswith("/proc/"):
        return "/proc", "/proc/<pid> binds one process: all of /proc"
    if path.startswith("/sys/"):
        return "/".join(parts[:5]), "/sys, four levels"
    if path.startswith("/dev/pts/"):
        return "/dev/pts", "terminals"
    if path.startswith("/dev/"):
        return path, "a device"
    if "node_modules" in parts:
        return "/".join(parts[:parts.index("node_modules") + 1]), "a node_modules tree"
    for name in ("site-packages", "dist-packages"):
        if name in parts:
            return "/".join(parts[:parts.index(name) + 1]), "a Python package directory"
    for root in layout.package_roots:
        if within(path, root):
            return root, "a virtual environment"
    for root in _SYSTEM_TREES:
        if within(path, root):
            return root, "the system's libraries"
    if path.startswith("/etc/"):
        if path.startswith("/etc/ssl/certs/"):
            return "/etc/ssl/certs", "the CA certificates"
        return path, "under /etc: each file by itself" if kind != LIST else "a directory it lists"
    if kind == EXEC:
        return path, "an executable: the exact file"
    for parent in _PACKAGE_PARENTS:
        if path.startswith(parent + "/") and path.count("/") > parent.count("/") + 1:
            return "/".join(parts[:parent.count("/") + 2]), f"a package directory of {parent}"
    if layout.cwd not in ("/", layout.state_dir) and within(path, layout.cwd):
        return layout.cwd, "its working directory"
    if layout.home and path.startswith(layout.home + "/"):
        rel = path[len(layout.home) + 1:].split("/")
        for parent in _HOME_TOOL_PARENTS:
            depth = parent.count("/") + 1
            if "/".join(rel[:depth]) == parent and len(rel) > depth + 1:
                return os.path.join(layout.home, *rel[:depth + 1]), f"a tool's directory in ~/{parent}"
        if len(rel) > 1:
            return os.path.join(layout.home, rel[0]), "a tool's directory in the home directory"
        return path, "a file of the home directory"
    if kind == LIST:
        return path, "a directory it lists"
    if broad(os.path.dirname(path)):
        return path, "a file of a system directory: the file itself"
    return os.path.dirname(path) or "/", "the directory of a file it read"


def _unsafe(path: str, layout: Layout) -> str | None:
    """Why `path` must not be granted, however it was reached: the one
    refusal table (supervisor/manifests/refusal.py, as for the denial lines), then
    what this learning excluded."""
    table = known((*layout.homes, layout.home), ())
    inside = next((e for e in layout.excluded if within(e.path, path)), None)
    if inside and path != "/" and path not in table.homes:   # (what it holds, named: more than the table says)
        return f"a directory holding {inside.path}, {inside.why}"
    return why_not(path, table) or refusal(path, layout.excluded)


def _upgrade(wants: dict[str, Grant]) -> list[Grant]:
    """Execute seen inside a writable tree: the tree executes (npx runs what
    it unpacked into its cache), rather than an exact file in a tree the
    server can rewrite."""
    writable = [g for g in wants.values() if W in g.rights]
    for g in wants.values():
        if X in g.rights and W not in g.rights:
            owner = next((t for t in writable if t is not g and within(g.path, t.path)), None)
            if owner:
                owner.rights.add(X)
                owner.reason += ", and it runs files in it"
    return list(wants.values())


def _subsume(grants: list[Grant], layout: Layout, profiles: list[str]) -> list[Grant]:
    """Without a grant that an ancestor (or a chosen profile) gives with at least its rights."""
    kept = []
    for g in grants:
        if any(_covers(layout.fragments.get(name, {}), g.path, g.rights) for name in profiles):
            continue
        if any(o is not g and within(g.path, o.path) and o.path != g.path and g.rights <= o.rights
               for o in grants):
            continue
        kept.append(g)
    return kept


def broad(path: str) -> str:
    """The one rule for BROAD, applied to every grant: a system directory
    (top-level, or one the system's files share: every file in it, not
    only those the server used), /proc and /sys (other processes, the
    kernel), a temporary directory whole (every user's). "" otherwise."""
    if within(path, "/proc"):
        return "BROAD: every process's /proc files, within what the uid and ptrace rules allow"
    if within(path, "/sys"):
        return f"BROAD: {path}, the kernel's state"
    if path in temporaries.ROOTS:
        return f"BROAD: {path}, shared with every user of the machine"
    if path in SYSTEM_DIRECTORIES or path.count("/") == 1 and path != STATE_DIR:
        return f"BROAD: {path}, a system directory: every file in it, not only those it used"
    return ""
