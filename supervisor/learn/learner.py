"""Learning a manifest: a server command -> a manifest that works, in bounded rounds (learn/command runs it).

Round 1 runs the server under strace, confined by a learning policy (read
and execute everything but the excluded paths; write its scratch state
directory, /tmp and the --write paths; network as its profile), as the uid
the supervisor will give it. The accesses, with the files the kernel
executes inside execve, collapse into a proposal. Each later round runs the
proposal itself, traced, and adds what was denied, until a run adds
nothing; none follows a run whose call got no reply in time (its denials
are held: listed, not granted). What the last round added is marked as no
run's (report.py). The scratch directory is removed at the end.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from landlock.exits import EXIT_UNAVAILABLE, EXIT_USAGE

from ..manifests import ids, profiles
from ..client.paths import default_state_root
from . import collapse as collapsing
from . import area, exclude, execs, render, report, runner
from .collapse import Layout, Proposal
from .trace import EXEC, STRACE, Access, strace_argv

EXIT_OK, EXIT_FAILED, EXIT_NOT_VALIDATED, EXIT_CALL_FAILED = 0, 1, 4, 5   # and the seed's EXIT_USAGE, EXIT_UNAVAILABLE
PROFILE_PORTS = {"npx": (443,), "uvx": (443,)}
SCRATCH_PARENT = "/var/tmp"   # not under /tmp, which the learning run may write


class LearnError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Options:
    command: list[str]
    name: str | None = None
    out: str = "-"
    session: list[dict[str, Any]] = field(default_factory=list)
    session_text: str = "initialize, tools/list"
    writes: list[str] = field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    inherit_env: list[str] = field(default_factory=list)
    state_root: str | None = None
    rounds: int = 5
    timeout: float = 60.0
    start_timeout: float = 300.0   # for the server to read its first request (packages fetched)
    keep: bool = False
    allow_tool_errors: bool = False   # a tool's error reply (isError, a JSON-RPC error) is no failure


def name_for(command: Sequence[str]) -> str:
    """A manifest name from the command: the package an npx/uvx runs, else the program's."""
    program = os.path.basename(command[0])
    words = [w for w in command[1:] if not w.startswith("-")]
    if program in ("npx", "uvx") and words:
        if program == "uvx" and "--from" in command:
            words = [command[command.index("--from") + 1]]
        program = re.sub(r"(?<=.)@.*$|[=<>~!].*$", "", words[0]).rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", program).strip("-._")[:64]
    return name or "server"


def profiles_for(command: str) -> tuple[str, ...]:
    """The profiles a command's kind needs from its first run on."""
    base = os.path.basename(command)
    interpreter = os.path.basename(execs.shebang(command)[-1]) if execs.shebang(command) else ""
    if base == "npx":
        return ("system", "npx")
    if base in ("uvx", "uv"):
        return ("system", "uvx")
    if "node" in (base, interpreter) or base == "nodejs":
        return ("system", "node")
    if base.startswith("python") or interpreter.startswith("python"):
        return ("system", "python")
    return ("system",)


def _profile_notes() -> dict[str, str]:
    return {name: (fn.__doc__ or "").split(";")[0].split(". ")[0].rstrip(".") for name, fn in
            profiles.PROFILES.items()}


class Learner:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.root = os.geteuid() == 0
        env_path = opts.env.get("PATH") or os.environ.get("PATH", os.defpath)
        found = shutil.which(opts.command[0], path=env_path) if "/" not in opts.command[0] else opts.command[0]
        if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise LearnError(f"{opts.command[0]}: not an executable file (PATH {env_path})", EXIT_USAGE)
        self.command = os.path.abspath(found)
        self.name = opts.name or name_for(opts.command)
        self.profiles = profiles_for(self.command)
        env = {"HOME": "${STATE_DIR}", "TMPDIR": "${STATE_DIR}", **opts.env}   # no temporary name in /tmp
        inherit = tuple(dict.fromkeys(["PATH", *opts.inherit_env]))
        self.draft = render.Draft(self.name, self.command, tuple(map(absolute_arg, opts.command[1:])), opts.cwd,
                                  env, inherit,
                                  dynamic=self.root, uid=None if self.root else os.getuid())
        self.real_state_root = opts.state_root or default_state_root()
        self.scratch = tempfile.mkdtemp(prefix="landlock-learn-", dir=SCRATCH_PARENT)
        os.chmod(self.scratch, 0o755)   # the dynamic user walks through to its state directory
        self.state_root = os.path.join(self.scratch, "state")
        self.private = os.path.join(self.scratch, "private")
        os.mkdir(self.private, 0o700)
        self.area = os.path.join(self.state_root, "servers", self.name)
        self.state_dir = os.path.join(self.area, "state")
        try:
            self.uid, self.gids = self._identity()
        except OSError as e:   # (the server's area: too large, unreadable): one line, no scratch left
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise LearnError(f"{self.name}: its state cannot be copied for learning: {e}") from None
        self.accesses: list[Access] = []
        self.rounds: list[report.Round] = []
        self.held: list[Access] = []        # the denials of a run a call timed out in: listed, not granted
        self.would: Proposal | None = None  # the proposal with them: the lines that would allow them
        self._current_trace = ""

    # -- set-up ---------------------------------------------------------------

    def _identity(self) -> tuple[int, tuple[int, ...]]:
        """The uid the server runs as: as root, its dynamic uid, taken in the
        host's table under the real state root (where `serve` will find it;
        the scratch supervisor takes it there too: `--dynamic-uids-of`), so
        that the files written while learning are that server's."""
        uid = ids.Table(self.real_state_root).assign([self.name])[self.name] if self.root else os.getuid()
        real_area = os.path.join(self.real_state_root, "servers", self.name)
        os.makedirs(os.path.dirname(self.area), exist_ok=True)
        if not area.copy(real_area, self.area, uid):   # no link followed: the server may write in it
            os.mkdir(self.area, 0o700)
        if not os.path.lexists(self.state_dir):
            os.mkdir(self.state_dir, 0o700)   # else the area looks like the old layout, and is moved
        if not self.root:
            return uid, tuple(os.getgroups())
        return uid, (uid,)

    def child_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.draft.inherit_env if k in os.environ}
        env.update({k: v.replace("${STATE_DIR}", self.state_dir) for k, v in self.draft.env.items()})
        return env

    def fragments(self) -> dict[str, profiles.Fragment]:
        """What each profile would give this server (during the runs)."""
        ctx = profiles.Context(env=self.child_env(), state_dir=self.state_dir, command=self.command,
                               area=self.area, given=frozenset(self.draft.env) | set(self.draft.inherit_env))
        out = {}
        for name, fn in profiles.PROFILES.items():
            try:
                out[name] = fn(ctx)
            except ValueError:
                continue
        return out

    def layout(self) -> Layout:
        home = exclude.own_home()
        fragments = self.fragments()
        projects = [a for a in self.draft.args if a.startswith("/") and os.path.isdir(a)]
        projects += [p for p in (self.opts.cwd, *self.opts.writes) if p]
        excluded = exclude.excluded(home, projects, {self.real_state_root, default_state_root()})
        homes = tuple(exclude.homes(None))
        return Layout(cwd=self.opts.cwd or self.state_dir, state_dir=self.state_dir, area=self.area,
                      scratch=self.scratch, home=home, writable=tuple(self.opts.writes),
                      write_files=tuple(w for w in self.opts.writes if os.path.isfile(w)),
                      excluded=tuple(excluded), homes=homes, chosen=self.profiles,
                      fragments={name: {cls: list(paths) for cls, paths in f.paths.items()}
                                 for name, f in fragments.items()},
                      quiet=tuple(q for name in self.profiles if name in fragments for q in fragments[name].quiet),
                      package_roots=(), ports=self._ports())

    def _ports(self) -> tuple[int, ...]:
        return tuple(p for name in self.profiles for p in PROFILE_PORTS.get(name, ()))

    def trace_dir(self, number: int) -> str:
        """A directory strace (as the server's uid) writes. Made and chowned
        in the scratch directory, root's 0755, which no server can write:
        the name cannot have been swapped (the chown goes through its fd all the same)."""
        path = os.path.join(self.scratch, f"trace-{number}")
        os.mkdir(path, 0o700)
        if self.root:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchown(fd, self.uid, self.uid)
            finally:
                os.close(fd)
        return path

    # -- the runs -------------------------------------------------------------

    def _run(self, number: int, text: str) -> runner.Run:
        manifest = os.path.join(self.private, f"round-{number}.yaml")
        with open(manifest, "w") as f:
            f.write(text)
        cwd = self.opts.cwd or self.state_dir
        return runner.run(manifest, self.name, self.state_root, self.opts.session, timeout=self.opts.timeout,
                          start_timeout=self.opts.start_timeout,
                          trace_dir=self._current_trace, cwd=cwd,
                          stderr_path=os.path.join(self.private, f"round-{number}.stderr"),
                          uid=self.uid, gids=self.gids, dynamic_uids_of=self.real_state_root if self.root else None)

    def learning_manifest(self, trace: str, layout: Layout) -> str:
        """Round 1's: the learning policy, the command under strace."""
        covering = exclude.covering_set([e.path for e in layout.excluded])
        writable = [*learning_writes(self.opts), trace]
        lines = render.top(self.draft, STRACE, strace_argv(os.path.join(trace, "t"),
                                                           [self.command, *self.draft.args])[1:])
        lines += ["sandbox:", f"  profiles: [{', '.join(self.profiles)}]", "  read_only:"]
        lines += [f"    - {render.q(p)}" for p in covering]
        lines += ["  read_write_noexec:"] + [f"    - {render.q(p)}" for p in writable]
        ports = self._ports()
        if ports:
            lines += ["  network:", f"    connect_tcp: [{', '.join(map(str, ports))}]"]
        return "\n".join(lines) + "\n"

    def traced_variant(self, proposal: Proposal, trace: str, layout: Layout) -> str:
        """A proposal run under strace: strace and its libraries, the trace
        directory, and what the profiles give the real command (the
        variant's command is strace) are added, for this run only."""
        extra: dict[str, list[str]] = {"read_only": [STRACE, *runner.strace_libraries()], "read_write_noexec": [trace]}
        for name in proposal.profiles:
            for cls, paths in layout.fragments.get(name, {}).items():
                extra.setdefault(cls, []).extend(paths)
        lines = render.top(self.draft, STRACE, strace_argv(os.path.join(trace, "t"),
                                                           [self.command, *self.draft.args])[1:])
        lines += render.sandbox(proposal, extra)
        lines.append("  log: [new_exec_on]   # each denial, where the supervisor reads audit records")
        return "\n".join(lines) + "\n"

    def observed(self, run: runner.Run, only_denied: bool, round_number: int) -> list[Access]:
        """A run's accesses (or its denials), resolved to the files Landlock
        sees, with the files the kernel executed for each exec."""
        found = (list(dict.fromkeys(runner.strace_denials(run) + runner.audit_denials(run))) if only_denied
                 else runner.accesses(run))
        env = self.child_env()
        resolved: dict[str, str] = {}

        def real(path: str) -> str:
            if path not in resolved:
                resolved[path] = os.path.realpath(path) if path else path
            return resolved[path]

        out = []
        chained: set[str] = set()
        for a in found:
            a = replace(a, path=real(a.path), evidence=a.evidence + (f", round {round_number}" if only_denied
                                                                      else ""))
            out.append(a)
            if a.kind == EXEC and a.path not in chained:
                chained.add(a.path)
                out += [Access(EXEC, real(p), denied=a.denied, evidence=why, program=a.program) for p, why in
                        execs.chain(a.path, env)]
        return out

    # -- the rounds -----------------------------------------------------------

    def learn(self) -> tuple[str, Proposal, bool]:
        """The rounds, and what the last one added marked as no run's."""
        layout = self.layout()
        proposal, tested = self._validations(self._learning_run(layout), layout)
        proposal.untested = proposal.keys() - (tested.keys() if tested else set())
        self.would = collapsing.collapse(self.accesses + self.held, layout)   # the lines that would allow
        validated = (tested is not None and not proposal.untested and not self.held
                     and len(self.rounds[-1].run.outcomes) == len(self.opts.session))
        return self.text(proposal, layout, validated), proposal, validated

    def _learning_run(self, layout: Layout) -> Proposal:
        self._current_trace = self.trace_dir(1)
        first = self._run(1, self.learning_manifest(self._current_trace, layout))
        if not first.outcomes or not first.outcomes[0].ok:
            raise LearnError(f"the server did not answer initialize under the learning policy "
                             f"({report.outcomes_text(first.outcomes)}); its stderr ends with:\n"
                             f"{first.stderr.strip()}")
        seen = self.observed(first, False, 1)
        self.accesses = seen
        if report.timed_out(first):   # no round after it: its denials are held, listed, not granted
            self.accesses = [a for a in seen if not a.denied]
            self.held = [a for a in seen if a.denied]
        self.rounds.append(report.Round("learning run", first, []))
        return collapsing.collapse(self.accesses, layout)

    def _validations(self, proposal: Proposal, layout: Layout) -> tuple[Proposal, Proposal | None]:
        """Each round runs the proposal and adds its denials, until one adds
        nothing; none after a run whose call got no reply in time. The last
        proposal, and the one the last run ran (None: no run did)."""
        tested: Proposal | None = None
        for number in range(2, self.opts.rounds + 1):
            if report.timed_out(self.rounds[-1].run):
                break
            self._current_trace = self.trace_dir(number)
            run = self._run(number, self.traced_variant(proposal, self._current_trace, layout))
            denials = self.observed(run, True, number)
            # (The reads left out as optional are denied, harmlessly: not counted.)
            self.rounds.append(report.Round("validation run", run,
                                            [d for d in denials if collapsing.optional(d, layout) is None]))
            tested = proposal
            if report.timed_out(run):
                self.held = self.rounds[-1].denials
                break
            self.accesses += denials
            proposal = collapsing.collapse(self.accesses, layout)
            if proposal.keys() == tested.keys():
                break
        return proposal, tested

    def text(self, proposal: Proposal, layout: Layout, validated: bool) -> str:
        runs = len(self.rounds)
        header = [f"{self.name}: learned by `landlock-supervisor learn` ({runs} run{'s' * (runs != 1)}; "
                  f"{report.verdict(self, validated)}).",
                  f"Command: {' '.join(self.opts.command)}",
                  f"Session: {self.opts.session_text}.",
                  "A trace sees only the paths this session took: review each grant, and learn again",
                  "with more --call (or a --session file) if the server does more in real use.", ""]
        header[1:1] = report.failed_calls_header(self)
        return render.manifest(self.draft, proposal, header, _profile_notes())

    def close(self) -> None:
        if not self.opts.keep:
            shutil.rmtree(self.scratch, ignore_errors=True)


def learning_writes(opts: Options) -> list[str]:
    """What the learning run may write besides learn's scratch (its state, the traces)."""
    return ["/tmp", *opts.writes]


def absolute_arg(arg: str) -> str:
    """An argument naming an existing path relative to where learn runs
    (`dist/index.js`, `.`), made absolute: the server starts in its state
    directory, and the manifest must mean what the command line meant."""
    if arg.startswith(("/", "-")) or not os.path.exists(arg):
        return arg
    return os.path.abspath(arg)


def exit_code(learner: Learner, proposal: Proposal, validated: bool) -> int:
    """5: a call failed in the last run (the manifest may lack what it needed); 4: not validated; 0."""
    if report.failures(learner.rounds[-1].run, learner.opts.allow_tool_errors):
        return EXIT_CALL_FAILED
    return EXIT_OK if validated else EXIT_NOT_VALIDATED
