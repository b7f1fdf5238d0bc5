"""Where the supervisor's socket and state live by default (os only: clients import it)."""
from __future__ import annotations

import os
import stat

ROOT_SOCKET = "/run/landlock-supervisor/socket"
ROOT_STATE = "/var/lib/landlock-supervisor"


class NoDefaultSocket(RuntimeError):
    """No runtime directory of this user's to put the socket in."""


def _own_private_dir(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def default_socket_path() -> str:
    """$LANDLOCK_SUPERVISOR_SOCKET; as root /run/landlock-supervisor/socket;
    otherwise in the user's runtime directory: $XDG_RUNTIME_DIR when it names
    the user's own 0700 directory, else /run/user/UID when it exists (MCP
    clients start servers without XDG_RUNTIME_DIR: serve and run must agree)."""
    env = os.environ.get("LANDLOCK_SUPERVISOR_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return ROOT_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _own_private_dir(runtime):
        return os.path.join(runtime, "landlock-supervisor", "socket")
    fallback = f"/run/user/{os.geteuid()}"
    if _own_private_dir(fallback):
        return os.path.join(fallback, "landlock-supervisor", "socket")
    why = (f"XDG_RUNTIME_DIR={runtime} is not this user's own 0700 directory" if runtime
           else "XDG_RUNTIME_DIR is not set")
    raise NoDefaultSocket(f"{why} and {fallback} does not exist: give --socket PATH")


def default_state_root() -> str:
    if os.geteuid() == 0:
        return ROOT_STATE
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "landlock-supervisor")
