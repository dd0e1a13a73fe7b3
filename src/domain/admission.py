"""Admission policy and the slot ledger of one upstream (pure: time comes in as `now`)."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict

import msgspec


class AdmissionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Cap, queue depth and queue wait of one upstream; no defaults on purpose."""

    max_in_flight: int
    queue_depth: int
    queue_timeout_seconds: float
    fairness: str = "fifo"
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


DEFAULT_RETRY_AFTER = 1  # seconds, until a service time has been observed
MAX_RETRY_AFTER = 10  # keep Retry-After small: clients ignore or cap long ones
EWMA_ALPHA = 0.2  # weight of the newest service time


class SlotLedger:
    """State machine of ONE upstream's slots and FIFO queue, over integer tickets.

    Every `arrive` issues a new ticket id (1, 2, 3, ...; ids are arrival order). A ticket
    ends exactly once: released after admission, withdrawn by `cancel`, expired (reported
    by `expire`), drained by `close`, or rejected at arrival. Invariant: a ticket waits
    only while every slot is taken, so a free slot never idles next to a waiter.

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
      (they are never admitted) and are reported by the next `expire`.

    Retry-After, in whole seconds: ceil(S * (ahead + 1) / max_in_flight) clamped to
    [1, MAX_RETRY_AFTER], where S is an EWMA (alpha EWMA_ALPHA) of observed service times
    (admission -> release) and `ahead` the requests queued in front; DEFAULT_RETRY_AFTER
    until the first release.
    """

    __slots__ = (
        "_admitted",
        "_base",
        "_lapsed",
        "_min_capacity",
        "_next",
        "_queue",
        "_service",
        "_tree",
        "abandoned",
        "admitted",
        "closed",
        "drained",
        "policy",
        "queued_total",
        "rejected_draining",
        "rejected_full",
        "timed_out",
    )

    def __init__(self, policy: AdmissionPolicy, *, min_capacity: int = 64) -> None:
        self.policy = policy.validate()
        self.closed = False
        self._next = 1
        self._queue: OrderedDict[int, float] = OrderedDict()  # ticket -> deadline
        self._admitted: dict[int, float] = {}  # ticket -> admitted at
        self._lapsed: list[int] = []  # expired, not yet reported by `expire`
        self._min_capacity = max(2, min_capacity)
        self._base = 1
        self._tree = [0] * (self._min_capacity + 1)  # 1-based Fenwick tree
        self._service: float | None = None
        # cumulative outcomes, for metrics
        self.admitted = self.queued_total = self.rejected_full = self.rejected_draining = 0
        self.timed_out = self.abandoned = self.drained = 0

    @property
    def in_flight(self) -> int:
        return len(self._admitted)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def holds(self, ticket: int) -> bool:
        """True while `ticket` holds a slot (admitted, not yet released)."""
        return ticket in self._admitted

    def is_queued(self, ticket: int) -> bool:
        return ticket in self._queue

    def arrive(self, now: float) -> Decision:
        ticket = self._next
        self._next = ticket + 1
        if self.closed:
            self.rejected_draining += 1
            return Decision(Outcome.CLOSED, ticket, retry_after=DEFAULT_RETRY_AFTER)
        policy = self.policy
        if len(self._admitted) < policy.max_in_flight:  # then the queue is empty
            self._admitted[ticket] = now
            self.admitted += 1
            return Decision(Outcome.ADMITTED, ticket)
        self._lapse(now)
        if len(self._queue) >= policy.queue_depth:
            self.rejected_full += 1
            return Decision(Outcome.REJECTED, ticket, retry_after=self.retry_after())
        deadline = now + policy.queue_timeout_seconds
        self._queue[ticket] = deadline
        self.queued_total += 1
        self._mark(ticket, 1)
        return Decision(Outcome.QUEUED, ticket, deadline)

    def release(self, ticket: int, now: float) -> list[int]:
        """Free `ticket`'s slot; return the tickets admitted in its place, in FIFO order.

        Raises KeyError if `ticket` holds no slot (a double release is a caller bug).
        """
        started = self._admitted.pop(ticket)
        took = max(0.0, now - started)
        s = self._service
        self._service = took if s is None else s + EWMA_ALPHA * (took - s)
        if not self._queue:
            return []
        self._lapse(now)
        promoted: list[int] = []
        queue, admitted, cap = self._queue, self._admitted, self.policy.max_in_flight
        while queue and len(admitted) < cap:
            head, _ = queue.popitem(last=False)
            self._mark(head, -1)
            admitted[head] = now
            promoted.append(head)
        self.admitted += len(promoted)
        return promoted

    def cancel(self, ticket: int) -> Cancel:
        """The requester hung up: withdraw a queued ticket, or say it holds a slot."""
        if self._queue.pop(ticket, None) is not None:
            self._mark(ticket, -1)
            self.abandoned += 1
            return Cancel.WITHDRAWN
        return Cancel.HOLDS_SLOT if ticket in self._admitted else Cancel.ENDED

    def expire(self, now: float) -> list[int]:
        """Queued tickets whose deadline has passed (deadline <= now), oldest first.

        They leave the queue; tickets that already left in `arrive`/`release` come first.
        """
        self._lapse(now)
        if not self._lapsed:
            return []
        out, self._lapsed = self._lapsed, []
        return out

    def position(self, ticket: int) -> int:
        """1-based place among queued tickets (1 = admitted next); 0 when not queued."""
        if ticket not in self._queue:
            return 0
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

    def _lapse(self, now: float) -> None:
        queue = self._queue
        while queue:
            head = next(iter(queue))
            if queue[head] > now:
                return
            del queue[head]
            self._mark(head, -1)
            self._lapsed.append(head)
            self.timed_out += 1

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
