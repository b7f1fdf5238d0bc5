"""strace's output -> the accesses Landlock checks: what a learn run saw a server do.

One file per task (`strace -ff`: with one file, `<unfinished ...>` lines
interleave and an execve can be lost). `-y -yy` prints the path behind each
fd, the cwd behind AT_FDCWD and the socket type; strings are C-escaped.
Calls Landlock does not check (stat, access, readlink, getcwd) are left
out. Pure: lines in, accesses out; paths are lexical (the learner resolves
symlinks, which Landlock's rules must name by their targets).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

STRACE = "/usr/bin/strace"
# %process for execve and clone (a child's cwd), ftruncate (%file misses it),
# no signal lines. Never --seccomp-bpf: it would put a seccomp filter in the server.
OPTIONS = ("-ff", "-qq", "-y", "-yy", "-s", "4096", "-e", "trace=%file,%network,%process,ftruncate",
           "-e", "signal=none")
# Landlock's errors: EACCES for a denied path or port, EXDEV for a refused reparenting.
DENIED = frozenset({"EACCES", "EXDEV"})
# The kinds of access, each one Landlock right (or group of rights).
READ, LIST, EXEC, WRITE, CREATE, REMOVE = "read", "list", "exec", "write", "create", "remove"
CONNECT_TCP, BIND_TCP, CONNECT_UNIX = "connect_tcp", "bind_tcp", "connect_unix"
PATH_KINDS = (READ, LIST, EXEC, WRITE, CREATE, REMOVE, CONNECT_UNIX)
WRITE_KINDS = (WRITE, CREATE, REMOVE)


@dataclass(frozen=True)
class Access:
    kind: str
    path: str = ""          # absolute; for create and remove, the directory
    port: int = 0
    denied: bool = False
    evidence: str = ""      # how it was seen: "openat", "audit", "the ELF interpreter of /usr/bin/node"
    program: str = ""       # who: the task's program (the file it executed, or audit's comm)
    address: str = ""       # for a port: the address it connected to or bound


@dataclass(frozen=True)
class Call:
    name: str
    args: list[str]
    result: str
    errno: str | None       # None: it succeeded


def strace_argv(output: str, argv: Iterable[str]) -> list[str]:
    """strace writing one file per task to OUTPUT.<tid>, then the program."""
    return [STRACE, *OPTIONS, "-o", output, "--", *argv]


_ESCAPES = {"n": 10, "t": 9, "r": 13, "v": 11, "f": 12, "a": 7, "b": 8, "\\": 92, '"': 34, "'": 39}


def unescape(text: str) -> str:
    """A C-escaped string as strace prints it (octal, \\xHH, \\n...) -> the path."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out += c.encode(errors="surrogateescape")
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", text[i + 1:])
            assert digits is not None
            out.append(int(digits.group(), 8) & 0xFF)
            i += 1 + len(digits.group())
        elif nxt == "x" and re.match(r"[0-9a-fA-F]{2}", text[i + 2:i + 4]):
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(_ESCAPES.get(nxt, ord(nxt) if ord(nxt) < 128 else 63))
            i += 2
    return os.fsdecode(bytes(out))


def _skip_string(line: str, i: int) -> int:
    """The index after the string opening at i (and after a `...` of truncation)."""
    i += 1
    while i < len(line) and line[i] != '"':
        i += 2 if line[i] == "\\" else 1
    i += 1
    return i + 3 if line.startswith("...", i) else i


def _skip_annotation(line: str, i: int) -> int:
    """The index after `<...>` opening at i: its `<` and `>` are escaped, but
    a socket's `->` is not."""
    i += 1
    while i < len(line) and not (line[i] == ">" and line[i - 1] != "-"):
        i += 1
    return i + 1


_HEAD = re.compile(r"^([a-z_0-9]+)\(")
_RESULT = re.compile(r"^\s*=\s*(.*)$")


def parse_line(line: str) -> Call | None:
    """One complete call, or None (an unfinished one, an exit, noise)."""
    head = _HEAD.match(line)
    if not head:
        return None
    args: list[str] = []
    depth, i, start = 0, head.end(), head.end()
    while i < len(line):
        c = line[i]
        if c == '"':
            i = _skip_string(line, i)
            continue
        if c == "<":
            i = _skip_annotation(line, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            args.append(line[start:i].strip())
            start = i + 1
        i += 1
    else:
        return None
    if line[start:i].strip():
        args.append(line[start:i].strip())
    result = _RESULT.match(line[i + 1:])
    if not result or result.group(1).startswith("?"):
        return None
    value = result.group(1)
    errno = value.split()[1] if value.startswith("-1 ") and len(value.split()) > 1 else None
    return Call(head.group(1), args, value, errno)


def string_arg(token: str) -> str | None:
    if token.startswith('"'):
        end = _skip_string(token, 0)
        return unescape(token[1:token.rfind('"', 0, end)])
    return None


_DEVICE = re.compile(r"<(?:char|block) \d+:\d+>$")


def fd_path(token: str) -> str | None:
    """The path behind `3</etc/x>` or `AT_FDCWD</cwd>` (None for a socket, a pipe)."""
    start = token.find("<")
    if start < 0 or not token.endswith(">"):
        return None
    inner = token[start + 1:-1]
    if not inner.startswith("/"):
        return None
    inner = _DEVICE.sub("", inner)   # -yy: /dev/null<char 1:3>
    path = unescape(inner)
    return path[:-len(" (deleted)")] if path.endswith(" (deleted)") else path


# name -> (dirfd index or None, path index) of the path each call acts on.
_OPEN = {"open": (None, 0, 1), "openat": (0, 1, 2), "openat2": (0, 1, 2), "creat": (None, 0, None)}
_CREATE = {"mkdir": (None, 0), "mkdirat": (0, 1), "mknod": (None, 0), "mknodat": (0, 1),
           "symlink": (None, 1), "symlinkat": (1, 2), "link": (None, 1), "linkat": (2, 3)}
_REMOVE = {"unlink": (None, 0), "unlinkat": (0, 1), "rmdir": (None, 0)}
_RENAME = {"rename": ((None, 0), (None, 1)), "renameat": ((0, 1), (2, 3)), "renameat2": ((0, 1), (2, 3))}
_EXEC = {"execve": (None, 0), "execveat": (0, 1)}
_CLONES = ("clone", "clone3", "fork", "vfork")


class Task:
    """One task's file, read in order: its cwd and program as they change."""

    def __init__(self, cwd: str, label: str) -> None:
        self.cwd = cwd
        self.program = label   # until it execs: a thread, or a fork of a program
        self.children: dict[str, str] = {}   # tid -> this task's program when it cloned it

    def _path(self, call: Call, dirfd: int | None, index: int) -> str | None:
        if index >= len(call.args):
            return None
        path = string_arg(call.args[index])
        if path is None:
            return None
        base = self.cwd
        if dirfd is not None and dirfd < len(call.args):
            token = call.args[dirfd]
            at = fd_path(token)
            if token.startswith("AT_FDCWD") and at:
                self.cwd = base = at
            elif at:
                base = at
            elif not token.startswith("AT_FDCWD") and not path.startswith("/"):
                return None   # a dirfd strace could not name
        return os.path.normpath(os.path.join(base, path))

    def accesses(self, call: Call) -> Iterator[Access]:
        """The call's accesses, each naming the program that made it (for an
        execve, the program that ran the new one)."""
        program = self.program
        for a in self._accesses(call):
            yield replace(a, program=program) if not a.program else a

    def _accesses(self, call: Call) -> Iterator[Access]:
        name, ok = call.name, call.errno is None
        child = call.result.split(maxsplit=1)[:1]   # (a forged line may have no result at all)
        if name in _CLONES and ok and child and child[0].isdigit():
            self.children[child[0]] = self.program
        if name in ("connect", "bind") and not ok and call.errno not in DENIED:
            ok = True   # EINPROGRESS, ECONNREFUSED, EADDRINUSE: Landlock let it through
        if not ok and call.errno not in DENIED:
            return
        denied = not ok
        evidence = name
        if name in _EXEC:
            path = self._path(call, *_EXEC[name])
            if path:
                if ok:
                    self.program = os.path.basename(path)
                yield Access(EXEC, path, denied=denied, evidence=evidence)
        elif name in _OPEN:
            dirfd, index, flags_at = _OPEN[name]
            yield from self._open(call, dirfd, index, flags_at, denied, evidence)
        elif name in _CREATE or name in _REMOVE:
            kind = CREATE if name in _CREATE else REMOVE
            path = self._path(call, *(_CREATE.get(name) or _REMOVE[name]))
            if path:
                yield Access(kind, os.path.dirname(path), denied=denied, evidence=evidence)
        elif name in _RENAME:
            old, new = (self._path(call, *where) for where in _RENAME[name])
            if old and new:
                yield Access(REMOVE, os.path.dirname(old), denied=denied, evidence=evidence)
                yield Access(CREATE, os.path.dirname(new), denied=denied, evidence=evidence)
        elif name == "truncate":
            path = self._path(call, None, 0)
            if path:
                yield Access(WRITE, path, denied=denied, evidence=evidence)
        elif name == "ftruncate" and call.args:
            path = fd_path(call.args[0])
            if path:
                yield Access(WRITE, path, denied=denied, evidence=evidence)
        elif name in ("chdir", "fchdir") and ok:
            path = self._path(call, None, 0) if name == "chdir" else fd_path(call.args[0]) if call.args else None
            if path:
                self.cwd = path
        elif name in ("connect", "bind") and len(call.args) >= 2:
            yield from self._socket(call, denied, evidence)

    def _open(self, call: Call, dirfd: int | None, index: int, flags_at: int | None, denied: bool,
              evidence: str) -> Iterator[Access]:
        path = self._path(call, dirfd, index)
        flags = call.args[flags_at] if flags_at is not None and flags_at < len(call.args) else "O_WRONLY|O_CREAT"
        if not path or "O_PATH" in flags:
            return   # O_PATH opens are checked by nobody
        opened = fd_path(call.result) if not denied else None
        target = opened or path
        if "O_CREAT" in flags:
            yield Access(CREATE, os.path.dirname(target), denied=denied, evidence=evidence)
        if "O_WRONLY" in flags or "O_RDWR" in flags or "O_TRUNC" in flags:
            yield Access(WRITE, target, denied=denied, evidence=evidence)
        if "O_WRONLY" not in flags:
            yield Access(LIST if "O_DIRECTORY" in flags else READ, target, denied=denied, evidence=evidence)

    def _socket(self, call: Call, denied: bool, evidence: str) -> Iterator[Access]:
        sock, address = call.args[0], call.args[1]
        if "sa_family=AF_UNIX" in address and call.name == "connect":
            path = re.search(r'sun_path=(".*")', address)
            if path and (name := string_arg(path.group(1))) and name.startswith("/"):
                yield Access(CONNECT_UNIX, os.path.normpath(name), denied=denied, evidence=evidence)
        elif "<TCP" in sock and ("AF_INET" in address):
            port = re.search(r"sin6?_port=htons\((\d+)\)", address)
            if port:
                kind = CONNECT_TCP if call.name == "connect" else BIND_TCP
                ip = re.search(r'inet_addr\("([^"]*)"\)|inet_pton\(AF_INET6, "([^"]*)"', address)
                yield Access(kind, port=int(port.group(1)), denied=denied, evidence=evidence,
                             address=(ip.group(1) or ip.group(2)) if ip else "")


def read_task(lines: Iterable[str], cwd: str, label: str = "a task") -> tuple[list[Access], dict[str, str]]:
    """Every access of one task's file, in order; the tasks it cloned (tid -> its program then)."""
    task = Task(cwd, label)
    out: list[Access] = []
    for line in lines:
        call = parse_line(line.rstrip("\n"))
        if call is not None:
            out.extend(task.accesses(call))
    return out, task.children


def read_tasks(files: Iterable[tuple[str, Iterable[str]]], cwd: str, root: str = "the server") -> list[Access]:
    """Every access of every task's file (tid, lines), each naming a program:
    a task that never executed anything is its parent's program when it
    cloned it (a thread, a fork), never a task id; `root` the first."""
    found: list[tuple[str, list[Access]]] = []
    parents: dict[str, str] = {}
    for tid, lines in files:
        accesses, children = read_task(lines, cwd, _PLACEHOLDER + tid)
        found.append((tid, accesses))
        parents.update(children)

    def name(label: str) -> str:
        for _ in range(64):   # a chain of threads and forks; a loop only in a forged trace
            if not label.startswith(_PLACEHOLDER):
                return label
            label = parents.get(label[len(_PLACEHOLDER):], root)
        return root
    return [replace(a, program=name(a.program)) for _, accesses in found for a in accesses]


_PLACEHOLDER = "\0task "   # no program's name: a comm holds no NUL
