"""New requests start a few per turn of the event loop; the rest wait their turn, in order.

One event loop relays the tokens of every stream in flight and starts every new request.
Starting one (its head parsed into a `Call`, Litestar's routing, the body decoded, the
admission, the upstream call opened) costs as much CPU as relaying tens of tokens, and
requests come in bursts: clients that ask again the moment an answer ends, a retry storm,
connections moved by a deploy. A loop left alone starts the whole burst in the turn it
arrived in, and every token that arrives meanwhile waits for all of it: each stream in
flight sees one long gap per burst (measured in the benchmark notebook's "ninth pass",
`git show 14f29a1:bench/RESULTS.md`: 300 paced streams asking again together held the loop
for 60-100 ms at a time; the p99 gap between tokens, 20 ms paced, was 42-57 ms, and 29-41 ms
with the pacer).

`ArrivalPacer` lets `per_turn` requests start in one turn and queues the others in arrival
order; each later turn releases the next `per_turn`. Between two batches the loop polls its
sockets and relays the tokens that came, so a burst costs the streams in flight a few
milliseconds per turn instead of one stall. The burst's own work is the same; no request
is refused or reordered. A turn is one pass of the loop over its ready callbacks: what is
scheduled (`call_soon`) during a pass runs in the next one, after the loop has polled its
sockets, which is where the pacer's turn boundary sits.

The edge middleware calls `enter` before anything else of a request; `[server]
starts_per_loop_turn` sets `per_turn` (0: no pacer). One per process, held by the container.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ArrivalPacer:
    """At most `per_turn` requests start per turn of the event loop; later ones wait, FIFO."""

    __slots__ = ("_loop", "_per_turn", "_started", "_waiting")

    def __init__(self, per_turn: int) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self._per_turn = per_turn
        self._started = 0  # requests started (or released to start) in the current turn
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop a turn is open on, else None
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn now (cancelled ones until the next turn drops them)."""
        return len(self._waiting)

    def enter(self) -> asyncio.Future[None] | None:
        """None: the request starts now. Else a future that is done when its turn comes.

        A plain method, not a coroutine: a request that starts at once (every one but a
        burst's) costs a comparison and an increment, and no awaitable."""
        if not self._waiting and self._started < self._per_turn:
            self._started += 1
            if self._loop is None:  # the turn's first start: close the turn on the next pass
                self._open(asyncio.get_running_loop())
            return None
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a turn left open by a loop that stopped (one app served twice)
            self._waiting.clear()
            self._started = 1
            self._open(loop)
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting.append(waiter)
        return waiter

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Runs on the loop's next pass: the next `per_turn` waiting start in the pass after it."""
        waiting, released = self._waiting, 0
        while waiting and released < self._per_turn:
            waiter = waiting.popleft()
            if not waiter.done():  # a cancelled waiter (its request ended) takes no place
                waiter.set_result(None)
                released += 1
        self._started = released  # the released take this turn's places before newcomers
        if released and self._loop is not None:
            self._loop.call_soon(self._next_turn)
        else:
            self._loop = None
