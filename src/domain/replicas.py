"""An upstream's replicas: which may get a request, how many slots each holds, which one is next.

An upstream with `[endpoints]` keeps one cap and one queue (`domain.admission`); every
request it admits is bound to ONE replica with room for it. The rule, shared by both
admission backends (the Redis script applies the same one to shared counts):

- **Picking**: among READY replicas with at least `slots` free (a request taking k
  slots needs k on one replica: its sequences share one engine), the one with the
  fewest in flight; ties rotate: the first in address order after the last one picked
  (round robin), so equal loads spread evenly and 3 + 3 is what a cap of 6 over two
  replicas looks like.
- **Draining**: a replica that leaves the discovery answer gets no new request; its
  requests in flight finish; it is forgotten when it has none. One that reappears
  (or never left) keeps its counts.
- **Capacity**: the ready replicas hold `limit` slots each; the upstream's live cap is
  min(its admission cap, that sum). It shrinks as replicas go and grows back, up to the
  configured cap, as they come.
- **Ejected** replicas (`domain.ejection`) are ready but failing: no new request, and
  their slots leave the live cap as a draining replica's do, until they return.
- **Saturated** replicas (`domain.load_reports`: vLLM says it queues, or runs all its
  sequence slots) get no new request; their slots stay in the cap (they come back as
  soon as a scrape says so).
- **Affinity** (`domain.affinity`): `prefer` lists replicas in the order the request
  would like them (the one holding its longest cached prefix first); the first of them
  that has room and whose in flight is within `max_extra` of the least loaded wins;
  otherwise the least loaded, as above.

Addresses are opaque strings (the adapters use the replica's base URL, e.g.
`http://10.42.0.17:8080`). Counts are in slots.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

import msgspec


class ReplicaState(enum.Enum):
    READY = "ready"  # in the discovery answer: may get new requests
    DRAINING = "draining"  # left the answer, still has requests in flight
    EJECTED = "ejected"  # in the answer, but failing: no new requests until it returns


class Replica(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What is known of one replica now."""

    address: str
    state: ReplicaState
    in_flight: int  # slots held by this upstream's requests
    limit: int  # the most slots it may hold at once ([endpoints] max_in_flight)
    saturated: bool = False  # its own metrics say it is full or queueing: no room, whatever our counts

    def free(self) -> int:
        return 0 if self.saturated else self.limit - self.in_flight


def endpoint_of(address: str) -> str:
    """A replica's `host:port` (its metrics label and log field) from its base URL."""
    parts = urlsplit(address)
    host = parts.hostname or address
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def pick(
    replicas: Sequence[Replica], slots: int = 1, after: str | None = None,
    prefer: Sequence[str] = (), max_extra: int = 0,
) -> Replica | None:
    """The replica a request taking `slots` goes to, or None (it must wait).

    `after`: the address picked last; among the least loaded, the first address above it
    wins (wrapping around), so ties rotate. `prefer`: affinity, best first; one of them
    wins if it has room and at most `max_extra` more in flight than the least loaded.
    """
    best: list[Replica] = []
    room: dict[str, Replica] = {}
    least = 0
    for replica in replicas:
        if replica.state is not ReplicaState.READY or replica.free() < slots:
            continue
        room[replica.address] = replica
        if not best or replica.in_flight < least:
            best, least = [replica], replica.in_flight
        elif replica.in_flight == least:
            best.append(replica)
    if not best:
        return None
    for address in prefer:
        wanted = room.get(address)
        if wanted is not None and wanted.in_flight <= least + max_extra:
            return wanted
    if after is None:
        return min(best, key=_address)
    later = [r for r in best if r.address > after]
    return min(later or best, key=_address)


def _address(replica: Replica) -> str:
    return replica.address


class ReplicaSet:
    """One upstream's replicas as one process knows them: the ready addresses (the last
    discovery answer), the slots each replica holds, the last one picked.

    A replica is listed while it is ready or holds slots; a draining replica whose last
    slot comes back is forgotten.
    """

    __slots__ = ("_ejected", "_held", "_last", "_ready", "_saturated", "limit")

    def __init__(self, limit: int, ready: Iterable[str] = ()) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._ready: frozenset[str] = frozenset(ready)
        self._held: dict[str, int] = {}  # address -> slots held (only > 0)
        self._last: str | None = None
        self._ejected: frozenset[str] = frozenset()  # `OutlierDetector.ejected`, as last told
        self._saturated: frozenset[str] = frozenset()  # `load_reports.saturated`, as last told

    # -- membership -------------------------------------------------------------------

    def update(self, ready: Iterable[str]) -> None:
        """A new discovery answer: the replicas in it are ready, the others drain."""
        self._ready = frozenset(ready)

    def set_ejected(self, addresses: Iterable[str]) -> None:
        """The replicas ejected now (the whole set, replacing the last one)."""
        self._ejected = frozenset(addresses)

    def set_saturated(self, addresses: Iterable[str]) -> None:
        """The replicas whose own metrics say they have no room now (the whole set)."""
        self._saturated = frozenset(addresses)

    @property
    def ready(self) -> frozenset[str]:
        return self._ready

    def eligible(self) -> frozenset[str]:
        """The ready replicas that are not ejected (those that may get requests and hold the cap)."""
        return self._ready - self._ejected

    def state(self, address: str) -> ReplicaState | None:
        """READY, EJECTED, DRAINING, or None for a replica this set does not know (or has forgotten)."""
        if address in self._ready:
            return ReplicaState.EJECTED if address in self._ejected else ReplicaState.READY
        return ReplicaState.DRAINING if address in self._held else None

    def replicas(self) -> list[Replica]:
        """Every known replica, in address order: the ready (or ejected) ones and the draining ones."""
        held, limit, saturated = self._held, self.limit, self._saturated
        return [
            Replica(address=a, state=self._state(a), in_flight=held.get(a, 0), limit=limit, saturated=a in saturated)
            for a in sorted(self._ready | held.keys())
        ]

    def _state(self, address: str) -> ReplicaState:
        if address not in self._ready:
            return ReplicaState.DRAINING
        return ReplicaState.EJECTED if address in self._ejected else ReplicaState.READY

    # -- capacity -----------------------------------------------------------------------

    def capacity(self) -> int:
        """Slots on the ready replicas that are not ejected."""
        return len(self.eligible()) * self.limit

    def live_cap(self, cap: int) -> int:
        """The upstream's cap now: min(its admission cap, the ready replicas' slots)."""
        return min(cap, self.capacity())

    def held(self, address: str) -> int:
        return self._held.get(address, 0)

    def in_flight(self) -> int:
        """Slots held on every replica, draining ones included."""
        return sum(self._held.values())

    # -- requests -----------------------------------------------------------------------

    def choose(
        self, slots: int = 1, prefer: Sequence[str] = (), max_extra: int = 0, avoid: str | None = None
    ) -> str | None:
        """The replica a request taking `slots` would go to now (nothing is taken); never `avoid`."""
        held, limit, saturated = self._held, self.limit, self._saturated
        ready = [Replica(address=a, state=ReplicaState.READY, in_flight=held.get(a, 0), limit=limit,
                         saturated=a in saturated)
                 for a in self.eligible() if a != avoid]  # fmt: skip
        chosen = pick(ready, slots, self._last, prefer, max_extra)
        return None if chosen is None else chosen.address

    def move(self, address: str, slots: int = 1) -> str | None:
        """The one safe retry: a request holding `slots` on `address` moves to another eligible
        replica with room, in one step (the upstream's count never changes, no replica goes over
        its limit); None, and nothing changes, when no other replica has room."""
        if self._held.get(address, 0) < slots:
            raise KeyError(address)
        target = self.choose(slots, avoid=address)
        if target is not None:
            self.hold(target, slots)
            self.release(address, slots)
            self._last = target
        return target

    def take(self, slots: int = 1, prefer: Sequence[str] = (), max_extra: int = 0) -> str | None:
        """Bind a request taking `slots` to the chosen replica and count them; None: no room."""
        address = self.choose(slots, prefer, max_extra)
        if address is not None:
            self.hold(address, slots)
            self._last = address
        return address

    def hold(self, address: str, slots: int = 1) -> None:
        """Count `slots` on `address` (a request bound to it elsewhere, e.g. restored state)."""
        self._held[address] = self._held.get(address, 0) + slots

    def release(self, address: str, slots: int = 1) -> None:
        """Give back slots; a draining replica left with none is forgotten.

        Raises KeyError when `address` holds fewer than `slots` (a caller bug).
        """
        left = self._held.get(address, 0) - slots
        if left < 0 or address not in self._held:
            raise KeyError(address)
        if left:
            self._held[address] = left
        else:
            del self._held[address]
