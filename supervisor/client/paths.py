"""Where the supervisor's socket and state live by default (os only: clients import it)."""
from __future__ import annotations

import os
import stat

ROOT_SOCKET = "/run/landlock-supervisor/socket"
ROOT_STATE = "/var/lib/landlock-supervisor"
# sockaddr_un's sun_path: 108 bytes, the terminating NUL included.
SOCKET_PATH_MAX = 107


class SocketPathError(ConnectionError):
    """A socket path not to use: too long, or in a fallback directory that is not this user's own."""


def _own_private_dir(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def default_socket_path() -> str:
    """serve's socket: the first of default_socket_paths()."""
    return default_socket_paths()[0]


def default_socket_paths() -> list[str]:
    """Where serve listens (the first) and run looks (each in turn), unless
    given --socket: $LANDLOCK_SUPERVISOR_SOCKET; as root
    /run/landlock-supervisor/socket; otherwise the user's runtime directory
    ($XDG_RUNTIME_DIR when it names the user's own 0700 directory, else
    /run/user/UID when it is one: MCP clients start servers without
    XDG_RUNTIME_DIR, serve and run must agree), then the fallback directory
    for users who have none (su -, ssh without logind, containers, CI), so
    that a daemon started there and a client in a desktop session meet."""
    env = os.environ.get("LANDLOCK_SUPERVISOR_SOCKET")
    if env:
        return [env]
    if os.geteuid() == 0:
        return [ROOT_SOCKET]
    fallback = os.path.join(fallback_directory(), "socket")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    for directory in (runtime, f"/run/user/{os.geteuid()}"):
        if directory and _own_private_dir(directory):
            return [os.path.join(directory, "landlock-supervisor", "socket"), fallback]
    return [fallback]


def fallback_directory() -> str:
    return f"/tmp/landlock-supervisor-{os.geteuid()}"


def check_fallback(socket_path: str, create: bool) -> None:
    """Nothing for a socket outside the fallback directory. The fallback
    lies in a directory everyone may write (/tmp): it is used only when it
    is this uid's own 0700 directory, not a link (made so when missing, if
    `create`); someone else's would send clients to their socket."""
    directory = fallback_directory()
    if os.path.dirname(socket_path) != directory:
        return
    if create:
        try:
            os.mkdir(directory, 0o700)   # (never follows a link: EEXIST)
        except FileExistsError:
            pass
    st = os.lstat(directory)   # (FileNotFoundError: no supervisor there)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.geteuid():
        why = f"was made by uid {st.st_uid}"
    elif st.st_mode & 0o077:
        why = f"has mode {stat.S_IMODE(st.st_mode):04o}, not 0700"
    else:
        return
    raise SocketPathError(f"{directory} {why}: not using it (it could send clients to another socket); "
                          "give --socket PATH")


def check_length(socket_path: str) -> None:
    size = len(os.fsencode(socket_path))
    if size > SOCKET_PATH_MAX:
        raise SocketPathError(f"the socket path {socket_path!r} is {size} bytes, over the {SOCKET_PATH_MAX} a "
                              "Unix socket's path may have: give --socket a shorter path")


def default_state_root() -> str:
    if os.geteuid() == 0:
        return ROOT_STATE
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "landlock-supervisor")
