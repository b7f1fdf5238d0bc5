"""Spec -> prepared landlock.Confinement, built once, reused while its paths are the same inodes, the cache bounded."""
from __future__ import annotations

from collections.abc import Callable

import landlock

from .currency import Currency
from ..errors import Code, Refused

MAX_CACHED = 64   # narrowed specs each get one: keep the cache bounded (a warm server's is kept aside: `keep`)


class Confinements:
    def __init__(self, later: Callable[[Callable[[], None]], object] | None = None) -> None:
        """later: where given, their currency is known from the kernel's
        events (currency.py), and `later(f)` runs f once the request at hand
        is answered (it arms what a spawn found current by stat). It takes an
        inotify instance of the supervisor's uid, which has 128 by default
        for its every program: a private supervisor, one a server, takes
        none and stats its paths."""
        self.later = later
        self._cache: dict[landlock.Spec, landlock.Confinement] = {}
        # Never evicted (a warm server's: its hand-over compares its confinement
        # with what a fresh spawn gets, by identity; a new one would retire it).
        self._kept: set[landlock.Spec] = set()
        self.canary: str | None = None   # supervisor/daemon/audit.py: each domain marked with it
        self.currency = Currency() if later is not None else None
        if self.currency is not None:
            self.currency.open()   # now: the supervisor's fds at rest are the same from its start

    def get(self, spec: landlock.Spec, keep: bool = False) -> landlock.Confinement:
        """Raises Refused: the kernel cannot enforce it, a path it cannot use,
        or out of fds or memory while building the ruleset. `keep`: never
        evicted for room (until clear())."""
        if keep:
            self._kept.add(spec)
        try:
            return self._get(spec)
        except landlock.LandlockUnavailable as e:
            raise Refused(Code.CONFINEMENT_UNAVAILABLE, str(e)) from None
        except landlock.SpecError as e:
            raise Refused(Code.BAD_SPEC, str(e)) from None
        except OSError as e:
            raise Refused(Code.SPAWN_FAILED, f"cannot prepare the sandbox: {e.strerror or e}") from None

    def _current(self, ruleset: landlock.Ruleset) -> bool:
        if self.currency is None:
            return ruleset.is_current()
        current = self.currency.current(ruleset)
        self._arm_later()
        return current

    def _get(self, spec: landlock.Spec) -> landlock.Confinement:
        confinement = self._cache.get(spec)
        if confinement is not None and self._current(confinement.ruleset):
            return confinement
        if confinement is not None:
            self._close(self._cache.pop(spec))
        evictable = [s for s in self._cache if s not in self._kept]
        if len(evictable) >= MAX_CACHED:
            self._close(self._cache.pop(evictable[0]))
        confinement = landlock.prepare(spec)
        if self.canary is not None and confinement.ruleset.fd >= 0:
            confinement.entry = confinement.entry._replace(canary=self.canary)
        self._cache[spec] = confinement
        if self.currency is not None:
            self.currency.pending[id(confinement.ruleset)] = confinement.ruleset   # (its paths opened just now)
            self._arm_later()
        return confinement

    def _arm_later(self) -> None:
        """What was found current by stat (or just built) armed once the request is answered."""
        if self.currency is not None and self.currency.pending and self.later is not None:
            self.later(self.currency.arm_pending)

    def clear(self) -> None:
        """Close every one (a reload: the manifests' paths may have changed)."""
        for confinement in self._cache.values():
            self._close(confinement)
        self._cache.clear()
        self._kept.clear()

    def _close(self, confinement: landlock.Confinement) -> None:
        if self.currency is not None:
            self.currency.forget(confinement.ruleset)
        confinement.close()
