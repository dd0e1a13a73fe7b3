"""Dispatch order of one upstream's queue under `fairness = "fifo"`: arrival order (pure).

Ticket ids are issued in arrival order, so the next ticket dispatched is the oldest one
queued, whoever sent it. A ticket's place (`rank`) counts the live queued tickets with an
id <= its own in a Fenwick tree (binary indexed tree) indexed by `id - base`: O(log w),
w = the id window the tree covers. When an id falls past the end, the tree is rebuilt in
O(w) with `base` = the oldest queued id and a capacity of at least twice the live span, so
at least w/2 arrivals pay for each rebuild (amortised O(1)); ids admitted at once never
touch the tree.
"""

from __future__ import annotations


class FifoOrder:
    """The arrival order of queued tickets: push, remove and pop-front in O(1), rank in
    O(log w). Same interface as `FairOrder`; the consumer, priority and weight a ticket
    is pushed with do not change its place.
    """

    __slots__ = ("_base", "_live", "_min_capacity", "_tree")
    newcomers_overtake = False  # a newcomer always goes behind every ticket already queued

    def __init__(self, min_capacity: int = 64) -> None:
        self._min_capacity = max(2, min_capacity)
        self._live: dict[int, None] = {}  # queued tickets, in arrival (= id) order
        self._base = 1
        self._tree = [0] * (self._min_capacity + 1)  # 1-based Fenwick tree

    def __len__(self) -> int:
        return len(self._live)

    def push(self, ticket: int, consumer: str, priority: int, weight: int) -> None:
        """Queue `ticket`, newer than every ticket queued so far."""
        self._live[ticket] = None
        self._mark(ticket, 1)

    def remove(self, ticket: int) -> bool:
        """Take a ticket out without dispatching it."""
        if ticket not in self._live:
            return False
        del self._live[ticket]
        self._mark(ticket, -1)
        return True

    def peek(self) -> int:
        """The ticket `pop` would dispatch (the oldest), without dispatching it."""
        return next(iter(self._live))

    def pop(self) -> int:
        """Dispatch the oldest ticket."""
        ticket = next(iter(self._live))
        del self._live[ticket]
        self._mark(ticket, -1)
        return ticket

    def rank(self, ticket: int) -> int:
        """1 + the number of queued tickets older than `ticket`; 0 when not queued."""
        if ticket not in self._live:
            return 0
        i, tree, n = ticket - self._base + 1, self._tree, 0
        while i > 0:
            n += tree[i]
            i &= i - 1
        return n

    def clear(self) -> None:
        """Forget the queued tickets (draining)."""
        self._live.clear()
        self._tree = [0] * (self._min_capacity + 1)

    # -- internals ---------------------------------------------------------------------

    def _mark(self, ticket: int, delta: int) -> None:
        tree = self._tree
        size = len(tree) - 1
        i = ticket - self._base + 1
        if i > size:
            self._rebuild(ticket)
            tree = self._tree
            size = len(tree) - 1
            i = ticket - self._base + 1
        while i <= size:
            tree[i] += delta
            i += i & -i

    def _rebuild(self, newest: int) -> None:
        """Re-base the tree on the oldest queued ticket, sized for twice the live span."""
        live = [t for t in self._live if t != newest]  # `newest` is marked by the caller
        base = live[0] if live else newest
        size = self._min_capacity
        while size < 2 * (newest - base + 1):
            size *= 2
        tree = [0] * (size + 1)
        for t in live:
            tree[t - base + 1] = 1
        for i in range(1, size + 1):  # O(size) bottom-up build
            j = i + (i & -i)
            if j <= size:
                tree[j] += tree[i]
        self._base, self._tree = base, tree
