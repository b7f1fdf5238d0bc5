"""Starting a private supervisor apart from connecting to it: light to import.

Two ways to one `serve`. launch() spawns a fresh `python -I -S`
(supervisor.client.interpreter) for any proxy, which may have threads: nothing of
its working directory or PYTHON* variables is imported there. fork() is
`run --manifests`'s, at the top of its main before any thread and before it
imports its client: the supervisor's start-up (its imports, the manifest)
then runs beside the rest of `run`'s own on the other core, without a
second interpreter's; the fork drops the working directory and PYTHONPATH
from its sys.path first (what ran before, a sitecustomize.py on PYTHONPATH
say, it cannot undo: cli warns).
"""
from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Sequence

from .. import stdio
from . import interpreter

CONTROL_FD = 3
ENTRY = "from supervisor.cli import main; sys.exit(main(sys.argv[1:]))"


class Booting:
    """A private supervisor spawned, not known to answer yet. (Not a
    NamedTuple: typing alone takes longer to import than this module.)"""

    def __init__(self, pid: int, control: socket.socket) -> None:
        self.pid, self.control = pid, control


def _inheritable_fds() -> list[int]:
    """This process's fds above 2 that an exec would pass on (not fd 3: the
    control socket is put there)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != CONTROL_FD and os.get_inheritable(fd):
                out.append(fd)
        except OSError:
            pass  # the listing's own fd, closed by now
    return out


def _serve_args(manifests: Sequence[str] | str, state_root: str | None, only: str | None,
                extra_args: Sequence[str]) -> list[str]:
    paths = [manifests] if isinstance(manifests, (str, os.PathLike)) else list(manifests)
    args = ["serve", "--control-fd", str(CONTROL_FD)]
    for p in paths:
        args += ["--manifests", os.fspath(p)]
    if state_root:
        args += ["--state-root", state_root]
    if only:
        args += ["--only", only]
    return [*args, *extra_args]


def launch(manifests: Sequence[str] | str, *, state_root: str | None = None, only: str | None = None,
           extra_args: Sequence[str] = ()) -> Booting:
    """Spawn a private supervisor for these manifests (only: the one of that
    name, the others read for their name alone): a new interpreter, as any
    proxy may already have threads."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = interpreter.argv(ENTRY, interpreter.SUPERVISOR_IMPORTS, _serve_args(manifests, state_root, only, extra_args))
    # Its stdin and stdout are the proxy's protocol channel: keep off them.
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        # posix_spawn closes no fd: the proxy's inheritable ones (a pipe to
        # another child, say) would stay open in the server for its life.
        pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
            (os.POSIX_SPAWN_DUP2, theirs.fileno(), CONTROL_FD),
            *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds())])
    except OSError:
        ours.close()
        raise
    finally:
        os.close(devnull)
        theirs.close()
    return Booting(pid, ours)


def fork(manifests: Sequence[str] | str, *, state_root: str | None = None, only: str | None = None,
         extra_args: Sequence[str] = ()) -> Booting:
    """`run`'s private supervisor: a fork of this process, which must have
    no thread (the top of `run`'s main), serving there. The same `serve`
    as launch()'s, without a second interpreter's start-up and command
    line on the path of every private `run` (~12 ms)."""
    args = _serve_args(manifests, state_root, only, extra_args)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        ours.detach()   # closed below, with every fd of the proxy's
        os._exit(_serve_here(theirs.detach(), args))
    theirs.close()
    return Booting(pid, ours)


def _serve_here(control: int, args: list[str]) -> int:
    """In the fork: the fds as launch() leaves them (stdio 0 and 1 on
    /dev/null, stderr kept, the control channel on fd 3, nothing else),
    then `serve`; its exit status. Nothing may unwind into the proxy's code.
    The cwd and PYTHONPATH entries of `python -m supervisor run` leave
    sys.path before any import: a `yaml.py` there is not the supervisor's."""
    foreign = interpreter.foreign_here()
    sys.path[:] = [p for p in sys.path if p not in foreign]
    try:
        stdio.forked()   # (`run`'s writers of its stdout and stderr hold fds this process is to move)
        control = fcntl.fcntl(control, fcntl.F_DUPFD_CLOEXEC, CONTROL_FD + 1)   # off whatever fds 0-3 hold
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(control, CONTROL_FD, inheritable=False)
        os.closerange(CONTROL_FD + 1, os.sysconf("SC_OPEN_MAX"))
        from .. import serve
        return serve.main(serve.parse(args))
    except SystemExit as e:   # what the interpreter would make of it
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback
        traceback.print_exc()
        return 1
    finally:
        sys.stderr.flush()
