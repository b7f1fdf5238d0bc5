"""Fork, confine, exec: the only code that runs between fork and exec.

Everything is computed in the parent (argv, environment, the Confinement
with its ruleset fd); the child makes system calls in a fixed order and
leaves by exec or os._exit. A failure travels back over a close-on-exec
pipe as "stage:errno:message"; EOF on that pipe means exec succeeded.
"""
from __future__ import annotations

import os
import _signal
import signal
from dataclasses import dataclass

import prctl

import landlock

# _signal's pthread_sigmask returns plain ints: signal's wraps each of up to
# 64 in an enum, on every call, in the parent and in the child.
ALL_SIGNALS = _signal.valid_signals()


@dataclass
class Launch:
    program: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    confinement: landlock.Confinement


class SpawnError(Exception):
    def __init__(self, stage: str, errno_: int, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage, self.errno = stage, errno_


def spawn(launch: Launch, stdio: list[int], reset_signals: list[int], stat_fd: int) -> tuple[int, int]:
    """Fork a child for launch; returns (pid, read end of its error pipe).

    Signals are blocked across fork, so no handler of ours runs in the
    child. Raises OSError when fork fails (EAGAIN, ENOMEM) or the process
    has grown a thread.
    """
    if landlock.enforce.thread_count(stat_fd) != 1:
        raise OSError(0, "the supervisor has more than one thread: refusing to fork")
    parent = os.getpid()
    r, w = os.pipe2(os.O_CLOEXEC)
    old_mask = _signal.pthread_sigmask(signal.SIG_BLOCK, ALL_SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        _signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        os.close(r)
        os.close(w)
        raise
    if pid == 0:
        _child(launch, stdio, reset_signals, w, parent)
    _signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    os.close(w)
    return pid, r


def _child(launch: Launch, stdio: list[int], reset_signals: list[int], err_w: int, parent: int) -> None:
    stage = "signals"
    try:
        # The wakeup fd is shared with the parent: a signal here would look
        # like the supervisor's own. Handlers we set (and the ignores Python
        # set, SIGPIPE and SIGXFSZ) would survive exec: back to defaults.
        signal.set_wakeup_fd(-1)
        for sig in reset_signals:
            _signal.signal(sig, _signal.SIG_DFL)
        stage = "setsid"
        os.setsid()
        stage = "stdio"
        # The received fds are > 2 (the supervisor keeps 0-2 open), so dup2
        # cannot clobber one before it is copied.
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        stage = "close_fds"
        keep = sorted({err_w, launch.confinement.ruleset.fd} - {-1})
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 0x7FFFFFFF)
        stage = "privileges"
        launch.confinement.drop_privileges()
        stage = "chdir"  # as the server's user: a directory it could not enter is an error
        os.chdir(launch.cwd)
        os.umask(launch.umask)
        stage = "pdeathsig"
        # Armed after the uid change, which clears it; then re-check that the
        # supervisor did not die before it was armed.
        prctl.set_pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
        stage = "confine"
        launch.confinement.restrict()
        stage = "exec"
        _signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.execve(launch.program, launch.argv, launch.env)
    except OSError as e:
        message = f"{stage}:{e.errno or 0}:{e.strerror or e}"
    except BaseException as e:  # never let the parent's code run on in a child
        message = f"{stage}:0:{type(e).__name__}: {e}"
    try:
        os.write(err_w, message.encode(errors="replace")[:4096])
    finally:
        os._exit(127)


def read_error(data: bytes) -> SpawnError:
    stage, _, rest = data.decode(errors="replace").partition(":")
    number, _, message = rest.partition(":")
    return SpawnError(stage, int(number) if number.isdigit() else 0, message)
