"""The slot ledger of one upstream: tickets, slots and replicas (pure: time comes in as `now`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from domain.admission.decisions import Cancel, Decision, Outcome
from domain.admission.holdings import SlotHoldings
from domain.admission.policy import AdmissionPolicy
from domain.admission.retry_after import DEFAULT_RETRY_AFTER, EWMA_ALPHA, retry_after
from domain.admission.wait_queue import WaitQueue
from domain.consumers import ANONYMOUS, Consumer
from domain.replicas import Replica


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

    Who holds what is a `SlotHoldings`; the queue is a `WaitQueue` (deadlines in arrival
    order, and the dispatch order and positions of the policy's `fairness`: `FifoOrder` or
    `FairOrder` or `TokenOrder`); no operation walks either. Tickets found past their deadline by `arrive`
    or `release` leave the queue at once (never admitted) and are reported by `expire`.

    Retry-After: `domain.admission.retry_after`, from the service times of released tickets.
    """

    __slots__ = (
        "_granted", "_held", "_lapsed", "_next", "_queue", "_service", "_waiting",
        "abandoned", "admitted", "closed", "drained", "policy", "queued_total",
        "rejected_draining", "rejected_full", "replicas", "timed_out", "tokens",
    )

    def __init__(self, policy: AdmissionPolicy, *, min_capacity: int = 64, replica_limit: int | None = None) -> None:
        self.policy = policy.validate()
        self.closed = False
        self._next = 1
        self._queue = WaitQueue(policy.fairness, min_capacity, policy.output_token_weight)
        self.tokens = self._queue.tokens  # the consumers' token service under "tokens", else None
        self._waiting = self._queue.deadlines  # read only: is anyone queued, how many
        self._held = SlotHoldings(policy.max_in_flight, replica_limit)
        self._granted: list[int] = []  # queued tickets admitted, not yet reported
        self.replicas = self._held.replicas  # None without replicas
        self._lapsed: list[int] = []  # expired, not yet reported by `expire`
        self._service: float | None = None  # EWMA of service times (admission -> release)
        # cumulative outcomes, for metrics
        self.admitted = self.queued_total = self.rejected_full = self.rejected_draining = 0
        self.timed_out = self.abandoned = self.drained = 0

    @property
    def in_flight(self) -> int:
        """Slots held (a ticket taking k counts k)."""
        return self._held.used

    @property
    def requests(self) -> int:
        """Admitted tickets holding slots."""
        return len(self._held)

    def live_cap(self) -> int:
        """The cap now: the admission cap, or with replicas min(it, the ready replicas' slots)."""
        return self._held.live_cap()

    def binding(self, ticket: int) -> tuple[int, str | None]:
        """(slots, replica) of an admitted ticket; KeyError when it holds none."""
        return self._held.binding(ticket)

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
        target = self._held.move(ticket)
        if target is None:
            return None, []
        if self._waiting:
            self._promote(now)
        return target, self.granted()

    def granted(self) -> list[int]:
        """Queued tickets admitted since the last call (by any operation), in dispatch order."""
        out, self._granted = self._granted, []
        return out

    def check(self, slots: int) -> None:
        """Raise `TooManySequences` when `slots` could never be granted here."""
        self._held.check(slots)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def holds(self, ticket: int) -> bool:
        """True while `ticket` holds a slot (admitted, not yet released)."""
        return ticket in self._held

    def is_queued(self, ticket: int) -> bool:
        return ticket in self._waiting

    def queued_by_priority(self) -> dict[int, int]:
        """Queued tickets per consumer priority (only priorities with some)."""
        return self._queue.by_priority()

    def oldest_wait(self, now: float) -> float | None:
        """How long the longest-waiting queued ticket has waited; None while nobody waits.

        Every ticket's deadline is its arrival plus the one timeout, and the queue's front
        (arrival order, whatever the dispatch order) has the earliest."""
        deadline = self._queue.oldest_deadline()
        return None if deadline is None else max(0.0, now - (deadline - self.policy.queue_timeout_seconds))

    def queued_of(self, consumer: str) -> int:
        return self._queue.queued_of(consumer)

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
        policy, queue, waiting = self.policy, self._queue, self._waiting
        if waiting:
            self._lapse(now)
            if waiting:
                self._promote(now)  # a head that lapsed may have let the next ones in
        if not waiting and self._admit(ticket, slots, now, prefer, max_extra):
            if self.tokens is not None:  # who a newcomer to an empty band is lifted to
                self.tokens.admitted(ticket, consumer.name, consumer.priority)
            return Decision(Outcome.ADMITTED, ticket)
        share = policy.max_queued_per_consumer
        if len(waiting) >= policy.queue_depth or (share is not None and queue.queued_of(consumer.name) >= share):
            self.rejected_full += 1
            return Decision(Outcome.REJECTED, ticket, retry_after=self.retry_after())
        deadline = now + policy.queue_timeout_seconds
        queue.push(ticket, deadline, consumer, slots)
        # placed ahead of a head that does not fit (a k-request, or no replica with room
        # for it), a newcomer that fits is the head now: it goes in at once
        if queue.newcomers_overtake and queue.head() == ticket and self._admit(ticket, slots, now, prefer, max_extra):
            queue.pop_head()
            return Decision(Outcome.ADMITTED, ticket)
        self.queued_total += 1
        return Decision(Outcome.QUEUED, ticket, deadline)

    def release(self, ticket: int, now: float) -> list[int]:
        """Free all of `ticket`'s slots (and its replica's); return the tickets admitted in
        its place (with any not yet reported by `granted`), in dispatch order.

        Raises KeyError if `ticket` holds no slot (a double release is a caller bug).
        """
        started = self._held.give_back(ticket)
        if self.tokens is not None:  # its consumer may be idle now (the lift's condition)
            self.tokens.released(ticket)
        took = max(0.0, now - started)
        s = self._service
        self._service = took if s is None else s + EWMA_ALPHA * (took - s)
        if self._waiting:
            self._lapse(now)
            self._promote(now)
        return self.granted()

    def cancel(self, ticket: int, now: float | None = None) -> Cancel:
        """The requester hung up: withdraw a queued ticket, or say it holds a slot.

        A withdrawn head may let the next tickets in (a k-request blocked them): they are
        admitted at `now` (given) and reported by `granted`."""
        if self._queue.withdraw(ticket):
            self.abandoned += 1
            if now is not None and self._waiting:
                self._promote(now)
            return Cancel.WITHDRAWN
        return Cancel.HOLDS_SLOT if ticket in self._held else Cancel.ENDED

    def expire(self, now: float) -> list[int]:
        """Queued tickets whose deadline has passed (deadline <= now), oldest first.

        They leave the queue; tickets that already left in `arrive`/`release` come first.
        """
        self._lapse(now)
        if not self._lapsed:
            return []
        if self._waiting:
            self._promote(now)  # the lapsed head may have blocked the next ones (see `granted`)
        out, self._lapsed = self._lapsed, []
        return out

    def position(self, ticket: int) -> int:
        """1-based place among queued tickets (1 = admitted next); 0 when not queued."""
        return self._queue.position(ticket)

    def close(self) -> list[int]:
        """Stop admitting (draining): return every queued ticket, oldest first.

        Admitted tickets keep their slots and are still released as usual.
        """
        self.closed = True
        out = self._queue.clear()
        self.drained += len(out)
        return out

    def retry_after(self, ahead: int | None = None) -> int:
        """Seconds a client should wait before retrying; `ahead` defaults to the queue."""
        n = len(self._waiting) if ahead is None else ahead
        return retry_after(self._service, n, self.policy.max_in_flight)

    def counters(self) -> dict[str, int]:
        return {"admitted": self.admitted, "queued": self.queued_total, "rejected_full": self.rejected_full,
                "rejected_draining": self.rejected_draining, "timed_out": self.timed_out,
                "abandoned": self.abandoned, "drained": self.drained}

    # -- internals ---------------------------------------------------------------------

    def _admit(
        self, ticket: int, slots: int, now: float, prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> bool:
        """Take `slots` for `ticket` (and bind a replica) if they fit now; False if not."""
        if not self._held.take(ticket, slots, now, prefer, max_extra):
            return False
        self.admitted += 1
        return True

    def _promote(self, now: float) -> None:
        """Admit queue heads while the head fits (head-of-line: never one from behind it)."""
        queue, waiting = self._queue, self._waiting
        while waiting:
            head = queue.head()
            if not self._admit(head, queue.want(head), now):
                return
            queue.pop_head()
            self._granted.append(head)

    def _lapse(self, now: float) -> None:
        lapsed = self._queue.lapse(now)
        if lapsed:
            self._lapsed += lapsed
            self.timed_out += len(lapsed)
