"""README.md's commands run as written, after the two commands (./scripts/demo
or ./scripts/test: this checkout is set up, the servers installed), as root
and as a plain uid, from the checkout, in a shell.

Every ```sh and ```python block is found; each line is run unless NOT_RUN
says why not (a placeholder, the two commands themselves, a stage of its
own), and every NOT_RUN entry must still be in the README. The client
configurations (```json) are tests/e2e/clients/test_readme.py's. Lines that
fetch from a registry (npx, uvx) run in the `network` group. Time bounds,
the test's own: after `... &` the shell waits for the supervisor to answer;
`run` gets /dev/null as its stdin (the server reads its end and exits);
`denials --follow` is cut after a few seconds. The paths of the README's
example install (/opt/landlock-supervisor) are this checkout. Three things
keep the host's own apart: HOME is the test's (root's is not /root, which
its servers' uids could not enter: the README says so), the supervisor's
socket is given by LANDLOCK_SUPERVISOR_SOCKET, and root's state root
(/var/lib/landlock-supervisor) is the test's, bound over the host's in a
mount namespace of the shell's.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from supervisor.client.paths import ROOT_STATE
from supervisor.manifests import ids

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "clients"))
from clienthelpers import free_uid  # noqa: E402
from e2ehelpers import REPO, servers_problem  # noqa: E402

README = REPO / "README.md"
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)

# What is not run, and why (each must still be in the README).
NOT_RUN = {
    "./scripts/demo": "one of the two commands: done before this test",
    "./scripts/test": "one of the two commands: this suite itself",
    "npx -y some-mcp-server": "a placeholder for the reader's own server",
    "scripts/multikernel": "the kernel matrix: a stage of its own (.ci/run), minutes of downloads and builds",
}
_TRAILING_COMMENT = re.compile(r"\s{2,}#.*$")   # (the README's are set off by two spaces or more)
NETWORK = re.compile(r"(^|\s)(npx|uvx)\s")
FOLLOW_FOR = 4   # seconds of `denials --follow`
CUT = 124        # timeout(1)'s status for a command it cut


def blocks() -> list[tuple[str, list[str]]]:
    """(language, commands) of each sh and python block; a shell line's
    continuations joined, comments and blank lines left out."""
    out = []
    for indent, lang, body in _FENCE.findall(README.read_text()):
        lines = [line[len(indent):] for line in body.splitlines()]
        if lang == "python":
            out.append((lang, ["\n".join(lines)]))
        elif lang == "sh":
            out.append((lang, _commands(lines)))
    return out


def _commands(lines: list[str]) -> list[str]:
    commands, current = [], ""
    for line in lines:
        line = _TRAILING_COMMENT.sub("", line)
        current += line.strip() if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            commands.append(current)
        current = ""
    return commands


def _skipped(command: str) -> bool:
    return any(marker in command for marker in NOT_RUN)


def shell_lines(network: bool) -> list[str]:
    """The lines to run, of the blocks with (or without) a line that fetches
    from a registry: a block's lines need each other (learn, then run)."""
    return [c for lang, cs in blocks() if lang == "sh" and any(NETWORK.search(c) and not _skipped(c) for c in cs) == network
            for c in cs if not _skipped(c)]


def _use() -> list[str]:
    """The Use section's lines (the block with `serve ... &`), run from the checkout."""
    use = next(cs for lang, cs in blocks() if lang == "sh" and any(c.rstrip().endswith("&") for c in cs))
    return [c for c in use if not _skipped(c)]


def _use_prelude() -> list[str]:
    """The Use section's lines up to and with `serve ... &`: what the others need."""
    use = _use()
    return use[:next(i for i, c in enumerate(use) if c.rstrip().endswith("&")) + 1]


def test_readme_blocks_are_all_accounted_for() -> None:
    text = README.read_text()
    missing = [marker for marker in NOT_RUN if marker not in text]
    assert not missing, f"NOT_RUN names what the README no longer has: {missing}"
    assert shell_lines(False) and shell_lines(True)
    assert [lang for lang, _ in blocks()].count("python") >= 1


# ---- the shell ------------------------------------------------------------------------------

def _bounded(command: str, index: int) -> str:
    """The command as written, with the test's time bound, then its status to fd 3."""
    line = command.rstrip()
    if line.endswith("&"):
        return (f"{line}\nfor _ in $(seq 150); do landlock-supervisor ping >/dev/null 2>&1 && break; sleep 0.1; "
                f"done\necho '{index} 0' >&3")
    if "--follow" in line:
        line = f"timeout {FOLLOW_FOR} {line}"
    elif re.search(r"landlock-supervisor( --\S+ \S+)* run ", line):
        line = f"{line} </dev/null"
    return f"{line}\necho \"{index} $?\" >&3"


def _localized(command: str) -> str:
    return command.replace("/opt/landlock-supervisor", str(REPO))


class Shell:
    """A shell in the checkout as root or a plain uid, with a home of its own."""

    def __init__(self, uid: int, base: Path) -> None:
        self.uid, self.home, self.state, self.output = uid, base / "home", base / "state", base / "output"
        # A plain user's home is its own (0700: its servers run as itself); root's here is
        # traversable, as the README asks of a root's MCP_PROJECTS (its servers run as uids of their own).
        self.home.mkdir(mode=0o755 if uid == 0 else 0o700)
        self.socket = base / "run" / "socket"
        self.socket.parent.mkdir(mode=0o700)
        self.state.mkdir(mode=0o755)
        if uid:
            for p in (self.home, self.socket.parent):
                os.chown(p, uid, uid)

    def env(self) -> dict[str, str]:
        user = "root" if self.uid == 0 else f"llsv-readme-{self.uid}"
        return {"HOME": str(self.home), "USER": user, "LOGNAME": user, "SHELL": "/bin/bash", "TERM": "dumb",
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANDLOCK_SUPERVISOR_SOCKET": str(self.socket),
                # The suite's uid table (tests/conftest.py), never the host's for good.
                ids.TABLE_ENV: os.environ[ids.TABLE_ENV]}

    def start(self, commands: list[str], niced: bool = False) -> subprocess.Popen[bytes]:
        """The shell running the commands, each with its status to fd 3,
        what it writes to a file (nothing waits on a full pipe)."""
        body = "\n".join(_bounded(c, i) for i, c in enumerate(commands))
        script = f"exec 3>{self.home / 'status'}\n{body}\nkill %1 2>/dev/null; wait\n"
        argv = ["bash", "-c", script]
        if self.uid == 0:
            # Root's supervisors keep their state in /var/lib/landlock-supervisor: the host's,
            # whose servers' uids are the host table's, not the suite's. Here it is the test's
            # own, bound over it in a mount namespace of the shell's (no user namespace);
            # the mount's target made if missing (an empty directory, root's 0755).
            os.makedirs(ROOT_STATE, mode=0o755, exist_ok=True)
            argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                    'mount --bind "$1" "$2" && exec bash -c "$3"', "sh", str(self.state), ROOT_STATE, script]
        if niced:
            argv = ["nice", "-n", "19", *argv]
        with open(self.output, "wb") as out:
            return subprocess.Popen(argv, cwd=REPO, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, user=self.uid or None, group=self.uid or None,
                                    extra_groups=[] if self.uid else None, start_new_session=True)

    def finish(self, proc: subprocess.Popen[bytes], timeout: float) -> tuple[dict[int, int], str]:
        """Each command's status (by index), and what the shell wrote."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the README's lines took over {timeout} s:\n{self.written()}") from None
        finally:
            end(proc)   # the backgrounded `serve` too, had the shell not ended it
        out = self.written()
        status = self.home / "status"
        lines = status.read_text().split("\n") if status.exists() else []
        return dict(tuple(map(int, line.split())) for line in lines if line), out   # type: ignore[misc]

    def run(self, commands: list[str], timeout: float) -> tuple[dict[int, int], str]:
        return self.finish(self.start(commands), timeout)

    def written(self) -> str:
        return self.output.read_text(errors="replace")


def end(proc: subprocess.Popen[bytes]) -> None:
    """The shell's process group killed (its own session), the shell reaped."""
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()


def _unrunnable() -> tuple[str, str] | None:
    """("skip" or "fail", why) where the README's lines cannot run here."""
    if os.geteuid() != 0:
        return "skip", "this test switches uids: run it as root (scripts/test does)"
    problem = servers_problem()
    return ("fail", problem) if problem else None


def _stop_here(why: tuple[str, str]) -> NoReturn:
    if why[0] == "skip":
        pytest.skip(why[1])
    pytest.fail(why[1], pytrace=False)


@contextlib.contextmanager
def _shell(who: str) -> Iterator[Shell]:
    base = Path(tempfile.mkdtemp(prefix="llsv-readme-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield Shell(0 if who == "root" else free_uid(), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["root", "user"])
def shell(request: pytest.FixtureRequest) -> Iterator[Shell]:
    why = _unrunnable()
    if why:
        _stop_here(why)
    with _shell(request.param) as sh:
        yield sh


def _python_lines(shell: Shell) -> list[str]:
    """Each python block as a file run by the venv's python; a block whose
    comment offers another line (`# or, ...: X`), run once more with it."""
    commands = []
    for i, (lang, (code,)) in enumerate((lang, cs) for lang, cs in blocks() if lang == "python"):
        variants = [code]
        for m in re.finditer(r"^( *)# or, [^:]*: (.*)$", code, re.M):
            target = m.group(2).split("=")[0].strip()
            variants.append(re.sub(rf"^{re.escape(m.group(1))}{re.escape(target)} = .*$",
                                   lambda _: m.group(1) + m.group(2), code, count=1, flags=re.M))
        for j, variant in enumerate(variants):
            path = shell.home / f"readme_{i}_{j}.py"
            path.write_text(variant)
            os.chown(path, shell.uid, shell.uid)
            commands.append(f"python {path}")
    return commands


def _elsewhere(commands: list[str]) -> list[str]:
    """Lines outside the Use section, run from the home (where a user's
    `learn --out my.yaml` can write: the checkout may be someone else's)."""
    return ["cd ~", *(_localized(c) for c in commands)]


def _assert_ran(commands: list[str], statuses: dict[int, int], out: str) -> None:
    for i, command in enumerate(commands):
        want = CUT if "--follow" in command else 0
        assert statuses.get(i) == want, f"{command!r} ended with {statuses.get(i)}, not {want}:\n{out}"
    assert "Traceback" not in out, out
    assert "not served" not in out, out   # every example manifest loads


@pytest.mark.timeout(240)
def test_readme_lines_run_as_written(shell: Shell) -> None:
    """The Use section's lines, the proxy snippet (both ways it offers), and
    every other line that needs no registry, after the Use section's `serve &`."""
    use = _use()
    rest = [c for c in shell_lines(False) if c not in use]
    commands = [*use, *_python_lines(shell), *_elsewhere(rest)]
    statuses, out = shell.run(commands, timeout=200)
    _assert_ran(commands, statuses, out)
    assert (shell.home / "projects").is_dir()


def _registry_commands() -> list[str]:
    return [*_use_prelude(), *_elsewhere(shell_lines(True))]


class Background:
    """The registry lines as root and as a plain uid, both at once, in the
    background and niced: a minute of ~1.7 of the 2 cores (npm installs the
    Inspector, and the filesystem server twice: learn's run, then the learnt
    manifest's state), which the suite's later part leaves idle (it waits on
    children and timers). tests/conftest.py starts them (`background`
    marker) once the suite is past tests/e2e and tests/install, and runs
    their tests after every other but the audit ones; started by their
    fixture if not (these tests alone). Each shell is the other's stranger:
    its own home, uid and supervisor. start() never raises (it runs in
    another test's setup): what stops it is told by runs()."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.shells: dict[str, tuple[Shell, subprocess.Popen[bytes]]] = {}
        self.why: tuple[str, str] | None = None

    def start(self) -> None:
        if self.shells or self.why:
            return
        self.why = _unrunnable()
        if self.why:
            return
        try:
            for who in ("root", "user"):
                sh = self.stack.enter_context(_shell(who))
                self.shells[who] = (sh, sh.start(_registry_commands(), niced=True))
                self.stack.callback(end, self.shells[who][1])
        except Exception as e:   # (told by runs(), in the tests it is for)
            self.why = "fail", f"the registry lines could not start: {e!r}"

    def runs(self) -> dict[str, tuple[Shell, subprocess.Popen[bytes]]]:
        self.start()
        if self.why:
            _stop_here(self.why)
        return self.shells

    def stop(self) -> None:
        """Whatever still runs killed, the shells' directories removed (the session's end)."""
        self.stack.close()


REGISTRY = Background()


@pytest.mark.network
@pytest.mark.background(REGISTRY)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("who", ["root", "user"])
def test_readme_registry_lines_run_as_written(who: str) -> None:
    """The lines that fetch from npm (the Inspector, learn of an npx
    server), after the Use section's `serve &`."""
    sh, proc = REGISTRY.runs()[who]
    statuses, out = sh.finish(proc, timeout=560)
    _assert_ran(_registry_commands(), statuses, out)
