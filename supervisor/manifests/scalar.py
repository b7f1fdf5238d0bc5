"""A string as a manifest holds it: a YAML double-quoted scalar (q),
whether a path reads back exactly (writable), and one token for a YAML
flow sequence and a line of ours alike (token).

What a server chose (a path it was denied, a name it traced) reaches a
proposal or a line we print only so: a comma, a bracket or a space in it
can neither split one grant into two nor pass its tail for our words.
"""
from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9_./+-]+")   # a YAML plain scalar, one shell word, one token of ours


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
    would be another path, or an unset variable a manifest that does not load),
    and no UTF-8 it lacks (strace's bytes, kept as surrogates, name no
    character a manifest can hold: refused, never approximated)."""
    from .file import VARIABLE
    if VARIABLE.search(path):
        return False
    if path.isascii() and path.isprintable():
        return True   # only `"` and `\` escaped, which YAML reads back
    from .document import NotYaml, parse
    try:
        path.encode()
        return bool(parse("a path", f"p: {q(path)}".encode()) == {"p": path})
    except (UnicodeEncodeError, NotYaml):
        return False


def token(text: str) -> str:
    """As it is where plain (letters, digits, `_./+-`, not led by `-`), else q(text)."""
    return text if _PLAIN.fullmatch(text) and not text.startswith("-") else q(text)
