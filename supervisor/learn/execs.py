"""What the kernel opens inside execve, where strace cannot see it: the `#!` chain and the ELF interpreter.

Without them a learned manifest fails at once (exit 126 or 127): Landlock
checks the interpreter's execute right as it does the program's.
"""
from __future__ import annotations

import os
import shutil
import stat
import struct
from collections.abc import Mapping

from ..manifests.profiles import regular_file, shebang

_PT_INTERP = 3
_MAX_DEPTH = 4      # the kernel's own limit on #! nesting (BINPRM_MAX_RECURSION)


def elf_interpreter(path: str) -> str | None:
    """The PT_INTERP of a 64- or 32-bit little-endian ELF file, or None."""
    try:
        with regular_file(path) as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[5] != 1:
                return None
            wide = head[4] == 2
            if wide:
                phoff, = struct.unpack_from("<Q", head, 32)
                phentsize, phnum = struct.unpack_from("<HH", head, 54)
            else:
                phoff, = struct.unpack_from("<I", head, 28)
                phentsize, phnum = struct.unpack_from("<HH", head, 42)
            for i in range(min(phnum, 256)):
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                if len(entry) < 16 or struct.unpack_from("<I", entry, 0)[0] != _PT_INTERP:
                    continue
                offset, size = (struct.unpack_from("<QQ", entry, 8)[0], struct.unpack_from("<Q", entry, 32)[0]) \
                    if wide else (struct.unpack_from("<I", entry, 4)[0], struct.unpack_from("<I", entry, 16)[0])
                f.seek(offset)
                return f.read(min(size, 4096)).rstrip(b"\0").decode(errors="surrogateescape") or None
    except (OSError, struct.error):
        return None
    return None


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def chain(program: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(file, why) for every file execve(program) makes the kernel execute
    besides program itself, and the program `env NAME` runs (env's own exec,
    which strace does see, is listed too: it costs nothing to be sure)."""
    out: list[tuple[str, str]] = []
    current = program
    for _ in range(_MAX_DEPTH):
        interp = elf_interpreter(current)
        if interp:
            out.append((interp, f"the ELF interpreter of {current}"))
            break
        words = shebang(current)
        if not words:
            break
        if not _regular(words[0]):   # the kernel executes regular files only: a device there is no grant
            break
        out.append((words[0], f"the #! line of {current}"))
        if os.path.basename(words[0]) == "env":
            out += [(i, f"the ELF interpreter of {words[0]}") for i in filter(None, [elf_interpreter(words[0])])]
            name = next((w for w in words[1:] if not w.startswith("-")), None)
            found = shutil.which(name, path=env.get("PATH", os.defpath)) if name else None
            if not found:
                break
            out.append((found, f"what {words[0]} runs for {current}"))
            current = found
        else:
            current = words[0]
    return out
