"""landlock-supervisor: serve, run, ping, list, stats, denials, check, learn."""
from __future__ import annotations

import argparse
import os
import select
import sys

from landlock.exits import EXIT_EXEC_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE

# The rest is imported where used: a private supervisor is spawned right
# after the arguments are parsed, and `run` imports its client beside it.
TYPE_CHECKING = False   # (typing's own, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .client import Child, Client
    from .journal import Journal
    from .private_boot import Booting
    from .relay import Relay

# Defaults of supervisor.ids, repeated here: importing it would load pwd/grp for `ping`.
DEFAULT_DYNAMIC_UIDS = (1879048192, 1879113727)
DEFAULT_SESSION_GIDS = (1879113728, 1879179263)
HOST_TABLE = "/var/lib/landlock-supervisor/dynamic-uids"
_ROOT_HELP = ("load manifests that run as root (allow_root: true, or a user of uid 0). Their children drop "
              "every capability, yet root owns most of the system: a compromised server can chmod root-owned "
              "files (make a copy of /bin/sh set-uid root), so any local user can become root through it. "
              "Without this option such a manifest is refused (logged) and the others load")


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
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
    serve.add_argument("--grace", type=float, default=5.0,
                       help="seconds between TERM and KILL (default %(default)g)")
    serve.add_argument("--allow-root-servers", action="store_true", help=_ROOT_HELP)
    serve.add_argument("--dynamic-uids", metavar="FIRST-LAST", default="%d-%d" % DEFAULT_DYNAMIC_UIDS,
                       help="uids a root supervisor gives `user: dynamic` manifests (default %(default)s), "
                            f"recorded for the whole host in {HOST_TABLE}")
    serve.add_argument("--session-gids", metavar="FIRST-LAST", default="%d-%d" % DEFAULT_SESSION_GIDS,
                       help="a root supervisor's per-session gids (default %(default)s)")
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


def _run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--manifests", action="append", default=[], metavar="PATH",
                     help="with no supervisor running, start a private one with these")
    run.add_argument("--env", action="append", default=[], metavar="NAME",
                     help="pass NAME from this environment (the manifest must list it in client_env)")
    run.add_argument("--state-root", metavar="DIR")
    run.add_argument("--verbose", action="store_true",
                     help="name every variable of this environment not passed to the server (else a few)")
    run.add_argument("--allow-root-servers", action="store_true",
                     help="for the private supervisor of --manifests: " + _ROOT_HELP)
    run.add_argument("name")
    run.add_argument("args", nargs=argparse.REMAINDER)


def _denials_arguments(denials: argparse.ArgumentParser) -> None:
    denials.add_argument("--follow", action="store_true", help="then each new one as it comes")
    denials.add_argument("--json", action="store_true", help="JSON, one object a line")
    denials.add_argument("--session", metavar="ID",
                         help="the denials of the `run` session that printed this id (what its supervisor said, "
                              "kept in <state root>/denials; no supervisor needed)")
    denials.add_argument("--state-root", metavar="DIR", help="with --session: the `run --state-root` it was given")


def _check_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("--manifests", action="append", default=[], metavar="PATH")
    check.add_argument("--state-root", metavar="DIR")
    check.add_argument("--json", action="store_true")
    check.add_argument("--profiles", action="store_true", help="list the built-in profiles")
    check.add_argument("manifest", nargs="*", help="manifest files (or use --manifests)")


def _learn_arguments(learn: argparse.ArgumentParser) -> None:
    from .learn import command as learn_command
    learn_command.add_arguments(learn)


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


# Each command, its help and what declares its arguments.
_COMMANDS = {
    "serve": ("run the fork-server", _serve_arguments),
    "run": ("spawn NAME with this process's stdio and wait for it", _run_arguments),
    "ping": ("is the supervisor there?", _no_arguments),
    "list": ("manifests and running children", _no_arguments),
    "stats": ("counters, fds, memory", _no_arguments),
    "denials": ("recent kernel denials (the supervisor's owner: all sessions'), or a `run` session's",
                _denials_arguments),
    "check": ("what each manifest really gets on this kernel", _check_arguments),
    "learn": ("learn a server's manifest from confined, traced runs of an MCP session", _learn_arguments),
}


def _command_of(argv: list[str]) -> str | None:
    """The command argv names, found past `--socket PATH`; None when an
    option comes first (-h: every command's arguments are declared)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--socket":
            i += 2
        elif argv[i].startswith("--socket="):
            i += 1
        else:
            return None if argv[i].startswith("-") else argv[i]
    return None


class _Help(argparse.HelpFormatter):
    """argparse's own, its width found without shutil: argparse makes one for
    each argument declared, and shutil (with bz2 and lzma) is ~1.7 ms of
    every start."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        if not columns.isdigit() or int(columns) == 0:
            try:
                columns = str(os.get_terminal_size().columns)   # stdout's
            except (ValueError, OSError):
                columns = "80"
        super().__init__(prog, width=int(columns) - 2)


_EXIT_STATUS = (f"Exit status: 0 done; 1 the environment or the supervisor failed; {EXIT_USAGE} usage or "
                f"input (arguments, manifests, a name not served); {EXIT_UNAVAILABLE} confinement unavailable; "
                f"{EXIT_EXEC_FAILED} the server could not be started; otherwise `run` exits as its server did "
                "and `learn` as its --help says. A failure is one line on stderr: what, and where.")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the arguments of `command` alone when it is
    one of ours: declaring all of them (learn's module included) took ~4 ms
    of every start, twice in private mode."""
    p = argparse.ArgumentParser(prog="landlock-supervisor", formatter_class=_Help, epilog=_EXIT_STATUS,
                                description="A single-threaded fork-server that starts stdio servers "
                                            "confined by Landlock, with a client's own fds as their stdio.")
    socket_help = ("the supervisor's socket; default: $LANDLOCK_SUPERVISOR_SOCKET, /run/landlock-supervisor/socket "
                   "as root, else landlock-supervisor/socket in $XDG_RUNTIME_DIR or /run/user/UID")
    p.add_argument("--socket", metavar="PATH", help=socket_help)
    sub = p.add_subparsers(dest="command", required=True)
    everything = command not in _COMMANDS
    for name, (help_text, declare) in _COMMANDS.items():
        parser = sub.add_parser(name, help=help_text, formatter_class=_Help)
        if everything or name == command:
            declare(parser)
        parser.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help=socket_help)
    return p


def _fail(code: int, message: str) -> int:
    print(f"landlock-supervisor: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = _parser(_command_of(argv)).parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        from .check import main as check_main
        return check_main(args)
    if args.command == "denials":
        from .denied import main as denials_main
        return denials_main(args)
    if args.command == "learn":
        from .learn import command as learn_command
        return learn_command.main(args)
    if args.command == "run":
        _warn_foreign_imports()
        if args.manifests and args.socket:
            return _fail(EXIT_USAGE, "--manifests runs a private supervisor of its own: --socket does not apply")
        private = None
        if args.manifests:
            from . import private_boot
            try:   # (a fork: no thread runs yet, and none will before it)
                private = private_boot.fork(args.manifests, state_root=args.state_root, only=args.name,
                                            extra_args=["--allow-root-servers"] if args.allow_root_servers else [])
            except OSError as e:
                return _fail(1, f"cannot start a private supervisor: {e}")
        wakeup = _catch_signals()
    import json

    from . import client as clients
    from .paths import SocketPathError
    from .protocol import ProtocolError
    try:
        if args.command == "run":
            return _run(args, wakeup, private)
        reply = getattr(clients.Client(args.socket), args.command)()
    except SocketPathError as e:
        return _fail(EXIT_USAGE, str(e))
    except ProtocolError as e:   # (a peer that is no supervisor, or one of another version)
        return _fail(1, f"{_supervisor_of(args)} sent {e}")   # ("a malformed reply: what")
    except (OSError, TimeoutError, clients.SupervisorError) as e:
        return _fail(1, str(e))
    print(json.dumps(reply, indent=2, sort_keys=True))
    return 0


def _warn_foreign_imports() -> None:
    """One line when this process imports from its working directory or
    PYTHONPATH (`python -m supervisor`, PYTHONPATH set): whoever writes
    there runs code as the client, before any line of ours can drop it."""
    from .interpreter import foreign_here
    foreign = foreign_here()
    if foreign:
        from .denied import clean
        print(f"landlock-supervisor: warning: imports from the working directory or PYTHONPATH "
              f"({clean(', '.join(p or '.' for p in foreign))}): code there runs as this client; in an MCP "
              "client config start the landlock-supervisor command, without PYTHONPATH", file=sys.stderr, flush=True)


def _supervisor_of(args: argparse.Namespace) -> str:
    """Which supervisor a client command talked to, for its one line."""
    if getattr(args, "manifests", None):
        return "the private supervisor"
    from .paths import default_socket_path
    return f"the supervisor at {args.socket or default_socket_path()}"


def _serve(args: argparse.Namespace) -> int:
    import grp

    from .paths import check_fallback, check_length, default_socket_path, default_state_root
    try:
        gids = frozenset(int(g) if g.isdigit() else grp.getgrnam(g).gr_gid for g in args.allow_group)
    except KeyError as e:
        return _fail(EXIT_USAGE, f"--allow-group: no such group {e}")
    listen_fd = None
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and int(os.environ.get("LISTEN_FDS", "0")) >= 1:
        listen_fd = 3  # SD_LISTEN_FDS_START
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    from . import ids
    try:
        dynamic_uids = ids.parse_range(args.dynamic_uids, "--dynamic-uids")
        session_gids = ids.parse_range(args.session_gids, "--session-gids")
        if os.geteuid() == 0:
            ids.check_ranges(dynamic_uids, session_gids)
    except ids.IdError as e:
        return _fail(EXIT_USAGE, f"not starting: {e}")
    socket_path = args.socket
    if socket_path is None and listen_fd is None and args.control_fd is None:
        socket_path = default_socket_path()
    if socket_path is not None:
        try:
            check_length(socket_path)
            check_fallback(socket_path, create=True)
        except OSError as e:   # (SocketPathError among them)
            return _fail(EXIT_USAGE, str(e))
    numbers = {"--max-connections": args.max_connections, "--max-connections-per-uid": args.max_connections_per_uid,
               "--max-children": args.max_children, "--max-children-per-uid": args.max_children_per_uid}
    for option, value in numbers.items():
        if value < 1:
            return _fail(EXIT_USAGE, f"{option}: expected a positive number, got {value}")
    state_root = args.state_root or default_state_root()
    early = None
    if args.control_fd is not None:
        # A private supervisor: its zygote boots while the modules below import.
        from .early import prepare
        from .zygote import boot
        isolation = prepare(state_root)
        try:
            early = isolation, boot.launch()
        except OSError as e:
            raise SystemExit(f"landlock-supervisor: cannot start the zygote: {e}") from None
    from .manifest import ManifestError
    from .server import Config, Limits, Supervisor
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
        from .log import log
        from .provenance import warning
        line = warning()
        if line:
            log(line)
    try:
        supervisor = Supervisor(config, early)
    except (ManifestError, OSError) as e:
        if early is not None:
            early[1].abandon()
        return _fail(EXIT_USAGE, f"not starting: {e}")
    return supervisor.serve()


def _catch_signals() -> int:
    """`run`'s INT, TERM and HUP, caught from the start: one that comes while
    the spawn is under way (the child may already run) is forwarded once it
    is, not fatal to us. Returns the wakeup fd's read end (a byte a signal)."""
    import signal
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    return r


def _client_for(args: argparse.Namespace, private: Booting | None) -> Client:
    """--manifests: exactly those, in a private supervisor (never a running
    daemon's manifest of the same name, whose policy may differ; no socket
    involved, so a stale one cannot block it), spawned already. Otherwise
    the daemon."""
    from . import client as clients
    if private is not None:
        from .private import connect
        return connect(private)
    return clients.Client(args.socket)


# What every client's environment holds, and a shell's own: not worth a word when not passed.
_STANDARD_ENV = frozenset({"HOME", "PATH", "SHELL", "TERM", "USER", "LOGNAME", "LANG", "PWD", "SHLVL", "_",
                           "OLDPWD", "PS1", "COLUMNS", "LINES", "VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT",
                           # ours, the supervisor's (paths.py, ids.TABLE_ENV):
                           "LANDLOCK_SUPERVISOR_SOCKET", "LANDLOCK_SUPERVISOR_DYNAMIC_UIDS"})
_STANDARD_PREFIXES = ("LC_", "XDG_")
_NAMED = 3   # dropped variables named in the line; the rest counted (all of them with --verbose)


def _client_env(name: str, described: dict[str, Any], verbose: bool) -> dict[str, str]:
    """The variables of ours that the manifest takes from clients (an MCP
    client config's `env`: GITHUB_TOKEN...); the names of the others said on
    stderr, bar the standard ones and those the manifest reads from the
    supervisor's environment (its ${VAR}s, inherit_env): a secret dropped
    silently is a server that fails for no visible reason."""
    takes, uses = _names(described, "client_env"), _names(described, "uses", required=False)
    passed = {k: os.environ[k] for k in takes if k in os.environ}
    dropped = sorted(k for k in os.environ if k not in passed and k not in uses and k not in _STANDARD_ENV
                     and not k.startswith(_STANDARD_PREFIXES))
    if dropped:
        shown = dropped if verbose or len(dropped) <= _NAMED + 1 else dropped[:_NAMED]
        more = f" and {len(dropped) - len(shown)} more (run --verbose names them)" if len(shown) < len(dropped) else ""
        print(f"landlock-supervisor: not passed to {name} (not in its client_env): {', '.join(shown)}{more}",
              file=sys.stderr, flush=True)
    return passed


def _names(described: dict[str, Any], key: str, required: bool = True) -> list[str]:
    """A `described` reply's list of names; a reply without them is no supervisor's."""
    names = described.get(key, None if required else [])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        from .protocol import ProtocolError
        raise ProtocolError(f"a malformed reply: 'described' without its list of {key} names: "
                            f"{str(described)[:200]}")
    return names


def _cwd_for(args: list[str]) -> str | None:
    """Our cwd, when an argument is relative to it (`.`, `./x`, `../x`):
    the server runs in its manifest's cwd, and a project-scoped MCP config
    passing `.` means the client's. None otherwise (or if it was removed):
    the request is then as a supervisor without this field knows it."""
    from .protocol import relative_arg
    if not any(relative_arg(a) for a in args):
        return None
    try:
        return os.getcwd()
    except OSError:
        return None


def _tell_denied(name: str, child: Child, kept: Journal) -> None:
    """Each distinct denial into the session's journal, never on our stderr:
    the server writes there too, and could forge such lines. The first
    one's pointer (to what the supervisor said) is the one line we add."""
    if not child.denied or kept.failed:
        child.denied.clear()
        return
    from . import denied
    from .journal import JournalError
    try:
        while child.denied:
            kept.add(child.denied.popleft())
    except (OSError, JournalError) as e:
        child.denied.clear()
        kept.failed = str(e)
        print(denied.PREFIX + denied.clean(f"{name}: its denials cannot be kept for `denials --session`: {e}"),
              file=sys.stderr, flush=True)
        return
    if kept.lines == 1:
        print(denied.PREFIX + denied.clean(f"{name}: access denied; what and how to allow it: {_pointer(kept)}"),
              file=sys.stderr, flush=True)


def _pointer(kept: Journal) -> str:
    """The command that shows a session's denials, from its journal."""
    where = "" if kept.state_root == _default_state_root() else f" --state-root {kept.state_root}"
    return f"`landlock-supervisor denials --session {kept.id}{where}`"


def _default_state_root() -> str:
    from .paths import default_state_root
    return default_state_root()


def _tell_denials_summary(name: str, child: Child, status: int, kept: Journal) -> None:
    """What was denied in all (and where to read it); for a server that
    failed on its own where denials are not seen, why not and what to do."""
    from . import denied
    exited = child.exited or {}
    text = denied.summary(name, child.denial_counts or {}, child.denials)
    failed = exited.get("reason") == "exited" and status != 0
    if text is None and failed and child.denials.get("mode") == "off" and child.denials.get("reason"):
        text = f"{name} failed; its denials are not visible: {child.denials['reason']}"
    _tell_missing_count(name, child)
    if text is not None and kept.lines:
        try:
            kept.add({"event": "summary", "text": text})
        except OSError:
            pass   # the lines are there: said at the first
        text += f"; read them with {_pointer(kept)}"
    if text is not None:
        print(denied.PREFIX + denied.clean(text), file=sys.stderr, flush=True)
    for finding in exited.get("dac") or ():
        print(f"{denied.PREFIX}{name}: file permissions (not Landlock): {denied.clean(finding)}",
              file=sys.stderr, flush=True)


def _tell_missing_count(name: str, child: Child) -> None:
    """Where the kernel's count did not come (its `settled` says why): what
    was counted may fall short. The supervisor's words only: on stderr."""
    from . import denied
    why = (child.settled or {}).get("why")
    if why:
        print(denied.PREFIX + denied.clean(f"{name}: the kernel's count of its denials is missing: {why}"),
              file=sys.stderr, flush=True)


def _relay_until_exit(name: str, child: Child, r: int, relay: Relay, kept: Journal) -> dict[str, Any]:
    """The stdio relayed and signals forwarded until the `exited` event, which it returns."""
    while child.exited is None:
        ready, writable, _ = select.select([child.fileno(), r, *relay.readers()], relay.writers(), [])
        if r in ready:
            for number in os.read(r, 64):   # the wakeup fd: one byte a signal
                child.signal(number, wait=False)
        relay.handle(ready, writable)
        if child.fileno() in ready:
            child.poll()
            _tell_denied(name, child, kept)
    return child.exited


def _run(args: argparse.Namespace, r: int, private: Booting | None) -> int:
    """Spawn with our own stdio, forward INT/TERM/HUP (r: their wakeup fd),
    exit as the child did."""
    from . import client as clients
    from .errors import USAGE_CODES
    from .private import PrivateStartFailed
    from .protocol import ProtocolError
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    env = {name: os.environ[name] for name in args.env if name in os.environ}
    try:
        client = _client_for(args, private)
    except PrivateStartFailed as e:
        if e.status == EXIT_USAGE:
            return EXIT_USAGE  # it said why, in one line (a manifest error, say)
        return _fail(1, str(e))
    from .journal import Journal
    from .relay import Relay
    relay = Relay()
    kept = Journal(os.path.abspath(args.state_root) if args.state_root else _default_state_root())
    try:
        try:
            stdin, stdout, stderr = relay.child_fds
            env.update(_client_env(args.name, client.describe(args.name), args.verbose))
            child = client.spawn(args.name, extra, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
                                 cwd=_cwd_for(extra))
        except clients.NoSuchManifest as e:
            return _fail(EXIT_USAGE, str(e))
        except clients.ConfinementUnavailable as e:
            return _fail(EXIT_UNAVAILABLE, str(e))
        except clients.SpawnFailed as e:
            return _fail(EXIT_EXEC_FAILED, str(e))
        except ProtocolError as e:   # (a peer that is no supervisor, or one of another version)
            return _fail(1, f"{_supervisor_of(args)} sent {e}")
        except clients.SupervisorError as e:
            return _fail(EXIT_USAGE if e.code in USAGE_CODES else 1, str(e))
        finally:
            relay.started()
        try:
            exited = _relay_until_exit(args.name, child, r, relay, kept)
        except (OSError, clients.SupervisorError) as e:   # (killed, say): no exit status to give
            return _fail(1, f"{args.name}: lost {_supervisor_of(args)} while it ran: {e}")
        relay.drain()
        child.settle()   # the kernel's count, and any denial told after `exited`
        _tell_denied(args.name, child, kept)
        if exited.get("reason") == "shutdown":
            # Else a client sees a server gone with 143 and not a word.
            print(f"landlock-supervisor: {args.name} was stopped: the supervisor is shutting down",
                  file=sys.stderr, flush=True)
        status = clients.shell_status(exited)
        _tell_denials_summary(args.name, child, status, kept)
        return status
    finally:
        kept.close()
        relay.started()
        relay.drain(0)
        if hasattr(client, "close"):
            client.close()


if __name__ == "__main__":
    sys.exit(main())
