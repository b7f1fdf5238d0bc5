"""The core set: every access class, every operation, every ABI from 1 to
the kernel's, as root without capabilities and as an unprivileged uid.

Each operation gets its own scratch tree, whose directory d gets one rule of
the class under test; nothing else is granted but /usr (read+exec: the
dynamic loader of the execute operation lives there). The trees are owned by
the child's uid, so DAC allows everything and a denial can only come from
Landlock. To keep forks few, one confined child per (identity, class, ABI)
tries every operation, each on its own tree; each test checks one of them.
"""
from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from landlock import Spec

ALLOWED = (0,)
DENIED = (errno.EACCES, errno.EPERM)
CROSS_DIR_DENIED = (errno.EXDEV, errno.EACCES, errno.EPERM)

READ = {"read_only", "read_only_noexec", "read_write", "read_write_noexec"}
WRITE = {"read_write", "read_write_noexec"}
EXEC = {"read_only", "read_write"}
CLASSES = ["read_only", "read_only_noexec", "read_write", "read_write_noexec", "connect_unix"]


def _spawn(path: Path) -> int:
    pid = os.posix_spawn(str(path), [str(path)], {})  # raises the execve errno
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return 0


def _bind_unix(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


def _connect_unix(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))


def _listen_unix(d: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "sock"))
    os.chmod(d / "sock", 0o777)
    s.listen()
    return s


# name -> (operation on d, run in the confined child; expected errnos given (class, abi))
OPS: dict[str, tuple[Callable[[Path], Any], Callable[[str, int], tuple[int, ...]]]] = {
    "read_file": (lambda d: (d / "file").read_bytes(),
                  lambda c, abi: ALLOWED if c in READ else DENIED),
    "list_dir": (lambda d: os.listdir(d),
                 lambda c, abi: ALLOWED if c in READ else DENIED),
    "read_outside": (lambda d: (d.parent / "out" / "file").read_bytes(),
                     lambda c, abi: DENIED),
    "write_file": (lambda d: os.close(os.open(d / "file", os.O_WRONLY)),
                   lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "create_file": (lambda d: os.close(os.open(d / "new", os.O_WRONLY | os.O_CREAT | os.O_EXCL)),
                    lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "create_dir": (lambda d: os.mkdir(d / "newdir"),
                   lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "create_fifo": (lambda d: os.mkfifo(d / "fifo"),
                    lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "create_symlink": (lambda d: os.symlink("file", d / "link"),
                       lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "create_socket": (lambda d: _bind_unix(d / "s"),
                      lambda c, abi: ALLOWED if c in WRITE else DENIED),
    # MAKE_CHAR is never granted. EACCES, not the EPERM of a missing
    # CAP_MKNOD: Landlock's hook runs first.
    "mknod_char": (lambda d: os.mknod(d / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3)),
                   lambda c, abi: (errno.EACCES,)),
    "remove_file": (lambda d: os.unlink(d / "file"),
                    lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "remove_dir": (lambda d: os.rmdir(d / "empty"),
                   lambda c, abi: ALLOWED if c in WRITE else DENIED),
    "rename_same_dir": (lambda d: os.rename(d / "file", d / "renamed"),
                        lambda c, abi: ALLOWED if c in WRITE else DENIED),
    # refer: ABI 1 denies every cross-directory rename or link with EXDEV,
    # even inside one writable tree; from ABI 2 a writable tree allows it.
    "rename_cross_dir": (lambda d: os.rename(d / "a" / "f", d / "b" / "f"),
                         lambda c, abi: (ALLOWED if abi >= 2 else (errno.EXDEV,)) if c in WRITE
                         else CROSS_DIR_DENIED),
    "link_cross_dir": (lambda d: os.link(d / "a" / "f", d / "b" / "g"),
                       lambda c, abi: (ALLOWED if abi >= 2 else (errno.EXDEV,)) if c in WRITE
                       else CROSS_DIR_DENIED),
    # truncate is handled from ABI 3; before, nothing stops it.
    "truncate": (lambda d: os.truncate(d / "file", 0),
                 lambda c, abi: ALLOWED if c in WRITE or abi < 3 else DENIED),
    "truncate_outside": (lambda d: os.truncate(d.parent / "out" / "file", 0),
                         lambda c, abi: ALLOWED if abi < 3 else DENIED),
    "execute": (lambda d: _spawn(d / "true"),
                lambda c, abi: ALLOWED if c in EXEC else (errno.EACCES,)),
    # Connecting to a pathname socket is not restricted before ABI 9
    # (Report.unix_connect_unrestricted), whatever the rules say.
    "connect_unix_socket": (lambda d: _connect_unix(d / "sock"),
                            lambda c, abi: ALLOWED if abi < 9 or c == "connect_unix" else DENIED),
}
SETUP: dict[str, Callable[[Path], Any]] = {"connect_unix_socket": _listen_unix}


@pytest.fixture(scope="session")
def outcomes_cache() -> dict[tuple[str, str, int], dict[str, int | str]]:
    return {}


@pytest.fixture
def outcomes(run_confined, layout_for, outcomes_cache, identity, cls, abi) -> dict[str, int | str]:
    """op -> errno (0: allowed) in one child confined as identity, with
    class cls on every operation's d, at ABI abi."""
    key = (identity.name, cls, abi)
    if key not in outcomes_cache:
        dirs = {op: layout_for(identity.uid).d for op in OPS}
        paths = {cls: tuple(str(d) for d in dirs.values())}
        paths["read_only"] = paths.get("read_only", ()) + ("/usr",)
        spec = Spec(**paths, **identity.spec, max_abi=abi)
        keep = [SETUP[op](dirs[op]) for op in SETUP]

        def run_all() -> dict[str, int | str]:
            got: dict[str, int | str] = {}
            for op, (run, _) in OPS.items():
                try:
                    run(dirs[op])
                    got[op] = 0
                except OSError as e:
                    got[op] = e.errno
                except Exception as e:  # noqa: BLE001 - fails that operation's test only
                    got[op] = repr(e)
            return got
        try:
            outcomes_cache[key] = run_confined(spec, run_all).unwrap()
        finally:
            for k in keep:
                k.close()
    return outcomes_cache[key]


@pytest.mark.enforcement
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("op", OPS)
def test_access(outcomes, op, cls, abi):
    got = outcomes[op]
    assert got in OPS[op][1](cls, abi), f"{op} under {cls} at ABI {abi}: {errno.errorcode.get(got, got)}"
