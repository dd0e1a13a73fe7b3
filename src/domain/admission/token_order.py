"""Dispatch order of one upstream's queue under `fairness = "tokens"` (pure).

The Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI
2024). Each consumer has a *service* counter on the upstream: the tokens it was served,
`input + output_token_weight x output` (`domain.fairness.weighted_tokens`), divided by its
`weight`. The caller charges it (`charge`): the prompt's estimate when a request is admitted,
its output as it is generated, and at the end the upstream's usage corrects both. A free slot
takes, from the highest priority band with someone waiting (bands stay strict), the oldest
ticket of the waiting consumer with the least service (ties: the consumer whose oldest ticket
is older). So a consumer asking for long answers is dispatched less often than one asking for
short ones, until their services even out.

The lift: a consumer that starts waiting while it was IDLE on the upstream (nothing queued in
the band AND no request of its own holding slots) has its service raised to the least service
among the band's waiting consumers (nobody waits: to the service now of the consumer last
admitted in the band, from the queue or at once), never lowered. A long-idle consumer's low
count then does not let it take every slot until it caught up, and the others' use while it
was away does not count against them; what it keeps is only an excess over the others it
built up since it last waited (it was served while they waited), which is what stops a
consumer from shedding its count by pausing.

Why requests holding slots count: a client keeping about twice the cap in flight often has
nothing queued for an instant (its running requests end, its queued ones are dispatched, its
next ones arrive a moment later). It never left; lifting it then would throw away the deficit
it is catching up on, every cycle, and a consumer asking for long answers would get more than
its share. So the order knows each consumer's admitted, not yet released requests (`admitted`
at once, `pop` from the queue, `released`; a lease moved to another replica is still held).

Counters live as long as the order (one per consumer of the keys file: bounded) and are
floats: corrections may be negative (the prompt estimate leans high). The held requests are
one entry per admitted ticket not yet released (at most the cap's). `rank` is an estimate:
future charges decide the real order; it counts the higher bands' tickets and, within the
band, a round robin over the waiting consumers in their present order.
"""

from __future__ import annotations

from domain.fairness import DEFAULT_OUTPUT_TOKEN_WEIGHT, Use, weighted_tokens


class TokenOrder:
    """Queued tickets by band, consumer and arrival, and each consumer's service: push,
    remove and rank in O(c + its own queue), peek and pop in O(c), c = the band's waiting
    consumers (few: they come from the keys file). Same interface as `FifoOrder` and
    `FairOrder`, plus `charge` and `service`, and `admitted`/`released`/`holding` for the
    requests holding slots (the lift's idle test)."""

    __slots__ = ("_bands", "_held", "_holder", "_last", "_output_weight", "_service", "_where")
    # a newcomer from a consumer with less service is placed ahead of tickets already queued
    newcomers_overtake = True

    def __init__(self, output_token_weight: float = DEFAULT_OUTPUT_TOKEN_WEIGHT) -> None:
        self._output_weight = output_token_weight
        self._service: dict[str, float] = {}  # consumer -> weighted tokens served / its weight
        # priority -> consumer -> its queued tickets, oldest first (only non-empty ones)
        self._bands: dict[int, dict[str, dict[int, None]]] = {}
        self._where: dict[int, tuple[int, str]] = {}  # ticket -> (priority, consumer)
        self._last: dict[int, str] = {}  # priority -> the consumer last admitted in the band
        self._holder: dict[int, str] = {}  # admitted ticket, not yet released -> its consumer
        self._held: dict[str, int] = {}  # consumer -> its admitted tickets not yet released (> 0)

    def __len__(self) -> int:
        return len(self._where)

    def service(self, consumer: str) -> float:
        """The consumer's service so far (0 for one never charged)."""
        return self._service.get(consumer, 0.0)

    def charge(self, consumer: str, weight: int, input_tokens: float, output_tokens: float) -> None:
        """Add tokens served to `consumer` (negative: a correction), weighted by
        `output_token_weight` and divided by its `weight` (below 1 counts as 1)."""
        tokens = weighted_tokens(Use(input_tokens=input_tokens, output_tokens=output_tokens), self._output_weight)
        self._service[consumer] = self._service.get(consumer, 0.0) + tokens / max(1, weight)

    def admitted(self, ticket: int, consumer: str, priority: int) -> None:
        """`ticket` of `consumer` was admitted without queueing (nobody waited): it holds slots."""
        self._last[priority] = consumer
        self._hold(ticket, consumer)

    def released(self, ticket: int) -> None:
        """An admitted ticket gave its slots back (any ticket the order never saw: nothing)."""
        consumer = self._holder.pop(ticket, None)
        if consumer is not None:
            left = self._held[consumer] - 1
            if left:
                self._held[consumer] = left
            else:
                del self._held[consumer]

    def holding(self, consumer: str) -> int:
        """The consumer's admitted requests not yet released."""
        return self._held.get(consumer, 0)

    def push(self, ticket: int, consumer: str, priority: int, weight: int) -> None:
        """Queue `ticket` (newer than every ticket queued so far); lift its consumer if it was
        idle (nothing queued in the band, nothing holding slots)."""
        band = self._bands.setdefault(priority, {})
        mine = band.get(consumer)
        if mine is None and consumer not in self._held:
            service = self._service
            last = self._last.get(priority)
            floor = min((service.get(c, 0.0) for c in band), default=0.0 if last is None else service.get(last, 0.0))
            if service.get(consumer, 0.0) < floor:
                service[consumer] = floor
        if mine is None:
            mine = band[consumer] = {}
        mine[ticket] = None
        self._where[ticket] = (priority, consumer)

    def remove(self, ticket: int) -> bool:
        """Take a ticket out without dispatching it (no service changes)."""
        where = self._where.pop(ticket, None)
        if where is None:
            return False
        priority, consumer = where
        band = self._bands[priority]
        mine = band[consumer]
        del mine[ticket]
        if not mine:
            del band[consumer]
            if not band:
                del self._bands[priority]
        return True

    def peek(self) -> int:
        """The ticket `pop` would dispatch (the queue must not be empty)."""
        return next(iter(self._next()[1]))

    def pop(self) -> int:
        """Dispatch the least-served waiting consumer's oldest ticket in the highest band (it
        is admitted: it holds slots until `released`)."""
        (priority, consumer), tickets = self._next()
        ticket = next(iter(tickets))
        self._last[priority] = consumer
        self.remove(ticket)
        self._hold(ticket, consumer)
        return ticket

    def rank(self, ticket: int) -> int:
        """1 + an estimate of the tickets dispatched before `ticket` (module doc); 0 when not queued."""
        where = self._where.get(ticket)
        if where is None:
            return 0
        priority, consumer = where
        bands = self._bands
        ahead = sum(len(t) for p, band in bands.items() if p > priority for t in band.values())
        band = bands[priority]
        mine = band[consumer]
        place = 0
        for t in mine:
            if t == ticket:
                break
            place += 1
        key = self._key(consumer, mine)
        for other, theirs in band.items():
            if other != consumer:  # a round robin: up to place + 1 of those served first, place of the others
                ahead += min(len(theirs), place + 1 if self._key(other, theirs) < key else place)
        return ahead + place + 1

    def clear(self) -> None:
        """Forget the queued tickets (draining); the services and the held requests stay (they
        are still released as usual)."""
        self._bands.clear()
        self._where.clear()

    # -- internals ---------------------------------------------------------------------

    def _hold(self, ticket: int, consumer: str) -> None:
        self._holder[ticket] = consumer
        self._held[consumer] = self._held.get(consumer, 0) + 1

    def _key(self, consumer: str, tickets: dict[int, None]) -> tuple[float, int]:
        return self._service.get(consumer, 0.0), next(iter(tickets))

    def _next(self) -> tuple[tuple[int, str], dict[int, None]]:
        """((priority, consumer), its tickets) of the next dispatch."""
        priority = max(self._bands)
        band = self._bands[priority]
        consumer = min(band, key=lambda c: self._key(c, band[c]))
        return (priority, consumer), band[consumer]
