"""`run NAME`: a server spawned with this process's stdio (or pipes relayed
to a terminal), or on pipes relayed to it where the manifest keeps warm
servers (one may serve it); signals forwarded, its denials kept, its exit
status ours."""
from __future__ import annotations

import argparse
import os
import select
import signal
import sys

from landlock.exits import EXIT_EXEC_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE

from .failure import fail, supervisor_of, talking, warn
from .serve import ROOT_HELP
from .stdio import OwnLines, keep_stdio_open

# The rest is imported where used: a private supervisor is forked first.
TYPE_CHECKING = False   # (typing's own, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any

    from .client.sync import Child, Client
    from .client.journal import Journal
    from .client.private_boot import Booting
    from .client.relay import Relay


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--manifests", action="append", default=[], metavar="PATH",
                     help="with no supervisor running, start a private one with these")
    run.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                     help="pass NAME from this environment (the manifest must list it in client_env)")
    run.add_argument("--env", action="append", default=[], metavar="NAME",
                     help="deprecated: --pass-env (an --env of learn or landlock-exec sets NAME=VALUE)")
    run.add_argument("--state-root", metavar="DIR")
    run.add_argument("--verbose", action="store_true",
                     help="name every variable of this environment not passed to the server (else a few)")
    run.add_argument("--allow-root-servers", action="store_true",
                     help="for the private supervisor of --manifests: " + ROOT_HELP)
    run.add_argument("name")
    run.add_argument("args", nargs=argparse.REMAINDER)


def main(args: argparse.Namespace) -> int:
    """Spawn NAME with our stdio (in a private supervisor of --manifests,
    forked before any thread), wait for it, exit as it did."""
    keep_stdio_open()   # (before any fd of ours: the wakeup pipe, the socket)
    sys.stderr = OwnLines(sys.stderr)  # type: ignore[assignment]
    _warn_foreign_imports()
    if args.env:   # the old spelling, for one release
        warn(f"run --env {args.env[0]} is deprecated: use run --pass-env {args.env[0]}")
        args.pass_env += args.env
    if args.manifests and args.socket:
        return fail(EXIT_USAGE, "--manifests runs a private supervisor of its own: --socket does not apply")
    private = None
    if args.manifests:
        from .client import private_boot
        try:   # (a fork: no thread runs yet, and none will before it)
            private = private_boot.fork(args.manifests, state_root=args.state_root, only=args.name,
                                        extra_args=["--allow-root-servers"] if args.allow_root_servers else [])
        except OSError as e:
            return fail(1, f"cannot start a private supervisor: {e}")
    wakeup = _catch_signals()
    from .errors import SupervisorError
    try:
        return _run(args, wakeup, private)
    except (OSError, TimeoutError, SupervisorError) as e:
        return talking(args, e)


def _warn_foreign_imports() -> None:
    """One line when this process imports from its working directory or
    PYTHONPATH (`python -m supervisor`, PYTHONPATH set): whoever writes
    there runs code as the client, before any line of ours can drop it."""
    from .client.interpreter import foreign_here
    foreign = foreign_here()
    if foreign:
        from .denied import clean
        print(f"landlock-supervisor: warning: imports from the working directory or PYTHONPATH "
              f"({clean(', '.join(p or '.' for p in foreign))}): code there runs as this client; in an MCP "
              "client config start the landlock-supervisor command, without PYTHONPATH", file=sys.stderr, flush=True)


def _catch_signals() -> int:
    """`run`'s INT, TERM and HUP, caught from the start: one that comes while
    the spawn is under way (the child may already run) is forwarded once it
    is, not fatal to us. Returns the wakeup fd's read end (a byte a signal)."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    return r


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
    from .client.journal import JournalError
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
    from .client.paths import default_state_root
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


def _relay_until_exit(name: str, child: Child, r: int, relay: Relay,
                      kept: Journal) -> tuple[dict[str, Any] | None, bool]:
    """The stdio relayed and signals forwarded until the `exited` event:
    it, or None if our stdout's reader went away first; and whether a
    signal was forwarded."""
    signalled = False
    while child.exited is None:
        ready, writable, _ = select.select([child.fileno(), r, *relay.readers()], relay.writers(), [])
        if r in ready:
            for number in os.read(r, 64):   # the wakeup fd: one byte a signal
                child.signal(number, wait=False)
                signalled = True
        relay.handle(ready, writable)
        if relay.reader_gone:
            return None, signalled
        if child.fileno() in ready:
            child.poll()
            _tell_denied(name, child, kept)
    return child.exited, signalled


def _on_pipes(described: dict[str, Any], extra: list[str], env: dict[str, str]) -> bool:
    """Ask for a session on pipes (relayed here) only where a warm server
    may serve it: the manifest keeps some and the request carries nothing
    of the client's (warm.unfit). Else our own fds, as ever: no copy
    through this process (docs/performance.md, "Warm servers")."""
    warm = described.get("warm", 0)   # (0 from a supervisor older than the field)
    return isinstance(warm, int) and warm > 0 and not extra and not env


def _spawn(client: Client, args: argparse.Namespace, extra: list[str], env: dict[str, str],
           relay: Relay) -> Child:
    """The spawn, on pipes taken into the relay or with the relay's child_fds."""
    described = client.describe(args.name)
    env.update(_client_env(args.name, described, args.verbose))
    if not _on_pipes(described, extra, env):
        relay.terminals()
        stdin, stdout, stderr = relay.child_fds
        return client.spawn(args.name, extra, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
                            cwd=_cwd_for(extra))
    child = client.spawn(args.name, stdio="pipes")
    pipes = (child.stdin, child.stdout, child.stderr)
    child.stdin = child.stdout = child.stderr = None
    fds = []
    for pipe in pipes:   # the relay's alone: no second holder once this returns
        assert pipe is not None
        fds.append(os.dup(pipe.fileno()))
        pipe.close()
    relay.take(*fds)
    return child


def _run(args: argparse.Namespace, r: int, private: Booting | None) -> int:
    """Spawn with our own stdio, forward INT/TERM/HUP (r: their wakeup fd),
    exit as the child did."""
    from .client import sync as clients
    from .errors import USAGE_CODES
    from .protocol import ProtocolError
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    env = {name: os.environ[name] for name in args.pass_env if name in os.environ}
    if private is None:
        client = clients.Client(args.socket)
    else:
        # --manifests: exactly those, in a private supervisor (never a running
        # daemon's manifest of the same name, whose policy may differ; no socket
        # involved, so a stale one cannot block it), spawned already. (Its
        # module, with socket.py's, only here: the daemon's `run` needs neither.)
        from .client.private import PrivateStartFailed, connect
        try:
            client = connect(private)
        except PrivateStartFailed as e:
            if e.status == EXIT_USAGE:
                return EXIT_USAGE  # it said why, in one line (a manifest error, say)
            return fail(1, str(e))
    from .client.journal import Journal
    from .client.relay import Relay
    relay = Relay()
    kept = Journal(os.path.abspath(args.state_root) if args.state_root else _default_state_root())
    try:
        try:
            child = _spawn(client, args, extra, env, relay)
        except clients.NoSuchManifest as e:
            return fail(EXIT_USAGE, str(e))
        except clients.ConfinementUnavailable as e:
            return fail(EXIT_UNAVAILABLE, str(e))
        except clients.SpawnFailed as e:
            return fail(EXIT_EXEC_FAILED, str(e))
        except ProtocolError as e:   # (a peer that is no supervisor, or one of another version)
            return fail(1, f"{supervisor_of(args)} sent {e}")
        except clients.SupervisorError as e:
            return fail(EXIT_USAGE if e.code in USAGE_CODES else 1, str(e))
        finally:
            relay.started()
        try:
            exited, signalled = _relay_until_exit(args.name, child, r, relay, kept)
        except (OSError, clients.SupervisorError) as e:   # (killed, say): no exit status to give
            return fail(1, f"{args.name}: lost {supervisor_of(args)} while it ran: {e}")
        if exited is None:
            # Our reader is gone: as if we had died of SIGPIPE, a disconnect
            # (the supervisor ends the server as its on_disconnect says).
            return 128 + signal.SIGPIPE
        # A client that signalled us may wait for our exit without reading (terminate(), then wait()).
        relay.drain(r, patient=not signalled)
        # The kernel's count, and any denial told after `exited`; a signal
        # to us (forwarded or not) ends the wait: our client wants our exit.
        child.settle(wakeup=r)
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
        relay.close()
        if hasattr(client, "close"):
            client.close()
