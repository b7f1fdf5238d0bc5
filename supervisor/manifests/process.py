"""A manifest's process keys: `command` (found on PATH: absolute), `cwd`,
`client_env`, `umask`: what is executed, where, and what a client may add
to its environment. Loader steps (manifest._Loader), each failing on the
key it reads."""
from __future__ import annotations

import os
from collections.abc import Mapping

from .file import ENV_NAME, Expander, Reader


def command(top: Reader, expand: Expander, env: Mapping[str, str], inherit_env: list[str],
            manifest_env: Mapping[str, str]) -> str:
    """The command, expanded and found on PATH: absolute."""
    path_var = (manifest_env.get("PATH") or (env.get("PATH") if "PATH" in inherit_env else None)
                or os.defpath)
    text = top.get("command", str, None)
    if not text:
        top.fail("command", "missing")
    text = expand("command", text)
    if "/" in text:
        resolved: str | None = text
    else:
        import shutil   # here: ~1.7 ms of a private supervisor's start, for a command on PATH only
        resolved = shutil.which(text, path=path_var)
    if not resolved or not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
        top.fail("command", f"{text!r} is not an executable file"
                 + ("" if "/" in text else f" on PATH {path_var}"))
    return os.path.abspath(resolved)


def cwd(top: Reader, expand: Expander, state_dir: str | None) -> str:
    path = expand("cwd", top.get("cwd", str, state_dir or "/"))
    if not os.path.isabs(path):
        top.fail("cwd", f"{path!r} is not an absolute path")
    return path


def client_env(top: Reader) -> list[str]:
    names = top.strings("client_env")
    for i, var in enumerate(names):
        if not ENV_NAME.match(var):
            top.fail(f"client_env[{i}]", f"{var!r} is not a valid variable name")
    return names


def umask(top: Reader) -> int:
    text = top.get("umask", (str, int), "077")
    if isinstance(text, int) and text != 0:
        # YAML reads 077 as the number 63 (and 22 as 22): only a string says what was meant.
        top.fail("umask", f"expected a quoted octal string such as \"077\", got the number {text} "
                 "(YAML reads 022 as 18: quote it)")
    try:
        value = int(str(text), 8)
    except ValueError:
        top.fail("umask", "expected an octal string such as \"077\"")
    if not 0 <= value <= 0o777:
        top.fail("umask", "expected an octal value from 000 to 777")
    return value
