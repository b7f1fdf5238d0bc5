"""Paths and names a server chose, as learn writes them: a grant only if written exactly, elsewhere one escaped token.

A traced path is the server's to choose, byte by byte. In a manifest it is
a YAML double-quoted scalar, every character that is not printable ASCII
escaped, granted only when that scalar parses back to exactly the path: one that is no UTF-8 (strace's
bytes, kept as surrogates) names no character a manifest can hold, and is
refused, never approximated. In comments and in learn's own output
(denied.clean) no character YAML or a terminal takes for a line break, a
control or an escape is left as it is.
"""
from __future__ import annotations

from ..denied import clean

__all__ = ["clean", "q", "writable"]


def q(text: str) -> str:
    """A YAML double-quoted scalar: printable ASCII as it is, every other
    character escaped (beyond the BMP as \\U: JSON's surrogate pairs YAML
    would read as two characters)."""
    out = ['"']
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif " " <= c <= "~":
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def writable(path: str) -> bool:
    """A manifest can name exactly this path: one the loader reads back as
    it is (no `${NAME}`, which it would expand: a server's `/tmp/${HOME}`
    would be another path, or an unset variable a manifest that does not load)."""
    from ..manifests.file import VARIABLE
    if VARIABLE.search(path):
        return False
    if path.isascii() and path.isprintable():
        return True   # only `"` and `\` escaped, which YAML reads back
    from ..manifests.document import NotYaml, parse
    try:
        path.encode()
        return bool(parse("a path", f"p: {q(path)}".encode()) == {"p": path})
    except (UnicodeEncodeError, NotYaml):
        return False
