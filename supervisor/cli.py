"""landlock-supervisor: serve, run, ping, list, stats, denials, check, learn."""
from __future__ import annotations

import argparse
import sys

from landlock.exits import EXIT_EXEC_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE

from . import run, serve
from .failure import talking, warn

# The rest is imported where used: a private supervisor is forked right
# after the arguments are parsed, and `run` imports its client beside it.


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
    "serve": ("run the fork-server", serve.add_arguments),
    "run": ("spawn NAME with this process's stdio and wait for it", run.add_arguments),
    "ping": ("is the supervisor there?", _no_arguments),
    "list": ("manifests and running children", _no_arguments),
    "stats": ("counters, fds, memory", _no_arguments),
    "denials": ("recent kernel denials (the supervisor's owner: all sessions'), or a `run` session's",
                _denials_arguments),
    "check": ("what each manifest really gets on this kernel", _check_arguments),
    "learn": ("learn a server's manifest from confined, traced runs of an MCP session", _learn_arguments),
}


# The commands that talk to a supervisor (serve: the one it is), and so take
# --socket after their name; before it, --socket is accepted for any (and
# ignored by the others, as a default the environment may give).
_CONNECTING = frozenset({"serve", "run", "ping", "list", "stats", "denials"})


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


_EXIT_STATUS = (f"Exit status: 0 done; 1 the environment or the supervisor failed; {EXIT_USAGE} usage or "
                f"input (arguments, manifests, a name not served); {EXIT_UNAVAILABLE} confinement unavailable; "
                f"{EXIT_EXEC_FAILED} the server could not be started; otherwise `run` exits as its server did "
                "and `learn` as its --help says. A failure is one line on stderr: what, and where.")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the arguments of `command` alone when it is
    one of ours: declaring all of them (learn's module included) took ~4 ms
    of every start, twice in private mode."""
    p = argparse.ArgumentParser(prog="landlock-supervisor", formatter_class=serve.HelpFormatter, epilog=_EXIT_STATUS,
                                description="A single-threaded fork-server that starts stdio servers "
                                            "confined by Landlock, with a client's own fds as their stdio.")
    socket_help = ("the supervisor's socket; default: $LANDLOCK_SUPERVISOR_SOCKET, /run/landlock-supervisor/socket "
                   "as root, else landlock-supervisor/socket in $XDG_RUNTIME_DIR or /run/user/UID")
    p.add_argument("--socket", metavar="PATH", help=socket_help)
    sub = p.add_subparsers(dest="command", required=True)
    everything = command not in _COMMANDS
    for name, (help_text, declare) in _COMMANDS.items():
        parser = sub.add_parser(name, help=help_text, formatter_class=serve.HelpFormatter)
        if everything or name == command:
            declare(parser)
        if name in _CONNECTING:
            parser.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help=socket_help)
        else:   # accepted and unused until now: said so, for one release
            parser.add_argument("--socket", metavar="PATH", dest="unused_socket", default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = _parser(_command_of(argv)).parse_args(argv)
    if hasattr(args, "unused_socket"):
        warn(f"{args.command} --socket is deprecated: {args.command} talks to no supervisor; give no --socket")
    if args.command == "serve":
        return serve.main(args)
    if args.command == "run":
        return run.main(args)
    if args.command == "check":
        from .check import main as check_main
        return check_main(args)
    if args.command == "denials":
        from .denied import main as denials_main
        return denials_main(args)
    if args.command == "learn":
        from .learn import command as learn_command
        return learn_command.main(args)
    import json

    from .client import sync as clients
    try:
        reply = getattr(clients.Client(args.socket), args.command)()
    except (OSError, TimeoutError, clients.SupervisorError) as e:
        return talking(args, e)
    print(json.dumps(reply, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
