"""`landlock-supervisor learn`: its options, checked into learner.Options, and the run that writes the manifest.

Imported to declare the command's arguments: what learning needs is
imported when it runs.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..failure import fail

if TYPE_CHECKING:
    from . import destination, learner


def add_arguments(learn: argparse.ArgumentParser) -> None:
    learn.description = ("Runs COMMAND under strace, confined by a learning policy, as the uid the supervisor "
                         "will give it, drives an MCP session, and writes a commented manifest validated by "
                         "confined runs of the same session. Exit 0: validated, every call answered; "
                         "4: written, not validated (a grant no run confirmed, or denials remained); "
                         "5: written, but a call of the last run failed (an error reply, isError, "
                         "no reply in time; before 4); 1: failed; 2: usage; 3: Landlock unavailable.")
    learn.add_argument("--name", help="the manifest's name (default: from the command)")
    learn.add_argument("--out", default="-", metavar="FILE", help="where to write the manifest (default: stdout)")
    learn.add_argument("--session", metavar="FILE",
                       help="JSON lines of requests ({\"method\": ..., \"params\": ...}) sent after initialize")
    learn.add_argument("--call", nargs=2, action="append", default=[], metavar=("TOOL", "JSON"),
                       help="call TOOL with these arguments (repeatable; after tools/list or the session)")
    learn.add_argument("--write", action="append", default=[], metavar="PATH",
                       help="a path the server may write while learning, granted if it does (repeatable)")
    learn.add_argument("--cwd", metavar="DIR", help="the server's working directory (default: its state directory)")
    learn.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="a variable the manifest sets (default HOME=${STATE_DIR} and TMPDIR=${STATE_DIR})")
    learn.add_argument("--inherit-env", action="append", default=[], metavar="NAME",
                       help="a variable the manifest takes from the supervisor's environment (PATH always)")
    learn.add_argument("--state-root", metavar="DIR",
                       help="the state root of the supervisor that will serve it (its area is copied for the runs)")
    learn.add_argument("--rounds", type=int, default=5, metavar="N", help="runs at most (default 5)")
    learn.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                       help="for each reply of the session, from the server's read of its request (default 60)")
    learn.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="for the server to read its first request: a first npx -y or uvx fetches its "
                            "packages meanwhile (default 300)")
    learn.add_argument("--allow-tool-errors", action="store_true",
                       help="a tool's error reply (isError, a JSON-RPC error) is no failure: for sessions that "
                            "call failing tools on purpose (no reply in time still is)")
    learn.add_argument("--keep", action="store_true", help="keep the scratch directory (traces, round manifests)")
    learn.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")


def main(args: argparse.Namespace) -> int:
    """The options checked, then the rounds (run)."""
    from ..manifests import refusal
    from . import exclude, learner
    from .session import SessionFileError, requests
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        return fail(learner.EXIT_USAGE, "learn: no command (learn [OPTIONS] -- COMMAND ARGS...)")
    if not 1 <= args.rounds <= 20 or args.timeout <= 0 or args.start_timeout <= 0:
        return fail(learner.EXIT_USAGE, "learn: --rounds is 1 to 20, --timeout and --start-timeout positive")
    try:
        env = dict(parse_env(args.env))
        lines = None
        if args.session:
            with open(args.session) as f:
                lines = f.read(1 << 22).splitlines()
        plan = requests([tuple(c) for c in args.call], lines, args.session or "--session")
    except learner.LearnError as e:
        return fail(e.code, f"learn: {e}")
    except (OSError, SessionFileError) as e:
        return fail(learner.EXIT_USAGE, f"learn: {e}")
    writes = []
    table = refusal.known(exclude.homes(None), ())
    for path in args.write:
        # What the user gives explicitly may be inside a home, never a home
        # (nor a directory holding one) or a location holding secrets: the
        # one refusal table, as for what learn proposes.
        real = os.path.realpath(path)
        why = refusal.why_not(real, table)
        if why:
            return fail(learner.EXIT_USAGE, f"learn: --write {path}: not granted to a server ({why})")
        writes.append(real)
    cwd = os.path.realpath(args.cwd) if args.cwd else None
    # Absolute, as --write and --cwd: learning excludes it, walking up from it to /.
    state_root = os.path.realpath(args.state_root) if args.state_root else None
    if cwd is not None and not os.path.isdir(cwd):
        return fail(learner.EXIT_USAGE, f"learn: --cwd {args.cwd}: not a directory")
    session_text = ", ".join(r["method"] + (f" {r['params'].get('name')}" if r["method"] == "tools/call" else "")
                             for r in plan)
    opts = learner.Options(command=command, name=args.name, out=args.out,
                           session=plan, session_text=session_text, writes=writes, cwd=cwd, env=env,
                           inherit_env=args.inherit_env, state_root=state_root, rounds=args.rounds,
                           timeout=args.timeout, start_timeout=args.start_timeout, keep=args.keep,
                           allow_tool_errors=args.allow_tool_errors)
    return run(opts)


def run(opts: learner.Options) -> int:
    """Learn, write the manifest, say how it went; the exit code."""
    from . import learner
    from .destination import Refused
    if not os.path.isfile(learner.STRACE):
        return fail(learner.EXIT_FAILED, f"learn needs strace ({learner.STRACE}): apt-get install strace")
    started = time.monotonic()
    try:
        # Before the first round: the server could make links from then on.
        where = None if opts.out == "-" else _destination(opts)
    except (Refused, OSError) as e:
        return fail(learner.EXIT_USAGE, f"learn: --out {opts.out}: {e}")
    try:
        one = learner.Learner(opts)
    except learner.LearnError as e:
        if where is not None:
            where.close()
        return fail(e.code, str(e))
    try:
        text, proposal, validated = one.learn()
        if where is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            _refuse_own_grant(one, where, text)
            where.write(text)
    except learner.runner.RunFailed as e:
        return fail(learner.EXIT_UNAVAILABLE if e.unavailable else learner.EXIT_FAILED, f"learn: {e}")
    except (learner.LearnError, OSError) as e:
        return fail(e.code if isinstance(e, learner.LearnError) else learner.EXIT_FAILED, f"learn: {e}")
    finally:
        one.close()
        if where is not None:
            where.close()
    for line in learner.report.summary(one, proposal, validated, time.monotonic() - started):
        print(line, file=sys.stderr)
    if opts.out != "-":
        print(f"  written: {opts.out}", file=sys.stderr)
    return learner.exit_code(one, proposal, validated)


def _destination(opts: learner.Options) -> destination.Destination:
    """--out's directory, opened; refused inside what the learning run may write."""
    from ..manifests.secrets import within
    from . import learner
    from .destination import Destination, Refused
    where = Destination(opts.out)
    # The innermost: the --write path that holds it says more than /tmp.
    grant = max((g for g in learner.learning_writes(opts) if within(where.path, g)), key=len, default=None)
    if grant is not None:
        where.close()
        raise Refused(f"lies inside {grant}, which the server may write while it is learnt "
                      "(it could rewrite the manifest, or plant links there): write it elsewhere")
    return where


def _refuse_own_grant(one: learner.Learner, where: destination.Destination, text: str) -> None:
    """The learnt manifest, loaded as `serve` will load it, must not let its
    server write where it is kept (the next load would take its policy)."""
    from ..manifests import manifest as manifests
    from . import learner
    path = os.path.join(one.private, "learnt.yaml")   # learn's own directory (0700)
    with open(path, "w") as f:
        f.write(text)
    try:
        held = manifests.writable_holding(where.path, [manifests.load(path, state_root=one.real_state_root)])
    except manifests.ManifestError as e:
        raise learner.LearnError(f"the learnt manifest does not load: {e}") from None
    if held is not None:
        raise learner.LearnError(f"--out {where.path}: lies inside {held[1]}, which the learnt manifest lets "
                                 "its server write (it could rewrite its own manifest): not written; "
                                 "write it elsewhere", learner.EXIT_USAGE)


def parse_env(pairs: Sequence[str]) -> Mapping[str, str]:
    from . import learner
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise learner.LearnError(f"--env: expected NAME=VALUE, got {pair!r}", learner.EXIT_USAGE)
        out[key] = value
    return out
