"""The single-threaded fork-server that spawns confined servers, and its clients.

Kept free of imports: the fork-server runs as `python -m supervisor`, and
every module it imports makes each fork slower.
"""


def start(manifests, **kwargs):  # type: ignore[no-untyped-def]
    """Start a private fork-server for this proxy; returns its Client. See supervisor.client.private."""
    from .client.private import start as _start
    return _start(manifests, **kwargs)
