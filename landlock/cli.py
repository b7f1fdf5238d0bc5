"""landlock-exec: confine this process, then exec a command.

Flags follow landrun's (--ro, --rox, --rw, --rwx, --bind-tcp, --connect-tcp,
--best-effort, --unrestricted-*); failures use the seed's exit codes. --env
sets (NAME=VALUE) and --pass-env passes (NAME), as in the supervisor.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import enforce, gocompat
from .exits import EXIT_UNAVAILABLE, EXIT_USAGE
from .ruleset import LandlockUnavailable
from .spec import DEFAULT_SCOPES, LOG_FLAGS, Spec, SpecError, parse_limit

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import NoReturn


def _split(values: list[str]) -> list[str]:
    return [item for value in values for item in value.split(",") if item]


def _ports(values: list[str], flag: str) -> list[int]:
    try:
        return [int(p) for p in _split(values)]
    except ValueError:
        raise SpecError(f"{flag}: expected port numbers, got {','.join(values)!r}") from None


_DESCRIPTION = ("Confine this process with Landlock, rlimits and no_new_privs, then exec COMMAND. "
                "Paths may be directories or single files; lists are comma-separated; "
                "flags repeat. The target's environment is empty unless --env or --pass-env is given. "
                "The path flags keep landrun's names, which are not a manifest's classes: "
                "--ro is read_only_noexec (a manifest's read_only also executes: that is --rox), "
                "--rw is read_write_noexec, --rwx is read_write. A missing path is an error here "
                "unless --lax-paths; a manifest does the opposite: it skips one unless strict_paths: true.")
_EPILOG = ("Exit codes: 2 bad invocation or spec (a missing path, no rule at all), "
           "3 Landlock or a required feature unavailable, 4 not single-threaded, "
           "126 exec failed, 127 command not found.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="landlock-exec", usage="%(prog)s [options] [--] COMMAND [ARG...]",
                                description=_DESCRIPTION, epilog=_EPILOG)
    a = p.add_argument
    a("--ro", action="append", default=[], metavar="PATHS",
      help="read only, no execute (a manifest's read_only_noexec)")
    a("--rox", action="append", default=[], metavar="PATHS",
      help="read and execute (a manifest's read_only)")
    a("--rw", action="append", default=[], metavar="PATHS",
      help="read and write, no execute (a manifest's read_write_noexec)")
    a("--rwx", action="append", default=[], metavar="PATHS",
      help="read, write and execute (a manifest's read_write)")
    a("--unix", action="append", default=[], metavar="PATH",
      help="pathname Unix socket the command may connect to (enforced from ABI 9)")
    a("--bind-tcp", action="append", default=[], metavar="PORTS")
    a("--connect-tcp", action="append", default=[], metavar="PORTS")
    a("--bind-udp", action="append", default=[], metavar="PORTS", help="(ABI 10)")
    a("--connect-udp", action="append", default=[], metavar="PORTS", help="(ABI 10)")
    a("--env", action="append", default=[], metavar="NAME=VALUE",
      help="set NAME to VALUE (a bare NAME, passed, is deprecated: --pass-env)")
    a("--pass-env", action="append", default=[], metavar="NAME",
      help="pass NAME from this environment, if it is set")
    a("--best-effort", action="store_true",
      help="run even where Landlock is unavailable, saying so")
    a("--unrestricted-filesystem", action="store_true")
    a("--unrestricted-network", action="store_true")
    a("--require", action="append", default=[], metavar="FEATURES",
      help="features that must be enforced: refer, truncate, tcp, ioctl_dev, scopes, unix, udp, ...")
    a("--scope", action="append", metavar="SCOPE", choices=[*DEFAULT_SCOPES, "none"],
      help="IPC scopes (default: all); 'none' for none")
    a("--rlimit", action="append", default=[], metavar="NAME=VALUE",
      help="resource limit: NOFILE=1024, DATA=2GiB, CPU=60, or NAME=SOFT:HARD")
    a("--landlock-log", action="append", default=[], choices=sorted(LOG_FLAGS),
      help="audit log flags (ABI 7)")
    a("--keep-capabilities", action="store_true", help="as root: keep capabilities")
    a("--keep-session", action="store_true",
      help="stay in the terminal's session (allows TIOCSTI injection into it)")
    a("--allow-terminal", action="store_true",
      help="accept a terminal on stdio that no other session holds (a pty nobody made controlling): "
           "the command can adopt it and inject input into it (TIOCSCTTY, TIOCSTI)")
    a("--user", metavar="USER[:GROUP]", help="as root: run as this user (without it, as root with "
      "every capability dropped, which can still chmod root's files: see docs/security.md)")
    a("--lax-paths", action="store_true",
      help="skip missing paths instead of failing (what a manifest does unless strict_paths: true)")
    a("--max-abi", type=int, metavar="N", help="use at most Landlock ABI N (testing)")
    a("--report", action="store_true", help="print the Report as JSON to stderr before exec")
    a("--log-level", choices=["error", "info", "debug"],
      default=os.environ.get("LANDLOCK_EXEC_LOG_LEVEL", "error"))
    a("command", nargs=argparse.REMAINDER)
    return p


def _environment(sets: list[str], passes: list[str]) -> dict[str, str]:
    """--pass-env's names from here, then --env's values over them. A bare
    --env NAME still passes NAME, for one release, with one line saying so."""
    bare = [item for item in sets if "=" not in item]
    if bare:
        print(f"landlock-exec: warning: --env {bare[0]} is deprecated: use --pass-env {bare[0]} "
              "(--env takes NAME=VALUE)", file=sys.stderr)
    env = {name: os.environ[name] for name in [*passes, *bare] if name in os.environ}
    for name, _, value in (item.partition("=") for item in sets if "=" in item):
        env[name] = value
    return env


def _rlimits(items: list[str]) -> dict[str, tuple[int, int]]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--rlimit: expected NAME=VALUE, got {item!r}")
        soft, _, hard = value.partition(":")
        out[name] = (parse_limit(soft), parse_limit(hard or soft))
    return out


def spec_from_args(args: argparse.Namespace) -> Spec:
    user, _, group = (args.user or "").partition(":")
    scopes = DEFAULT_SCOPES if args.scope is None else tuple(s for s in args.scope if s != "none")
    spec = Spec.of(
        read_only_noexec=_split(args.ro), read_only=_split(args.rox),
        read_write_noexec=_split(args.rw), read_write=_split(args.rwx),
        connect_unix=_split(args.unix),
        bind_tcp=_ports(args.bind_tcp, "--bind-tcp"), connect_tcp=_ports(args.connect_tcp, "--connect-tcp"),
        bind_udp=_ports(args.bind_udp, "--bind-udp"), connect_udp=_ports(args.connect_udp, "--connect-udp"),
        scopes=scopes, unrestricted_filesystem=args.unrestricted_filesystem,
        unrestricted_network=args.unrestricted_network, rlimits=_rlimits(args.rlimit),
        require=_split(args.require), best_effort=args.best_effort, strict_paths=not args.lax_paths,
        log=args.landlock_log, user=user or None, group=group or None,
        keep_capabilities=args.keep_capabilities, max_abi=args.max_abi)
    if not spec.path_rules and not spec.unrestricted_filesystem:
        raise SpecError("no filesystem rule given: the command could not even be executed "
                        "(give --rox /usr,... or --unrestricted-filesystem)")
    return spec


# Flags that build a spec: with a spec in the environment they would be
# silently ignored, so they are refused.
_SPEC_FLAGS = ("ro", "rox", "rw", "rwx", "unix", "bind_tcp", "connect_tcp", "bind_udp",
               "connect_udp", "env", "pass_env", "best_effort", "unrestricted_filesystem",
               "unrestricted_network", "require", "scope", "rlimit", "landlock_log", "user",
               "keep_capabilities", "lax_paths", "max_abi")


def _spec_flags_given(args: argparse.Namespace) -> list[str]:
    return ["--" + name.replace("_", "-") for name in _SPEC_FLAGS
            if getattr(args, name) not in (None, False, [])]


def main(argv: list[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.print_usage(sys.stderr)
        enforce._fail(EXIT_USAGE, "no command given")
    try:
        spec, passed_env = gocompat.spec_from_environ(os.environ)
        if spec is None:
            spec, env = spec_from_args(args), _environment(args.env, args.pass_env)
        elif _spec_flags_given(args):
            raise SpecError(f"a spec in the environment and {', '.join(_spec_flags_given(args))} "
                            "together: use one")
        else:
            # A re-exec wrapper's caller built the target's environment.
            env = passed_env
    except SpecError as e:
        enforce._fail(EXIT_USAGE, str(e))
    except LandlockUnavailable as e:
        enforce._fail(EXIT_UNAVAILABLE, str(e))
    if args.log_level == "debug":
        print(f"landlock-exec: spec {spec.to_json()}", file=sys.stderr)
    enforce.exec_confined(spec, command, env, new_session=not args.keep_session,
                          print_report=args.report or args.log_level != "error",
                          allow_terminal=args.allow_terminal)


if __name__ == "__main__":
    main()
