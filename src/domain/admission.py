"""Admission policy and the slot ledger of one upstream (pure: time comes in as `now`)."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TypeVar

import msgspec

from domain.consumers import ANONYMOUS, Consumer
from domain.errors import TooManySequences
from domain.fair_queue import FairOrder
from domain.replicas import Replica, ReplicaSet

K = TypeVar("K")
FIFO, FAIR = "fifo", "fair"
FAIRNESS = (FIFO, FAIR)

class AdmissionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Cap, queue depth and queue wait of one upstream (no defaults on purpose), and the
    queue's order: `fifo` (arrival order) or `fair` (domain.fair_queue); optionally the
    most requests one consumer may have waiting (None: up to `queue_depth`)."""

    max_in_flight: int
    queue_depth: int
    queue_timeout_seconds: float
    fairness: str = FIFO
    max_queued_per_consumer: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> AdmissionPolicy:
        """Return self, or raise ValueError naming the first invalid field."""
        for name in ("max_in_flight", "queue_depth"):
            value, low = getattr(self, name), 1 if name == "max_in_flight" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        t = self.queue_timeout_seconds
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < math.inf:
            raise ValueError(f"queue_timeout_seconds must be a number > 0, got {t!r}")
        if self.fairness not in FAIRNESS:
            raise ValueError(f"fairness must be one of {', '.join(FAIRNESS)}, got {self.fairness!r}")
        m = self.max_queued_per_consumer
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"max_queued_per_consumer must be an integer >= 1, got {m!r}")
        return self


class Outcome(enum.Enum):
    ADMITTED = "admitted"  # holds a slot now
    QUEUED = "queued"  # waits in the FIFO until `deadline`
    REJECTED = "rejected"  # queue full: answer 503 + Retry-After
    CLOSED = "closed"  # ledger closed (draining): answer 503 + Retry-After


class Decision(msgspec.Struct, frozen=True, gc=False):
    outcome: Outcome
    ticket: int
    deadline: float = 0.0  # QUEUED only
    retry_after: int = 0  # REJECTED and CLOSED only


class Cancel(enum.Enum):
    WITHDRAWN = "withdrawn"  # was queued, has left the queue: nothing else to do
    HOLDS_SLOT = "holds_slot"  # already admitted: the caller must `release` it
    ENDED = "ended"  # already ended (released, expired, withdrawn, drained, rejected)


def _decrement(counts: dict[K, int], key: K) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


DEFAULT_RETRY_AFTER = 1  # seconds, until a service time has been observed
MAX_RETRY_AFTER = 10  # keep Retry-After small: clients ignore or cap long ones
EWMA_ALPHA = 0.2  # weight of the newest service time


class SlotLedger:
    """State machine of ONE upstream's slots and queue, over integer tickets.

    Every `arrive` issues a new ticket id (1, 2, 3, ...; ids are arrival order). A ticket
    ends exactly once: released after admission, withdrawn by `cancel`, expired (reported
    by `expire`), drained by `close`, or rejected at arrival. Invariant: a ticket waits
    only while the queue's head does not fit, so free slots never idle next to a head
    that could take them.

    Sequences, not requests: a ticket takes `slots` (k >= 1) of the cap, all at once or
    none. It waits until k are free IN ITS PLACE in the queue: the head is admitted first
    or nobody is (head-of-line), so a k-request at the head is never overtaken by later
    1-requests; a head that leaves (admitted, cancelled, expired) lets the next one in
    at once if it fits. k above the cap can never be granted: `TooManySequences`.

    Replicas (`replica_limit` given): the ledger holds a `ReplicaSet` (none ready until
    `set_replicas`). A ticket fits when in_flight + k <= the live cap (min(cap, the ready
    replicas' slots)) AND one ready replica has k free; admission binds it to
    `domain.replicas.pick`'s choice (fewest in flight, ties round robin) in the same step,
    and `binding` tells which. k above `replica_limit` is `TooManySequences` too.

    Design, so that no operation walks the queue:
    - the queue is an OrderedDict ticket -> deadline: append, pop-front and removal from
      the middle (a hang-up) are O(1). All tickets get the same timeout and `now` never
      goes backwards, so deadlines ascend from the front and expiry pops from the front;
    - `position` counts live queued tickets with an id <= mine in a Fenwick tree (binary
      indexed tree) indexed by `id - base`: O(log w), w = the id window it covers. When an
      id falls past the end, the tree is rebuilt in O(w) with `base` = the oldest queued
      id and a capacity of at least twice the live span, so at least w/2 arrivals pay for
      each rebuild (amortised O(1)); ids admitted at once never touch the tree;
    - tickets found past their deadline by `arrive` or `release` leave the queue at once
      (they are never admitted) and are reported by the next `expire`;
    - under `fairness = "fair"` the dispatch order and positions come from a `FairOrder`
      (a sorted list of keys: O(log n) each) instead of the front of the OrderedDict and
      the Fenwick tree; the OrderedDict still holds deadlines, which stay in arrival
      order, so expiry is unchanged. `fifo` never touches it: today's behaviour exactly.

    Retry-After, in whole seconds: ceil(S * (ahead + 1) / max_in_flight) clamped to
    [1, MAX_RETRY_AFTER], where S is an EWMA (alpha EWMA_ALPHA) of observed service times
    (admission -> release) and `ahead` the requests queued in front; DEFAULT_RETRY_AFTER
    until the first release.
    """

    __slots__ = (
        "_admitted",
        "_base",
        "_by_consumer",
        "_by_priority",
        "_fair",
        "_granted",
        "_lapsed",
        "_min_capacity",
        "_next",
        "_queue",
        "_service",
        "_tree",
        "_used",
        "_want",
        "_who",
        "abandoned",
        "admitted",
        "closed",
        "drained",
        "policy",
        "queued_total",
        "rejected_draining",
        "rejected_full",
        "replicas",
        "timed_out",
    )

    def __init__(self, policy: AdmissionPolicy, *, min_capacity: int = 64, replica_limit: int | None = None) -> None:
        self.policy = policy.validate()
        self.closed = False
        self._next = 1
        self._queue: OrderedDict[int, float] = OrderedDict()  # ticket -> deadline
        # ticket -> (admitted at, slots, replica address or None)
        self._admitted: dict[int, tuple[float, int, str | None]] = {}
        self._used = 0  # slots held by admitted tickets (sum of their k)
        self._want: dict[int, int] = {}  # queued ticket -> slots it asks for (only k > 1)
        self._granted: list[int] = []  # queued tickets admitted, not yet reported
        self.replicas = None if replica_limit is None else ReplicaSet(replica_limit)
        self._lapsed: list[int] = []  # expired, not yet reported by `expire`
        self._min_capacity = max(2, min_capacity)
        self._base = 1
        self._tree = [0] * (self._min_capacity + 1)  # 1-based Fenwick tree
        self._service: float | None = None
        self._fair = FairOrder() if policy.fairness == FAIR else None
        self._who: dict[int, tuple[str, int]] = {}  # queued ticket -> (consumer, priority)
        self._by_consumer: dict[str, int] = {}  # consumer -> its queued tickets
        self._by_priority: dict[int, int] = {}  # priority -> queued tickets
        # cumulative outcomes, for metrics
        self.admitted = self.queued_total = self.rejected_full = self.rejected_draining = 0
        self.timed_out = self.abandoned = self.drained = 0

    @property
    def in_flight(self) -> int:
        """Slots held (a ticket taking k counts k)."""
        return self._used

    @property
    def requests(self) -> int:
        """Admitted tickets holding slots."""
        return len(self._admitted)

    def live_cap(self) -> int:
        """The cap now: the admission cap, or with replicas min(it, the ready replicas' slots)."""
        cap = self.policy.max_in_flight
        return cap if self.replicas is None else self.replicas.live_cap(cap)

    def binding(self, ticket: int) -> tuple[int, str | None]:
        """(slots, replica) of an admitted ticket; KeyError when it holds none."""
        _, slots, replica = self._admitted[ticket]
        return slots, replica

    def replica_view(self) -> list[Replica]:
        """The replicas now (ready and draining, in address order); [] without replicas."""
        return [] if self.replicas is None else self.replicas.replicas()

    def set_replicas(self, ready: Iterable[str], now: float) -> list[int]:
        """A new discovery answer: missing replicas drain, new ones take requests; returns the
        queued tickets admitted because capacity appeared (also reported by `granted`)."""
        if self.replicas is None:
            raise ValueError("this ledger has no replicas")
        self.replicas.update(ready)
        self._promote(now)
        return self.granted()

    def set_ejected(self, addresses: Iterable[str], now: float) -> list[int]:
        """The replicas ejected now (`domain.ejection`; the whole set): they get no new request
        and their slots leave the live cap. Returns the queued tickets admitted because
        capacity came back (a replica returned)."""
        if self.replicas is None:
            raise ValueError("this ledger has no replicas")
        self.replicas.set_ejected(addresses)
        self._promote(now)
        return self.granted()

    def set_saturated(self, addresses: Iterable[str], now: float) -> list[int]:
        """The replicas whose own metrics say they have no room now (`domain.load_reports`;
        the whole set): no new request for them. Returns the queued tickets admitted because
        one has room again."""
        if self.replicas is None:
            raise ValueError("this ledger has no replicas")
        self.replicas.set_saturated(addresses)
        self._promote(now)
        return self.granted()

    def move(self, ticket: int, now: float) -> tuple[str | None, list[int]]:
        """The one safe retry: an admitted ticket's slots move to another eligible replica with
        room, in one step (the upstream's count never changes, no replica goes over its
        limit). Returns (the new replica or None when no other has room: nothing changed,
        the queued tickets admitted on the room the move left)."""
        started, slots, replica = self._admitted[ticket]
        if replica is None or self.replicas is None:
            return None, []
        target = self.replicas.move(replica, slots)
        if target is None:
            return None, []
        self._admitted[ticket] = (started, slots, target)
        if self._queue:
            self._promote(now)
        return target, self.granted()

    def granted(self) -> list[int]:
        """Queued tickets admitted since the last call (by any operation), in dispatch order."""
        out, self._granted = self._granted, []
        return out

    def check(self, slots: int) -> None:
        """Raise `TooManySequences` when `slots` could never be granted here."""
        cap = self.policy.max_in_flight
        if slots > cap:
            raise TooManySequences(slots, cap)
        if self.replicas is not None and slots > self.replicas.limit:
            raise TooManySequences(slots, self.replicas.limit)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def holds(self, ticket: int) -> bool:
        """True while `ticket` holds a slot (admitted, not yet released)."""
        return ticket in self._admitted

    def is_queued(self, ticket: int) -> bool:
        return ticket in self._queue

    def queued_by_priority(self) -> dict[int, int]:
        """Queued tickets per consumer priority (only priorities with some)."""
        return dict(self._by_priority)

    def oldest_wait(self, now: float) -> float | None:
        """How long the longest-waiting queued ticket has waited; None while nobody waits.

        Every ticket's deadline is its arrival plus the one timeout, and the queue's front
        (arrival order, whatever the dispatch order) has the earliest."""
        for deadline in self._queue.values():
            return max(0.0, now - (deadline - self.policy.queue_timeout_seconds))
        return None

    def queued_of(self, consumer: str) -> int:
        return self._by_consumer.get(consumer, 0)

    def arrive(
        self, now: float, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> Decision:
        """Admit, queue or reject a request taking `slots`; raises `TooManySequences` (and
        issues no ticket) when `slots` is above the cap or the replica limit.

        `prefer`/`max_extra`: affinity (`domain.replicas.pick`), for a request admitted at
        arrival; one admitted later from the queue goes to the least loaded (the replica it
        preferred may well have filled meanwhile, and the queue keeps no per-ticket wishes)."""
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        self.check(slots)
        ticket = self._next
        self._next = ticket + 1
        if self.closed:
            self.rejected_draining += 1
            return Decision(Outcome.CLOSED, ticket, retry_after=DEFAULT_RETRY_AFTER)
        policy = self.policy
        if self._queue:
            self._lapse(now)
            if self._queue:
                self._promote(now)  # a head that lapsed may have let the next ones in
        if not self._queue and self._admit(ticket, slots, now, prefer, max_extra):
            return Decision(Outcome.ADMITTED, ticket)
        name, share = consumer.name, policy.max_queued_per_consumer
        if len(self._queue) >= policy.queue_depth or (share is not None and self.queued_of(name) >= share):
            self.rejected_full += 1
            return Decision(Outcome.REJECTED, ticket, retry_after=self.retry_after())
        deadline = now + policy.queue_timeout_seconds
        self._queue[ticket] = deadline
        priority = consumer.priority
        self._who[ticket] = (name, priority)
        self._by_consumer[name] = self._by_consumer.get(name, 0) + 1
        self._by_priority[priority] = self._by_priority.get(priority, 0) + 1
        if slots != 1:
            self._want[ticket] = slots
        fair = self._fair
        if fair is None:
            self._mark(ticket, 1)
        else:
            fair.push(ticket, name, priority, consumer.weight)
            # placed ahead of a head that does not fit (a k-request, or no replica with
            # room for it), a newcomer that fits is the head now: it goes in at once
            if fair.peek() == ticket and self._admit(ticket, slots, now, prefer, max_extra):
                fair.pop()
                del self._queue[ticket]
                self._forget(ticket)
                return Decision(Outcome.ADMITTED, ticket)
        self.queued_total += 1
        return Decision(Outcome.QUEUED, ticket, deadline)

    def release(self, ticket: int, now: float) -> list[int]:
        """Free all of `ticket`'s slots (and its replica's); return the tickets admitted in
        its place (with any not yet reported by `granted`), in dispatch order.

        Raises KeyError if `ticket` holds no slot (a double release is a caller bug).
        """
        started, slots, replica = self._admitted.pop(ticket)
        self._used -= slots
        if replica is not None:
            assert self.replicas is not None
            self.replicas.release(replica, slots)
        took = max(0.0, now - started)
        s = self._service
        self._service = took if s is None else s + EWMA_ALPHA * (took - s)
        if self._queue:
            self._lapse(now)
            self._promote(now)
        return self.granted()

    def cancel(self, ticket: int, now: float | None = None) -> Cancel:
        """The requester hung up: withdraw a queued ticket, or say it holds a slot.

        A withdrawn head may let the next tickets in (a k-request blocked them): they are
        admitted at `now` (given) and reported by `granted`."""
        if self._queue.pop(ticket, None) is not None:
            self._unqueue(ticket)
            self.abandoned += 1
            if now is not None and self._queue:
                self._promote(now)
            return Cancel.WITHDRAWN
        return Cancel.HOLDS_SLOT if ticket in self._admitted else Cancel.ENDED

    def expire(self, now: float) -> list[int]:
        """Queued tickets whose deadline has passed (deadline <= now), oldest first.

        They leave the queue; tickets that already left in `arrive`/`release` come first.
        """
        self._lapse(now)
        if not self._lapsed:
            return []
        if self._queue:
            self._promote(now)  # the lapsed head may have blocked the next ones (see `granted`)
        out, self._lapsed = self._lapsed, []
        return out

    def position(self, ticket: int) -> int:
        """1-based place among queued tickets (1 = admitted next); 0 when not queued."""
        if ticket not in self._queue:
            return 0
        if self._fair is not None:
            return self._fair.rank(ticket)
        i, tree, n = ticket - self._base + 1, self._tree, 0
        while i > 0:
            n += tree[i]
            i &= i - 1
        return n

    def close(self) -> list[int]:
        """Stop admitting (draining): return every queued ticket, oldest first.

        Admitted tickets keep their slots and are still released as usual.
        """
        self.closed = True
        out = list(self._queue)
        self._queue.clear()
        self._who.clear()
        self._by_consumer.clear()
        self._by_priority.clear()
        self._want.clear()
        if self._fair is not None:
            self._fair.clear()
        self.drained += len(out)
        self._tree = [0] * (self._min_capacity + 1)
        self._base = self._next
        return out

    def retry_after(self, ahead: int | None = None) -> int:
        """Seconds a client should wait before retrying; `ahead` defaults to the queue."""
        s = self._service
        if s is None:
            return DEFAULT_RETRY_AFTER
        n = len(self._queue) if ahead is None else ahead
        est = math.ceil(s * (n + 1) / self.policy.max_in_flight)
        return min(MAX_RETRY_AFTER, max(1, est))

    def counters(self) -> dict[str, int]:
        return {
            "admitted": self.admitted,
            "queued": self.queued_total,
            "rejected_full": self.rejected_full,
            "rejected_draining": self.rejected_draining,
            "timed_out": self.timed_out,
            "abandoned": self.abandoned,
            "drained": self.drained,
        }

    # -- internals ---------------------------------------------------------------------

    def _admit(
        self, ticket: int, slots: int, now: float, prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> bool:
        """Take `slots` for `ticket` (and bind a replica) if they fit now; False if not."""
        if self._used + slots > self.live_cap():
            return False
        replica = None
        if self.replicas is not None:
            replica = self.replicas.take(slots, prefer, max_extra)
            if replica is None:
                return False
        self._admitted[ticket] = (now, slots, replica)
        self._used += slots
        self.admitted += 1
        return True

    def _promote(self, now: float) -> None:
        """Admit queue heads while the head fits (head-of-line: never one from behind it)."""
        queue, fair, want = self._queue, self._fair, self._want
        while queue:
            head = next(iter(queue)) if fair is None else fair.peek()
            if not self._admit(head, want.get(head, 1), now):
                return
            if fair is None:
                del queue[head]
                self._mark(head, -1)
            else:
                fair.pop()
                del queue[head]
            self._forget(head)
            self._granted.append(head)

    def _lapse(self, now: float) -> None:
        queue = self._queue
        while queue:
            head = next(iter(queue))
            if queue[head] > now:
                return
            del queue[head]
            self._unqueue(head)
            self._lapsed.append(head)
            self.timed_out += 1

    def _unqueue(self, ticket: int) -> None:
        """Take a ticket that left `_queue` out of the order and the counts."""
        if self._fair is None:
            self._mark(ticket, -1)
        else:
            self._fair.remove(ticket)
        self._forget(ticket)

    def _forget(self, ticket: int) -> None:
        self._want.pop(ticket, None)
        name, priority = self._who.pop(ticket)
        _decrement(self._by_consumer, name)
        _decrement(self._by_priority, priority)

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
        live = [t for t in self._queue if t != newest]  # `newest` is marked by the caller
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
