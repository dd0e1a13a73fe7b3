"""The queue of one upstream's ledger: who waits, until when, and who goes next (pure).

Deadlines sit in an OrderedDict ticket -> deadline, in arrival order: append, pop-front
and removal from the middle (a hang-up) are O(1). Every ticket gets the same timeout and
`now` never goes backwards, so deadlines ascend from the front and expiry pops from the
front, whatever the dispatch order. The dispatch order (which ticket a free slot takes
next, and each ticket's place) is the policy's: `FifoOrder` (arrival), `FairOrder`
(per consumer weight, within priority bands) or `TokenOrder` (per consumer token service,
within priority bands; `charge` feeds it). Counts per consumer and per priority back
`max_queued_per_consumer` and the queue-by-priority metric. No operation walks the queue.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

from domain.admission.fair_order import FairOrder
from domain.admission.fifo_order import FifoOrder
from domain.admission.policy import FAIR, TOKENS
from domain.admission.token_order import TokenOrder
from domain.consumers import Consumer
from domain.fairness import DEFAULT_OUTPUT_TOKEN_WEIGHT

K = TypeVar("K")


def _decrement(counts: dict[K, int], key: K) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class WaitQueue:
    """Queued tickets with their deadlines, the slots each asks for and the consumer that
    sent it, in the dispatch order of `fairness` (`fifo`, `fair` or `tokens`)."""

    __slots__ = ("_by_consumer", "_by_priority", "_order", "_want", "_who", "deadlines", "newcomers_overtake", "tokens")

    def __init__(
        self, fairness: str, min_capacity: int = 64, output_token_weight: float = DEFAULT_OUTPUT_TOKEN_WEIGHT,
    ) -> None:
        # ticket -> deadline, oldest first; read only outside this class (its truth and
        # length are the queue's, at C speed on the ledger's hot paths)
        self.deadlines: OrderedDict[int, float] = OrderedDict()
        # the consumers' token service under `tokens` (None otherwise): charged through it
        self.tokens = TokenOrder(output_token_weight) if fairness == TOKENS else None
        self._order: FifoOrder | FairOrder | TokenOrder = (
            FairOrder() if fairness == FAIR else FifoOrder(min_capacity) if self.tokens is None else self.tokens)
        # True when a newcomer can be placed ahead of the head (see `FairOrder`)
        self.newcomers_overtake = self._order.newcomers_overtake
        self._want: dict[int, int] = {}  # ticket -> slots it asks for (only k > 1)
        self._who: dict[int, tuple[str, int]] = {}  # ticket -> (consumer, priority)
        self._by_consumer: dict[str, int] = {}  # consumer -> its queued tickets
        self._by_priority: dict[int, int] = {}  # priority -> queued tickets

    def push(self, ticket: int, deadline: float, consumer: Consumer, slots: int) -> None:
        """Queue `ticket` (newer than every ticket queued so far) asking for `slots`."""
        self.deadlines[ticket] = deadline
        name, priority = consumer.name, consumer.priority
        self._who[ticket] = (name, priority)
        self._by_consumer[name] = self._by_consumer.get(name, 0) + 1
        self._by_priority[priority] = self._by_priority.get(priority, 0) + 1
        if slots != 1:
            self._want[ticket] = slots
        self._order.push(ticket, name, priority, consumer.weight)

    def head(self) -> int:
        """The ticket dispatched next (the queue must not be empty)."""
        return self._order.peek()

    def want(self, ticket: int) -> int:
        """The slots a queued ticket asks for."""
        return self._want.get(ticket, 1)

    def pop_head(self) -> int:
        """Take the head out (it is being admitted) and return it."""
        ticket = self._order.pop()
        del self.deadlines[ticket]
        self._forget(ticket)
        return ticket

    def withdraw(self, ticket: int) -> bool:
        """Take `ticket` out from wherever it is; False when it is not queued."""
        if self.deadlines.pop(ticket, None) is None:
            return False
        self._order.remove(ticket)
        self._forget(ticket)
        return True

    def lapse(self, now: float) -> list[int]:
        """Take out the tickets whose deadline has passed (deadline <= now), oldest first."""
        deadlines, order, out = self.deadlines, self._order, []
        while deadlines:
            head = next(iter(deadlines))
            if deadlines[head] > now:
                break
            del deadlines[head]
            order.remove(head)
            self._forget(head)
            out.append(head)
        return out

    def position(self, ticket: int) -> int:
        """1-based place in the dispatch order (1 = admitted next); 0 when not queued."""
        return self._order.rank(ticket)

    def oldest_deadline(self) -> float | None:
        """The deadline of the longest-waiting ticket (the front in arrival order)."""
        for deadline in self.deadlines.values():
            return deadline
        return None

    def queued_of(self, consumer: str) -> int:
        return self._by_consumer.get(consumer, 0)

    def by_priority(self) -> dict[int, int]:
        """Queued tickets per consumer priority (only priorities with some)."""
        return dict(self._by_priority)

    def clear(self) -> list[int]:
        """Empty the queue (draining); returns every ticket that was queued, oldest first."""
        out = list(self.deadlines)
        self.deadlines.clear()
        self._who.clear()
        self._by_consumer.clear()
        self._by_priority.clear()
        self._want.clear()
        self._order.clear()
        return out

    def _forget(self, ticket: int) -> None:
        self._want.pop(ticket, None)
        name, priority = self._who.pop(ticket)
        _decrement(self._by_consumer, name)
        _decrement(self._by_priority, priority)
