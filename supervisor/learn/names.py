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
from ..manifests.scalar import q, writable

__all__ = ["clean", "q", "writable"]
