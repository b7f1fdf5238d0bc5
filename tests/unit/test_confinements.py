"""The supervisor's cache of prepared confinements (supervisor/daemon/confinements.py): bounded, but a warm
server's is never evicted for room (its hand-over compares confinements by identity: a new one would retire it)."""
from __future__ import annotations

from types import SimpleNamespace

import landlock
from landlock.spec import Spec
from supervisor.daemon import confinements, currency
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


def test_a_ruleset_is_watched_once_the_request_is_answered(tmp_path, monkeypatch):
    """Built (or found current by stat) on a spawn's path; armed by the
    callback the supervisor runs after the reply (daemon/currency.py); from
    then on found current without a stat, and nothing more is queued."""
    monkeypatch.setattr(currency, "REARM_AFTER", 0.0)   # (armed again at once after an event: asked below)
    later: list = []
    cache = Confinements(later.append)
    (tmp_path / "rule").mkdir()
    spec = Spec(read_only=(str(tmp_path / "rule"),))
    try:
        confinement = cache.get(spec)
        assert cache.currency is not None and not cache.currency.armed and len(later) == 1
        later.pop()()
        assert id(confinement.ruleset) in cache.currency.armed

        def quiet(change) -> bool:
            # /tmp, an ancestor watched too, is every process's: an entry made
            # there meanwhile is an event (stat'ed, queued): asked three times.
            for _ in range(3):
                change()
                assert cache.get(spec) is confinement
                if not later:
                    return True
                later.pop()()
            return False
        assert quiet(lambda: None)
        # No lookup reads "rule"'s own entries: nothing to see.
        assert quiet(lambda: (tmp_path / "rule" / "inside").mkdir(exist_ok=True))
        (tmp_path / "beside").mkdir()   # an event of the watched parent: stat'ed, still current, queued
        assert cache.get(spec) is confinement and len(later) == 1
    finally:
        cache.clear()
        cache.currency.close()
