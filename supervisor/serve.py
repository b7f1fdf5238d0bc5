"""`serve`: the fork-server's options checked, then the Supervisor made and served."""
from __future__ import annotations

import argparse
import os

from landlock.exits import EXIT_USAGE

from .failure import fail

TYPE_CHECKING = False   # (typing's own, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from .daemon.namespaces import Isolation
    from .zygote.boot import Booting

# Defaults of supervisor.manifests.ids, repeated here: importing it would load pwd/grp for every command.
DEFAULT_DYNAMIC_UIDS = (1879048192, 1879113727)
DEFAULT_SESSION_GIDS = (1879113728, 1879179263)
HOST_TABLE = "/var/lib/landlock-supervisor/dynamic-uids"
ROOT_HELP = ("load manifests that run as root (allow_root: true, or a user of uid 0). Their children drop "
              "every capability, yet root owns most of the system: a compromised server can chmod root-owned "
              "files (make a copy of /bin/sh set-uid root), so any local user can become root through it. "
              "Without this option such a manifest is refused (logged) and the others load")


def add_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--manifests", action="append", required=True, metavar="PATH",
                       help="a manifest file or a directory of *.yaml (repeatable)")
    serve.add_argument("--allow-uid", action="append", type=int, default=[], metavar="UID",
                       help="a uid, besides the supervisor's own, whose processes may connect and spawn "
                            "(repeatable); with it or --allow-group, a socket serve binds is 0666 in a 0711 "
                            "directory")
    serve.add_argument("--allow-group", action="append", default=[], metavar="GROUP",
                       help="a group (name or gid) whose members may connect and spawn: the peer's primary "
                            "or a supplementary group (repeatable)")
    serve.add_argument("--state-root", metavar="DIR", help="state directories and session records")
    serve.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                       help="seconds between TERM and KILL (default %(default)g)")
    serve.add_argument("--allow-root-servers", action="store_true", help=ROOT_HELP)
    serve.add_argument("--dynamic-uids", metavar="FIRST-LAST", default="%d-%d" % DEFAULT_DYNAMIC_UIDS,
                       help="uids a root supervisor gives `user: dynamic` manifests (default %(default)s), "
                            f"recorded for the whole host in {HOST_TABLE}")
    serve.add_argument("--session-gids", metavar="FIRST-LAST", default="%d-%d" % DEFAULT_SESSION_GIDS,
                       help="a root supervisor's per-session gids (default %(default)s), of which it hands "
                            "out only the lowest blocks of 1024 that no other root supervisor on the host holds")
    serve.add_argument("--max-connections", type=int, default=512, metavar="N",
                       help="open connections in all (default 512); the last 32 are kept for the supervisor's "
                            "own uid, as are its last file descriptors")
    serve.add_argument("--max-connections-per-uid", type=int, default=128, metavar="N",
                       help="open connections of one uid other than the supervisor's (default 128)")
    serve.add_argument("--max-children", type=int, default=256, metavar="N", help="children in all (default 256)")
    serve.add_argument("--max-children-per-uid", type=int, default=64, metavar="N",
                       help="children spawned for one client uid (default 64)")
    serve.add_argument("--audit", choices=("off", "count", "detail"),
                       help="denials from Landlock's audit records (Linux 6.15+, root): count (how many per "
                            "session) or detail (each one, to the session's client); switches host audit on if "
                            "it is off. Default: count where audit is already on, else off")
    serve.add_argument("--audit-nested", action="store_true",
                       help="also log the denials of a server's own Landlock domains (off: a server could "
                            "flood); the kernel does not say whose they are (Linux 6.18 names no parent domain), so "
                            "they are only counted as unattributed in `denials`, never told to a session")
    serve.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--only", metavar="NAME", help=argparse.SUPPRESS)  # private mode for one server
    # learn's scratch supervisor: its manifest's dynamic uid is the one recorded for the real state root.
    serve.add_argument("--dynamic-uids-of", metavar="DIR", help=argparse.SUPPRESS)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, its width found without shutil: argparse makes one for
    each argument declared, and shutil (with bz2 and lzma) is ~1.7-5 ms of
    every start (cli's parser, and a private supervisor's own of `serve`)."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        if not columns.isdigit() or int(columns) == 0:
            try:
                columns = str(os.get_terminal_size().columns)   # stdout's
            except (ValueError, OSError):
                columns = "80"
        super().__init__(prog, width=int(columns) - 2)


def parse(argv: list[str]) -> argparse.Namespace:
    """A private supervisor's command line (["serve", options...], from
    private_boot), parsed as `landlock-supervisor serve` would parse it."""
    parser = argparse.ArgumentParser(prog="landlock-supervisor serve", formatter_class=HelpFormatter)
    add_arguments(parser)
    parser.set_defaults(socket=None)   # (private: its control channel alone)
    return parser.parse_args(argv[1:])


def main(args: argparse.Namespace) -> int:
    import grp

    from .client.paths import default_state_root
    try:
        gids = frozenset(int(g) if g.isdigit() else grp.getgrnam(g).gr_gid for g in args.allow_group)
    except KeyError as e:
        return fail(EXIT_USAGE, f"--allow-group: no such group {e}")
    listen_fd = _systemd_socket()
    from .manifests import ids
    try:
        dynamic_uids = ids.parse_range(args.dynamic_uids, "--dynamic-uids")
        session_gids = ids.parse_range(args.session_gids, "--session-gids")
        if os.geteuid() == 0:
            ids.check_ranges(dynamic_uids, session_gids)
    except ids.IdError as e:
        return fail(EXIT_USAGE, f"not starting: {e}")
    try:
        socket_path = _socket_path(args, listen_fd)
    except OSError as e:   # (SocketPathError among them)
        return fail(EXIT_USAGE, str(e))
    not_positive = _not_positive(args)
    if not_positive:
        return fail(EXIT_USAGE, not_positive)
    state_root = args.state_root or default_state_root()
    # A private supervisor's zygote boots while the modules below import.
    early = _boot_early(state_root) if args.control_fd is not None else None
    lease: list[int] = []   # the lock files of the session gids' blocks, held while it serves
    if os.geteuid() == 0:
        from .daemon import leases
        try:
            session_gids, lease = leases.lease(session_gids, args.max_children)
        except (ids.IdError, OSError) as e:
            if early is not None:
                early[1].abandon()
            why = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else e
            return fail(EXIT_USAGE, f"not starting: the session gids' lease: {why}")
    from .manifests.manifest import ManifestError
    from .daemon.server import Config, Limits, Supervisor
    limits = Limits(grace=args.grace, connections=args.max_connections,
                    connections_per_uid=args.max_connections_per_uid,
                    owner_connections=min(32, args.max_connections // 4),
                    children=args.max_children, children_per_uid=args.max_children_per_uid)
    config = Config(manifest_paths=args.manifests, socket_path=socket_path, listen_fd=listen_fd,
                    control_fd=args.control_fd, allow_uids=frozenset(args.allow_uid), allow_gids=gids,
                    state_root=state_root, limits=limits,
                    allow_root_servers=args.allow_root_servers, dynamic_uids=dynamic_uids,
                    session_gids=session_gids if os.geteuid() == 0 else None, only=args.only,
                    dynamic_uids_of=args.dynamic_uids_of,
                    audit=args.audit, audit_nested=args.audit_nested)
    if os.geteuid() == 0:
        from .daemon.log import log
        from .daemon.provenance import warning
        line = warning()
        if line:
            log(line)
    try:
        supervisor = Supervisor(config, early)
    except (ManifestError, OSError) as e:
        if early is not None:
            early[1].abandon()
        return fail(EXIT_USAGE, f"not starting: {e}")
    if lease and args.control_fd is None:
        from .daemon.log import log
        log(f"session gids {session_gids[0]}-{session_gids[1]}, leased of --session-gids {args.session_gids}")
    try:
        return supervisor.serve()
    finally:
        for fd in lease:   # (its children are gone by now: serve ends them before it returns)
            os.close(fd)


def _systemd_socket() -> int | None:
    """fd 3 when systemd passed this process its socket (LISTEN_PID ours);
    its variables cleared either way: no child inherits them."""
    listen_fd = None
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and int(os.environ.get("LISTEN_FDS", "0")) >= 1:
        listen_fd = 3  # SD_LISTEN_FDS_START
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    return listen_fd


def _socket_path(args: argparse.Namespace, listen_fd: int | None) -> str | None:
    """The path to bind, checked (OSError if it cannot be ours); None with
    systemd's socket or a private supervisor's control channel."""
    from .client.paths import check_fallback, check_length, default_socket_path
    socket_path: str | None = args.socket
    if socket_path is None and listen_fd is None and args.control_fd is None:
        socket_path = default_socket_path()
    if socket_path is not None:
        check_length(socket_path)
        check_fallback(socket_path, create=True)
    return socket_path


def _not_positive(args: argparse.Namespace) -> str | None:
    """The first limit option below 1, as its one line."""
    numbers = {"--max-connections": args.max_connections, "--max-connections-per-uid": args.max_connections_per_uid,
               "--max-children": args.max_children, "--max-children-per-uid": args.max_children_per_uid}
    return next((f"{option}: expected a positive number, got {value}"
                 for option, value in numbers.items() if value < 1), None)


def _boot_early(state_root: str) -> tuple[Isolation | None, Booting]:
    """A private supervisor's isolation and its zygote, booting."""
    from .daemon.early import prepare
    from .zygote import boot
    isolation = prepare(state_root)
    try:
        return isolation, boot.launch()
    except OSError as e:
        raise SystemExit(f"landlock-supervisor: cannot start the zygote: {e}") from None
