"""The supervisor's cache of prepared confinements (supervisor/daemon/confinements.py): bounded, but a warm
server's is never evicted for room (its hand-over compares confinements by identity: a new one would retire it)."""
from __future__ import annotations

from types import SimpleNamespace

import landlock
from landlock.spec import Spec
from supervisor.daemon import confinements
from supervisor.daemon.confinements import Confinements


class Prepared:
    """landlock.prepare's stand-in: no ruleset made, its paths always current."""

    def __init__(self, spec: Spec) -> None:
        self.ruleset = SimpleNamespace(is_current=lambda: True, fd=-1, identity=())
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_the_cache_is_bounded_but_a_kept_confinement_stays(monkeypatch):
    monkeypatch.setattr(landlock, "prepare", Prepared)
    cache = Confinements()
    warm = Spec(read_only=("/warm",))
    kept = cache.get(warm, keep=True)
    narrowed = [cache.get(Spec(read_only=(f"/narrowed/{i}",))) for i in range(confinements.MAX_CACHED + 5)]
    assert cache.get(warm) is kept and not kept.closed
    assert [c.closed for c in narrowed] == [True] * 5 + [False] * confinements.MAX_CACHED   # the oldest went
    cache.clear()
    assert kept.closed and cache.get(warm) is not kept
