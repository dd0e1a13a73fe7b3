"""The slots one upstream's admitted tickets hold, and the replica each is bound to (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from domain.errors import TooManySequences
from domain.replicas import ReplicaSet


class SlotHoldings:
    """Admitted tickets and their slots, counted against the cap.

    A ticket takes `slots` (k >= 1) all at once or none. With replicas (`replica_limit`
    given) the holdings keep a `ReplicaSet` (none ready until it is told): a ticket fits
    when used + k <= the live cap (min(cap, the ready replicas' slots)) AND one ready
    replica has k free, and taking the slots binds it to `domain.replicas.pick`'s choice
    in the same step.
    """

    __slots__ = ("_held", "cap", "replicas", "used")

    def __init__(self, cap: int, replica_limit: int | None = None) -> None:
        self.cap = cap
        self.replicas = None if replica_limit is None else ReplicaSet(replica_limit)
        # ticket -> (admitted at, slots, replica address or None)
        self._held: dict[int, tuple[float, int, str | None]] = {}
        self.used = 0  # slots held (sum of the tickets' k)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, ticket: int) -> bool:
        return ticket in self._held

    def __iter__(self) -> Iterator[int]:
        """The tickets holding slots, in the order they were admitted."""
        return iter(self._held)

    def live_cap(self) -> int:
        """The cap now: the admission cap, or with replicas min(it, the ready replicas' slots)."""
        cap = self.cap
        return cap if self.replicas is None else self.replicas.live_cap(cap)

    def check(self, slots: int) -> None:
        """Raise `TooManySequences` when `slots` could never be granted here."""
        cap = self.cap
        if slots > cap:
            raise TooManySequences(slots, cap)
        if self.replicas is not None and slots > self.replicas.limit:
            raise TooManySequences(slots, self.replicas.limit)

    def binding(self, ticket: int) -> tuple[int, str | None]:
        """(slots, replica) of a ticket; KeyError when it holds none."""
        _, slots, replica = self._held[ticket]
        return slots, replica

    def take(self, ticket: int, slots: int, now: float, prefer: Sequence[str] = (), max_extra: int = 0) -> bool:
        """Take `slots` for `ticket` (and bind a replica) if they fit now; False if not."""
        replicas = self.replicas
        if self.used + slots > (self.cap if replicas is None else replicas.live_cap(self.cap)):
            return False  # the live cap, inline: this runs for every admission
        replica = None
        if replicas is not None:
            replica = replicas.take(slots, prefer, max_extra)
            if replica is None:
                return False
        self._held[ticket] = (now, slots, replica)
        self.used += slots
        return True

    def give_back(self, ticket: int) -> float:
        """Free all of `ticket`'s slots (and its replica's); return when it was admitted.
        KeyError when it holds none."""
        started, slots, replica = self._held.pop(ticket)
        self.used -= slots
        if replica is not None:
            assert self.replicas is not None
            self.replicas.release(replica, slots)
        return started

    def move(self, ticket: int) -> str | None:
        """Move `ticket`'s slots to another eligible replica with room, in one step; the new
        replica, or None (nothing changed) when none has room or there are no replicas.
        KeyError when it holds none."""
        started, slots, replica = self._held[ticket]
        if replica is None or self.replicas is None:
            return None
        target = self.replicas.move(replica, slots)
        if target is not None:
            self._held[ticket] = (started, slots, target)
        return target
