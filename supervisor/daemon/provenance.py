"""Whether someone other than root could rewrite the code a root supervisor
runs: the interpreter, and the directories its modules are imported from (an
editable install imports the checkout, often a user's own)."""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable

from ..client.interpreter import SUPERVISOR_IMPORTS, import_paths


def writable_by_others(st: os.stat_result) -> bool:
    """A file or directory a non-root uid can write: its owner's, or through
    group or other write bits (a root group's excepted: root's own)."""
    mode = st.st_mode
    return (st.st_uid != 0 or bool(mode & stat.S_IWOTH)
            or bool(mode & stat.S_IWGRP and st.st_gid != 0))


def code_paths() -> list[str]:
    """The interpreter, each import directory, and our packages' own directories."""
    import landlock
    import supervisor
    packages = [os.path.dirname(os.path.abspath(str(package.__file__))) for package in (supervisor, landlock)]
    return list(dict.fromkeys([os.path.realpath(sys.executable), *import_paths(SUPERVISOR_IMPORTS), *packages]))


def unsafe(paths: Iterable[str]) -> list[str]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if writable_by_others(st):
            out.append(f"{path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return out


def warning() -> str | None:
    """One line for a root supervisor whose code another uid could rewrite."""
    found = unsafe(code_paths())
    if not found:
        return None
    return ("warning: running as root on code a non-root uid can write, so that uid can take the supervisor "
            f"over (an editable install imports its checkout): {'; '.join(found)}")
