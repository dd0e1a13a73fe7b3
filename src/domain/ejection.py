"""Outlier ejection: a replica that keeps failing stops getting traffic for a while.

Envoy's consecutive-failure detection, with its defaults (`[endpoints]` keys):

- A replica with `consecutive_failures` counted failures in a row
  (`domain.upstream_failures.counts_against_replica`) is ejected; a success resets the
  count. A 4xx or a client that went away is neither (the caller reports nothing).
- It is ejected for `base_ejection_seconds` x the times it has been ejected, at most
  `max_ejection_seconds` (30 s, 60 s, 90 s ... 300 s). The multiplier decays by one for
  every `base_ejection_seconds` the replica then stays in service (Envoy decrements it
  per healthy interval), so a replica that fails again at once is ejected for longer,
  one that recovered starts again at the base.
- At most `max_ejection_percent` of the ready replicas are ejected at once, counted as
  Envoy counts it ((ejected + 1) / ready <= percent, and one may always go when none
  is ejected), and never the last one: at least one ready replica always stays
  eligible. A failure refused ejection for that reason keeps its count, so the next
  one tries again. When the ready set shrinks below what its ejections allow, the
  ejections that end soonest end now.
- An ejected replica gets no new request and its slots leave the upstream's live cap
  (`ReplicaSet.set_ejected`); it returns when its time is over, with its count at 0.
  Outcomes of its calls still in flight are ignored while it is ejected. The caller
  calls `refresh` before each pick: it ends what is over and names who returns.

The clock is passed in (seconds, any monotonic origin); nothing here waits.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

import msgspec

from domain.upstream_failures import FailureKind, counts_against_replica


class EjectionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    consecutive_failures: int = 5
    base_ejection_seconds: float = 30.0
    max_ejection_seconds: float = 300.0
    max_ejection_percent: int = 50

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be >= 1")
        if not self.base_ejection_seconds > 0:
            raise ValueError("base_ejection_seconds must be > 0")
        if self.max_ejection_seconds < self.base_ejection_seconds:
            raise ValueError("max_ejection_seconds must be >= base_ejection_seconds")
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be within 0..100")

    def allowed(self, ready: int) -> int:
        """How many of `ready` replicas may be ejected at once."""
        if ready < 2 or self.max_ejection_percent == 0:
            return 0
        by_percent = self.max_ejection_percent * ready // 100
        return min(max(by_percent, 1), ready - 1)

    def seconds(self, times: int) -> float:
        return min(self.base_ejection_seconds * times, self.max_ejection_seconds)

    @property
    def most_times(self) -> int:
        """The multiplier at which the ejection time reaches its cap."""
        return math.ceil(self.max_ejection_seconds / self.base_ejection_seconds)


class Ejection(msgspec.Struct, frozen=True, kw_only=True):
    """One ejection: the replica, when it returns, for how long, and the how-many-th in a row."""

    address: str
    until: float
    seconds: float
    times: int


class _Health:
    __slots__ = ("failures", "out", "times", "until")

    def __init__(self) -> None:
        self.failures = 0  # counted failures in a row
        self.times = 0  # the ejection multiplier
        self.out = False  # ejected, its return not yet reported (`refresh`)
        self.until: float | None = None  # while ejected: when it returns; after: when it returned


class OutlierDetector:
    """One upstream's replicas' health, as one process has seen its own calls go."""

    __slots__ = ("_health", "policy")

    def __init__(self, policy: EjectionPolicy | None = None) -> None:
        self.policy = policy or EjectionPolicy()
        self._health: dict[str, _Health] = {}

    # -- outcomes ---------------------------------------------------------------------

    def success(self, address: str, now: float) -> None:
        """A call that got a 2xx head from the replica."""
        health = self._health.get(address)
        if health is not None and not _ejected(health, now):
            health.failures = 0

    def failure(self, address: str, kind: FailureKind | None, now: float, ready: Collection[str]) -> Ejection | None:
        """A failed call; the ejection it causes, if any. `ready`: the upstream's ready replicas now."""
        if not counts_against_replica(kind):
            return None
        health = self._health.get(address)
        if health is None:
            health = self._health[address] = _Health()
        elif _ejected(health, now):
            return None  # a call that was in flight when it was ejected
        elif health.out:  # its time is over and `refresh` has not said so yet: it is back
            health.out = False
        health.failures += 1
        policy = self.policy
        if health.failures < policy.consecutive_failures or address not in ready:
            return None
        if len(self._kept(now, ready)) >= policy.allowed(len(ready)):
            return None  # over max_ejection_percent, or the last eligible: the count stays
        if health.times and health.until is not None:  # decay for the time it served since its return
            served = max(0.0, now - health.until)
            health.times = max(0, health.times - int(served // policy.base_ejection_seconds))
        health.times = min(health.times + 1, policy.most_times)
        seconds = policy.seconds(health.times)
        health.until, health.out, health.failures = now + seconds, True, 0
        return Ejection(address=address, until=health.until, seconds=seconds, times=health.times)

    # -- state ------------------------------------------------------------------------

    def ejected(self, now: float, ready: Collection[str]) -> frozenset[str]:
        """The ready replicas ejected now (never more than the policy allows for `ready`)."""
        return frozenset(self._kept(now, ready))

    def until(self, address: str, now: float) -> float | None:
        """When an ejected replica returns; None when it is not ejected."""
        health = self._health.get(address)
        return health.until if health is not None and _ejected(health, now) else None

    def refresh(self, now: float, ready: Collection[str]) -> list[str]:
        """End the ejections that are over (their time passed, or the ready set shrank below what
        they need); the replicas that return now, in address order (one log line each)."""
        kept = set(self._kept(now, ready))
        back = []
        for address, health in self._health.items():
            if not health.out or address in kept:
                continue
            assert health.until is not None
            if health.until <= now or address in ready:  # a draining one keeps its time
                health.out, health.failures, health.until = False, 0, min(health.until, now)
                back.append(address)
        return sorted(back)

    def retain(self, known: Iterable[str]) -> None:
        """Forget replicas that are no longer known (they left discovery and drained)."""
        keep = set(known)
        for address in [a for a in self._health if a not in keep]:
            del self._health[address]

    def _kept(self, now: float, ready: Collection[str]) -> list[str]:
        ejected = [(h.until, a) for a, h in self._health.items() if a in ready and _ejected(h, now)]
        allowed = self.policy.allowed(len(ready))
        if len(ejected) > allowed:  # the ready set shrank: the ejections ending last stay
            ejected.sort(reverse=True)
            ejected = ejected[:allowed]
        return [a for _, a in ejected]


def _ejected(health: _Health, now: float) -> bool:
    return health.out and health.until is not None and health.until > now
