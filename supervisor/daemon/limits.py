"""What the supervisor allows (Limits) and its own resource limits, kept where they were set."""
from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass

RLIMITS = tuple(range(16))   # RLIMIT_CPU .. RLIMIT_RTTIME


@dataclass
class Limits:
    """What the supervisor allows: children, connections, deadlines, request sizes."""
    children: int = 256           # in total
    children_per_uid: int = 64
    connections: int = 512
    connections_per_uid: int = 128  # for every uid but the supervisor's own
    owner_connections: int = 32    # of `connections`, kept for the supervisor's own uid
    request_deadline: float = 5.0  # seconds a connection has to send its first request
    linger: float = 5.0           # seconds a connection stays open, idle, after its child's exit
    grace: float = 5.0            # TERM, then KILL this long after
    max_args: int = 256
    max_arg_bytes: int = 32 * 1024


def _current() -> tuple[tuple[int, int], ...]:
    return tuple(resource.getrlimit(res) for res in RLIMITS)


class OwnLimits:
    """The supervisor's resource limits. Connections cost fds: ours go up to
    the hard limit; children keep the limit we were given (the zygote's, set
    back at its start)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.nofile_start = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile_start[1], self.nofile_start[1]))
        except (OSError, ValueError) as e:
            log(f"cannot raise the soft NOFILE limit to the hard one: {e}")
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # fds kept for the owner: a spawn takes ~10 at once, more to build a ruleset.
        self.fd_reserve = max(16, min(64, self.fd_limit // 8))
        self.kept = _current()

    def check(self) -> None:
        """A process that may prlimit(2) us (one of our uid and gid: under a
        user's supervisor, any child) may have lowered our limits: put them
        back where we still can (a soft limit up to its hard one; a hard one
        only with CAP_SYS_RESOURCE) and say so."""
        now = _current()
        if now == self.kept:
            return
        for res, (was, got) in enumerate(zip(self.kept, now)):
            if was == got:
                continue
            try:
                resource.setrlimit(res, was)
                self.log(f"resource limit {res} was lowered to {got} by another process: restored to {was}")
            except (OSError, ValueError):
                try:
                    resource.setrlimit(res, (got[1], got[1]))
                except (OSError, ValueError):
                    pass
                self.log(f"resource limit {res} was lowered to {got} by another process: cannot restore {was}")
        self.kept = _current()
