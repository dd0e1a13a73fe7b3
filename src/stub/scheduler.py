"""`--max-num-seqs N`: at most N chat requests generate at once, the rest wait in order.

vLLM's scheduler runs at most `--max-num-seqs` sequences; a request beyond that waits
inside the server (its `vllm:num_requests_waiting` gauge), invisible to whoever sent it,
and starts when a running one finishes. The stub does the same, in arrival order: a
finishing request hands its place straight to the oldest waiter, so a newcomer never
overtakes the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Scheduler:
    """Places to generate (`slots`) and the requests waiting for one, oldest first."""

    __slots__ = ("_queue", "running", "slots", "waiting")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running = 0
        self.waiting = 0  # live waiters (a withdrawn one is skipped, not counted)
        self._queue: deque[asyncio.Future[None]] = deque()

    def free(self) -> bool:
        """A request arriving now would start at once."""
        return self.running < self.slots and not self.waiting

    def enter(self) -> asyncio.Future[None] | None:
        """Start now (None) or get the future that resolves when this request may start."""
        if self.free():
            self.running += 1
            return None
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        self.waiting += 1
        return turn

    async def wait(self, turn: asyncio.Future[None]) -> None:
        """Wait for `turn`; a cancelled waiter leaves the queue (or passes on a place just given)."""
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted in the same instant: hand it on
                self.leave()
            else:
                turn.cancel()
                self.waiting -= 1
            raise

    def leave(self) -> None:
        """A running request finished: the oldest live waiter starts in its place."""
        queue = self._queue
        while queue:
            turn = queue.popleft()
            if not turn.done():
                self.waiting -= 1
                turn.set_result(None)
                return
        self.running -= 1
