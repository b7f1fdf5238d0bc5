"""Temporary names in the shared temporary directories (tempfile's probes, mkstemp, mkdtemp, node's, pids, random suffixes): never granted, never proposed; pure.

A name made up at random is another name in the next run: a grant of it
grants nothing (`check` calls it missing), a `--write` of it is useless,
and /tmp or /var/tmp whole is shared with every user of the machine. A
learnt server's temporary files go to its state directory instead: learn's
manifests set `TMPDIR=${STATE_DIR}`, which Python's tempfile and node's
os.tmpdir() honour. What the server makes in a temporary directory itself,
or under a made-up name there, is listed, not granted.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from ..manifests.secrets import within
from .trace import WRITE_KINDS, Access

ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
WHY = "a temporary file: the manifest's TMPDIR, its state directory, takes its place"
_MADE_UP = [
    re.compile(r"^tmp[a-z0-9_]{8}(\..*)?$"),               # tempfile.mkstemp, mkdtemp, NamedTemporaryFile
    re.compile(r"(^|[-_.])(?=[a-z_]*[0-9_])[a-z0-9_]{8}$"),   # tempfile's probe; mkdtemp(prefix="x-")
    re.compile(r"[-_.](?=[A-Za-z]*[0-9])[A-Za-z0-9]{6}$"),    # node's mkdtemp("x-"): six of [A-Za-z0-9]
    re.compile(r"(^|[^0-9])[0-9]{3,}([^0-9]|$)"),           # a pid, a time
    re.compile(r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}"),   # a hex token
]


def made_up(name: str) -> bool:
    """A file name that looks drawn at random: it will be another in the next run."""
    return any(rule.search(name) for rule in _MADE_UP)


def entry(path: str) -> str | None:
    """The temporary directory's entry `path` lies in (the directory itself for itself), or None."""
    root = next((r for r in ROOTS if within(path, r)), None)
    if root is None:
        return None
    rest = path[len(root):].lstrip("/")
    return root + "/" + rest.split("/")[0] if rest else root


def made(accesses: Iterable[Access]) -> set[str]:
    """The made-up entries the server wrote (its own: a read of one later is no grant either)."""
    out = set()
    for a in accesses:
        where = entry(a.path) if a.kind in WRITE_KINDS else None
        if where and where not in ROOTS and made_up(where.rsplit("/", 1)[1]):
            out.add(where)
    return out


def temporary(a: Access, own: set[str]) -> str | None:
    """What of a temporary directory this access names, if it is no grant:
    a file made in /tmp itself (only /tmp whole would allow it), or one of
    the made-up entries (`own`: made(...))."""
    where = entry(a.path)
    if where is None:
        return None
    if where in ROOTS:
        return where if a.kind in WRITE_KINDS else None
    if where in own or (a.kind in WRITE_KINDS and made_up(where.rsplit("/", 1)[1])):
        return where
    return None
