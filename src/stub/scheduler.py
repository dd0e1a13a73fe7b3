"""`--max-num-seqs N`: at most N sequences generate at once, the rest wait in order.

vLLM's scheduler runs at most `--max-num-seqs` sequences; a request beyond that waits
inside the server (its `vllm:num_requests_waiting` gauge), invisible to whoever sent it,
and starts when running ones finish. A request for n choices is n sequences. The stub
does the same, in arrival order: finishing requests hand their places to the oldest
waiters, a waiter starts once all the places it needs are free (at most N), and a
newcomer never overtakes the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Scheduler:
    """Places to generate (`slots`), the requests holding them and those waiting, oldest first."""

    __slots__ = ("_need", "_queue", "running", "slots", "used", "waiting")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running = 0  # requests generating
        self.used = 0  # sequences generating (a request for n choices runs n)
        self.waiting = 0  # live waiters (a withdrawn one is skipped, not counted)
        self._queue: deque[asyncio.Future[None]] = deque()
        self._need: dict[asyncio.Future[None], int] = {}

    def places(self, sequences: int = 1) -> int:
        """The places a request for `sequences` takes: at least 1, at most all of them."""
        return min(max(sequences, 1), self.slots)

    def free(self, sequences: int = 1) -> bool:
        """A request for `sequences` arriving now would start at once."""
        return self.used + self.places(sequences) <= self.slots and not self.waiting

    def enter(self, sequences: int = 1) -> asyncio.Future[None] | None:
        """Start now (None) or get the future that resolves when this request may start."""
        if self.free(sequences):
            self.used += self.places(sequences)
            self.running += 1
            return None
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        self._need[turn] = self.places(sequences)
        self.waiting += 1
        return turn

    async def wait(self, turn: asyncio.Future[None]) -> None:
        """Wait for `turn`; a cancelled waiter leaves the queue (or gives back places just given)."""
        need = self._need.get(turn, 1)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted in the same instant: hand it on
                self.leave(need)
            else:
                turn.cancel()
                self._need.pop(turn, None)
                self.waiting -= 1
                self._grant()  # it may have been the head the others waited behind
            raise

    def leave(self, sequences: int = 1) -> None:
        """A running request finished: the oldest live waiters start in its places."""
        self.used -= self.places(sequences)
        self.running -= 1
        self._grant()

    def _grant(self) -> None:
        queue = self._queue
        while queue:
            turn = queue[0]
            if turn.done():  # withdrawn
                queue.popleft()
                continue
            need = self._need[turn]
            if self.used + need > self.slots:
                return  # head of line: nobody overtakes it
            queue.popleft()
            del self._need[turn]
            self.waiting -= 1
            self.used += need
            self.running += 1
            turn.set_result(None)
