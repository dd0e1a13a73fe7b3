"""Dispatch order of one upstream's queue under `fairness = "fair"` (pure).

Start-time fair queueing with virtual finish tags, per priority band. Every
queued request gets, at arrival, the key `(-priority, finish_tag, seq)`; a free slot
takes the smallest key. Per band p there is a virtual time `V[p]` (the finish tag of
the last request dispatched from band p, 0 at start) and per (band, consumer) the finish
tag of its last queued request `last[p][c]`:

    start = max(V[p], last[p][c]);  finish_tag = start + SCALE // min(weight, MAX_WEIGHT)

Tags are integers in units of 1/SCALE, so every backend reproduces them exactly (the
Redis gate computes the same numbers in its scripts). SCALE = 720720 is divisible by
every weight 1..16; a weight above MAX_WEIGHT counts as MAX_WEIGHT for the tag. A request
that leaves the queue early (hang-up, timeout) is removed; tags are never rolled back.

Consequences: equal weights alternate between consumers (A, B, A, B, ...), weight 3 vs 1
gives 3:1 while both wait, a higher priority always goes first, and one consumer's own
requests keep their arrival order (its tags increase with each arrival).
"""

from __future__ import annotations

from typing import cast

from sortedcontainers import SortedList

SCALE = 720720  # lcm(1..16): SCALE // weight is exact for every weight up to MAX_WEIGHT
MAX_WEIGHT = 16

Key = tuple[int, int, int]  # (-priority, finish_tag, seq)


def tag_step(weight: int) -> int:
    """Virtual time one request of a consumer with `weight` costs (weights clamp at 16)."""
    return SCALE // min(max(1, weight), MAX_WEIGHT)


class FairOrder:
    """The keyed order of queued tickets: push, remove, pop-min and rank in O(log n).

    `seq` is the ticket id (ids are arrival order). Knows nothing of deadlines or slots:
    the `WaitQueue` and the `SlotLedger` keep those and ask this class only which ticket
    goes next. Same interface as `FifoOrder`.
    """

    __slots__ = ("_keys", "_last", "_order", "_virtual")
    # a newcomer with a smaller key (a higher priority, or a lighter-loaded consumer) is
    # placed ahead of tickets already queued, even ahead of the head
    newcomers_overtake = True

    def __init__(self) -> None:
        self._order = SortedList()  # of Key
        self._keys: dict[int, Key] = {}  # ticket -> its key
        self._virtual: dict[int, int] = {}  # band (priority) -> V
        self._last: dict[tuple[int, str], int] = {}  # (band, consumer) -> last finish tag

    def __len__(self) -> int:
        return len(self._keys)

    def push(self, ticket: int, consumer: str, priority: int, weight: int) -> Key:
        band = (priority, consumer)
        start = max(self._virtual.get(priority, 0), self._last.get(band, 0))
        finish = start + tag_step(weight)
        self._last[band] = finish
        key = (-priority, finish, ticket)
        self._keys[ticket] = key
        self._order.add(key)
        return key

    def remove(self, ticket: int) -> bool:
        """Take a ticket out without dispatching it (no tag is rolled back)."""
        key = self._keys.pop(ticket, None)
        if key is None:
            return False
        self._order.remove(key)
        return True

    def peek(self) -> int:
        """The ticket `pop` would dispatch (the smallest key), without dispatching it."""
        return cast(Key, self._order[0])[2]

    def pop(self) -> int:
        """Dispatch the smallest key; its band's virtual time moves to its finish tag."""
        key = cast(Key, self._order.pop(0))
        neg_priority, finish, ticket = key
        del self._keys[ticket]
        self._virtual[-neg_priority] = finish
        return ticket

    def rank(self, ticket: int) -> int:
        """1 + the number of queued tickets with a smaller key; 0 when not queued."""
        key = self._keys.get(ticket)
        if key is None:
            return 0
        return cast(int, self._order.bisect_left(key)) + 1

    def key(self, ticket: int) -> Key | None:
        return self._keys.get(ticket)

    def clear(self) -> None:
        """Forget the queued tickets (draining); virtual times stay, like the tags."""
        self._order.clear()
        self._keys.clear()
