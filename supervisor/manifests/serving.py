"""A manifest's serving keys: `pool`, `terminal`, `on_disconnect`, `warm`,
`warm_max_age`: how its children are made ready and handed out. Loader
steps (manifest._Loader), each failing on the key it reads."""
from __future__ import annotations

from .file import Reader

MAX_POOL = 8
MAX_WARM = 8
WARM_MAX_AGE = 600   # seconds a warm server waits, unused, before it is replaced
AUTO_POOL = "auto"   # the default: a pool kept while the manifest is in demand (zygote.pools.Demand)


def serving(top: Reader) -> tuple[int | str, bool, str]:
    """pool, terminal, on_disconnect."""
    pool = top.get("pool", (int, str), AUTO_POOL)
    terminal = top.get("terminal", bool, False)
    if pool != AUTO_POOL and not (isinstance(pool, int) and 0 <= pool <= MAX_POOL):
        top.fail("pool", f"expected {AUTO_POOL} or 0 to {MAX_POOL} children, got {pool!r}")
    on_disconnect = top.get("on_disconnect", str, "kill")
    if on_disconnect not in ("kill", "keep"):
        top.fail("on_disconnect", f"expected kill or keep, got {on_disconnect!r}")
    return pool, terminal, on_disconnect


def warm(top: Reader, terminal: bool, group: str | int | None, as_root: bool) -> tuple[int, int]:
    """`warm: N` and `warm_max_age`. Warm servers only where no other
    process shares their uid and gid (a root supervisor's session gid), and
    never on a terminal (it would hold the client's terminal before it is
    the client's)."""
    count = top.get("warm", int, 0)
    if not 0 <= count <= MAX_WARM:
        top.fail("warm", f"expected 0 to {MAX_WARM} servers, got {count!r}")
    if count and terminal:
        top.fail("warm", "contradicts `terminal: true`: a warm server's stdio are pipes, made before "
                 "its client is known")
    if count and group is not None:
        top.fail("warm", "contradicts `group:`: other processes of that gid could change a warm "
                 "server's limits while it waits for its client")
    if count and not as_root:
        top.fail("warm", "needs a root supervisor: under a user's own supervisor every process of "
                 "that user could change a warm server while it waits for its client")
    max_age = top.get("warm_max_age", int, WARM_MAX_AGE)
    if not 1 <= max_age <= 86400:
        top.fail("warm_max_age", f"expected 1 to 86400 seconds, got {max_age}")
    return count, max_age
