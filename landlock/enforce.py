"""Confining a process: prepared once, entered in the process to confine.

prepare() does everything that may fail for a reason a person can act on
(bad spec, missing Landlock) and everything that is costly (probing, the
ruleset, name look-ups), so that a fork-server can do it in the parent and
its child only makes the few system calls of enter().
"""
from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import signal
import sys
import termios
from dataclasses import dataclass

import prctl

from . import enter, privileges, rlimits, syscalls
from .enter import thread_count
from .exits import EXIT_EXEC_FAILED, EXIT_NOT_FOUND, EXIT_THREADS, EXIT_UNAVAILABLE, EXIT_USAGE
from .report import Report
from .ruleset import LandlockUnavailable, Ruleset, build
from .spec import Spec, SpecError
from .support import keyrings_available

TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from typing import Any, NoReturn




def default_signals() -> None:
    """Every signal at its default, none blocked: an ignored signal and the
    signal mask survive execve. Python ignores SIGPIPE and SIGXFSZ, and a
    caller may have ignored others (`nohup` ignores SIGHUP): a server
    started under nohup, or from a service manager's environment, still
    ends at SIGHUP and SIGPIPE as servers do."""
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass   # SIGKILL, SIGSTOP, glibc's own
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class NotSingleThreaded(RuntimeError):
    """landlock_restrict_self confines one thread: other threads stay free."""


@dataclass
class Confinement:
    """A prepared confinement: the ruleset and the child's steps (landlock.enter), entered after fork."""
    ruleset: Ruleset
    entry: enter.Entry
    report: Report

    @functools.cached_property
    def report_dict(self) -> dict[str, Any]:
        """The Report as JSON-ready data, built once: a fork-server sends it per child."""
        return self.report.to_dict()

    def enter(self, steps: tuple[enter.Step, ...] = enter.STEPS) -> None:
        """enter.STEPS: a session keyring, privileges, no_new_privs and the
        Landlock domain, then rlimits."""
        for _stage, step in steps:
            step(self.entry, self.ruleset.fd)

    def close(self) -> None:
        self.ruleset.close()


def prepare(spec: Spec, ruleset: Ruleset | None = None) -> Confinement:
    """Raises SpecError or LandlockUnavailable. `ruleset` reuses a built one."""
    ruleset = ruleset or build(spec)
    report = Report(**ruleset.report.to_dict())
    creds = privileges.resolve(spec.user, spec.group, spec.groups)
    if creds is not None and os.geteuid() != 0 and (creds.uid, creds.gid) != (os.getuid(), os.getgid()):
        raise SpecError(f"user: switching to {spec.user!r} needs root")
    # Root without its capabilities, whether it stays root or switches to
    # uid 0 (`user: root`): a uid switch to 0 keeps every capability.
    uid = os.getuid() if creds is None else creds.uid
    drop_caps = (creds is None or creds.uid == 0) and not spec.keep_capabilities
    plan = rlimits.plan(spec.rlimits, report)
    report.no_new_privs = True
    report.session_keyring = keyrings_available()
    report.enforced = ruleset.fd >= 0
    report.capabilities_dropped = drop_caps or uid != 0
    report.uid, report.gid = uid, os.getgid() if creds is None else creds.gid
    entry = enter.Entry(
        credentials=None if creds is None else (creds.uid, creds.gid, creds.groups),
        drop_capabilities=privileges.bounding_set() if drop_caps else None,
        lock_securebits=drop_caps and bool(prctl.cap_effective.setpcap),
        rlimits=plan, restrict_flags=ruleset.restrict_flags)
    return Confinement(ruleset, entry, report)


def apply(spec: Spec) -> Report:
    """Confine the calling process, which must have exactly one thread."""
    return _enter(spec, enter.STEPS).report


def _enter(spec: Spec, steps: tuple[enter.Step, ...]) -> Confinement:
    threads = thread_count()
    if threads != 1:
        raise NotSingleThreaded(
            f"refusing to confine a process with {threads} threads: "
            "Landlock would confine only the calling one")
    confinement = prepare(spec)
    try:
        confinement.enter(steps)
    finally:
        confinement.close()
    confinement.report.tid = syscalls.gettid() if confinement.report.enforced else 0
    return confinement


def detach_terminal() -> bool:
    """Lose the controlling terminal, so TIOCSTI into an inherited one fails.

    Landlock's ioctl right is checked at open(), not on inherited fds: only
    leaving the terminal's session stops keystroke injection (the bug class
    of bubblewrap's CVE-2017-5226). A process-group leader cannot setsid();
    TIOCNOTTY on the controlling terminal detaches it all the same.
    """
    ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]
    if not ttys:
        return False
    try:
        os.setsid()
        return True
    except PermissionError:
        pass
    for fd in ttys:
        # A session leader's TIOCNOTTY sends SIGHUP (and SIGCONT) to the
        # terminal's foreground process group, which may be this process:
        # ignored while it happens, so the signal is discarded, not fatal.
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            fcntl.ioctl(fd, termios.TIOCNOTTY)
            return True
        except OSError as e:
            if e.errno != errno.ENOTTY:  # not our controlling terminal: try the next
                raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGHUP, previous)
    return True  # none of them is our controlling terminal: nothing to inject into


def _legacy_tiocsti() -> bool:
    """Whether TIOCSTI works without CAP_SYS_ADMIN (always before Linux 6.2)."""
    try:
        with open("/proc/sys/dev/tty/legacy_tiocsti", "rb") as f:
            return f.read().strip() != b"0"
    except OSError:
        return True


def adoptable_terminals() -> list[int]:
    """The stdio fds whose terminal a new session leader could make its
    controlling terminal (TIOCSCTTY) and then inject input into (TIOCSTI).

    Safe: this session's controlling terminal when this process does not
    lead the session: the leader holds it after this process leaves, and the
    kernel refuses TIOCSCTTY on a terminal another session holds. Anything
    else (a pty nobody made controlling, ours while we lead) is adoptable.
    Call before detach_terminal()."""
    if not _legacy_tiocsti():
        return []
    out = []
    for fd in (0, 1, 2):
        if not os.isatty(fd):
            continue
        try:
            held = syscalls.tcgetsid(fd) == os.getsid(0) != os.getpid()
        except OSError:  # ENOTTY: not our controlling terminal
            held = False
        if not held:
            out.append(fd)
    return out


ROOT_WARNING = ("landlock-exec: the command runs as root without capabilities (no --user): it can still "
                "chmod and chown files root owns outside the grants (make a copy of a shell set-uid root), "
                "so a compromised command can make any local user root; give --user to run it as another user")


def _root_warning(spec: Spec, report: Report) -> str | None:
    if report.uid != 0 or spec.keep_capabilities:
        return None
    return ROOT_WARNING


def _fail(code: int, message: str) -> NoReturn:
    print(f"landlock-exec: {message}", file=sys.stderr, flush=True)
    os._exit(code)


def exec_confined(spec: Spec, argv: list[str], env: dict[str, str], *,
                  new_session: bool = True, print_report: bool = False,
                  allow_terminal: bool = False) -> NoReturn:
    """The seed's RunChild: confine this process, then exec argv.

    Also, as a supervisor's child gets them: a session keyring of its own,
    no real-time scheduling, and (new_session) no terminal it could adopt,
    unless allow_terminal.

    Exit codes: 2 bad invocation or spec, 3 confinement unavailable while
    fail-closed, 4 not single-threaded, 126 exec failed, 127 not found.
    """
    if not argv:
        _fail(EXIT_USAGE, "no command given")
    import shutil   # here: ~2 ms of every supervisor's first spawn (it imports this module for Confinement)
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None:
        _fail(EXIT_NOT_FOUND, f"{argv[0]}: command not found on PATH")
    stat_fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    if new_session and not allow_terminal:
        adoptable = adoptable_terminals()
        if adoptable:
            _fail(EXIT_USAGE, f"fd {', '.join(map(str, adoptable))}: a terminal no other session holds "
                  "once this one leaves it: the command could make it its controlling terminal and inject "
                  "input into it (TIOCSCTTY, TIOCSTI); pass pipes, or give --allow-terminal to accept that")
    try:
        enter.reset_scheduling()
        if new_session:
            detach_terminal()
        confinement = _enter(spec, enter.CONFINE)
    except SpecError as e:
        _fail(EXIT_USAGE, str(e))
    except LandlockUnavailable as e:
        _fail(EXIT_UNAVAILABLE, str(e))
    except NotSingleThreaded as e:
        _fail(EXIT_THREADS, str(e))
    except OSError as e:
        _fail(EXIT_UNAVAILABLE, f"confinement failed: {e}")
    report = confinement.report
    warning = _root_warning(spec, report)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if print_report:
        print(json.dumps(report.to_dict(), sort_keys=True), file=sys.stderr, flush=True)
    elif report.abi == -1:
        print(f"landlock-exec: {report.note}", file=sys.stderr, flush=True)
    if thread_count(stat_fd) != 1:
        _fail(EXIT_THREADS, "a thread appeared before exec: the domain would be lost")
    default_signals()
    try:
        confinement.enter(enter.LAST)
    except OSError as e:
        _fail(EXIT_UNAVAILABLE, f"confinement failed: {e}")
    try:
        os.execve(program, argv, env)
    except FileNotFoundError:
        _fail(EXIT_NOT_FOUND, f"{program}: not found")
    except OSError as e:
        _fail(EXIT_EXEC_FAILED, f"{program}: exec failed: {e.strerror}")
