"""supervisor/client/: what a proxy or `run` imports; nothing of the daemon.

`from supervisor.client import Client` (and the other names of
`supervisor.client.sync`) keeps working, but only when asked for: importing
`supervisor.client.private_boot` must not load the client (`run --manifests`
forks its private supervisor before it does, tests/unit/test_imports.py).
"""
TYPE_CHECKING = False   # (typing's own name, without importing typing: mypy takes the name)
if TYPE_CHECKING:
    from .sync import (Child, Client, ConfinementUnavailable, NoSuchManifest, RefusedPeer, SpawnFailed,
                       SupervisorError, _run, connect_first, connect_path, error_from, shell_status)

_SYNC = frozenset({"Child", "Client", "ConfinementUnavailable", "NoSuchManifest", "RefusedPeer", "SpawnFailed",
                   "SupervisorError", "_run", "connect_first", "connect_path", "error_from", "shell_status"})
__all__ = sorted(_SYNC - {"_run"})


def __getattr__(name: str) -> object:
    if name in _SYNC:
        from . import sync
        return getattr(sync, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
