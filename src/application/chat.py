"""The one use case every dialect drives: route -> admit -> call upstream -> release.

Dialects decode their wire format into a `ChatRequest` and render what comes back;
everything between (which upstream, whether a slot is free, how long to wait, giving
the slot back on every path) happens here, once, for all of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from domain.canonical import ChatRequest, ChatResponse, QueuePosition, StreamChunk
from domain.routing import ModelRouter
from ports.admission import AdmissionGate, QueueTicket, SlotLease
from ports.upstream import UpstreamClient


class ChatService:
    """Serves canonical chat requests for every inbound dialect.

    Client hang-ups arrive as task cancellation: the inbound adapter cancels the task
    running `complete` or consuming `stream`, and every `finally` here gives the slot
    back and aborts the upstream call.
    """

    __slots__ = ("_router", "_upstreams", "_gate", "_update_interval")

    def __init__(
        self,
        router: ModelRouter,
        upstreams: Mapping[str, UpstreamClient],
        gate: AdmissionGate,
        queue_update_interval: float,
    ) -> None:
        self._router = router
        self._upstreams = upstreams
        self._gate = gate
        self._update_interval = queue_update_interval

    def models(self) -> list[str]:
        return self._router.models()

    def upstream_for(self, model: str) -> str:
        """The upstream key serving `model`; raises `ModelNotFound`."""
        return self._router.upstream_for(model)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        upstream = self._router.upstream_for(request.model)
        lease = await self._admit_quietly(upstream)
        try:
            return await self._upstreams[upstream].complete(request)
        finally:
            await lease.release()

    async def stream(
        self, request: ChatRequest, *, report_queue: bool = False
    ) -> AsyncIterator[QueuePosition | StreamChunk]:
        """Stream a request's answer, preceded by queue positions if `report_queue`.

        Failures before the first item is yielded are raised before anything reaches
        the client, so the dialect can still answer with a proper HTTP status.
        """
        upstream = self._router.upstream_for(request.model)
        entry = await self._gate.enter(upstream)
        if entry.queued:
            ticket: QueueTicket = entry  # type: ignore[assignment]
            if report_queue:
                lease = None
                try:
                    async for item in self._positions(upstream, ticket):
                        if isinstance(item, QueuePosition):
                            yield item
                        else:
                            lease = item
                except BaseException:  # hang-up while queued, including GeneratorExit
                    await ticket.cancel()
                    raise
                assert lease is not None
            else:
                lease = await self._wait(ticket)
        else:
            lease = entry  # type: ignore[assignment]
        try:
            async with self._upstreams[upstream].open_stream(request) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            await lease.release()

    async def count_tokens(self, request: ChatRequest) -> int:
        upstream = self._router.upstream_for(request.model)
        return await self._upstreams[upstream].count_tokens(request)

    # --- admission ---------------------------------------------------------------

    async def _admit_quietly(self, upstream: str) -> SlotLease:
        entry = await self._gate.enter(upstream)
        if entry.queued:
            return await self._wait(entry)  # type: ignore[arg-type]
        return entry  # type: ignore[return-value]

    async def _wait(self, ticket: QueueTicket) -> SlotLease:
        try:
            while True:
                lease = await ticket.wait(3600.0)
                if lease is not None:
                    return lease
        except BaseException:
            await ticket.cancel()
            raise

    async def _positions(
        self, upstream: str, ticket: QueueTicket
    ) -> AsyncIterator[QueuePosition | SlotLease]:
        """The position at once, then at most one update per interval, then the lease.

        A waiter reads its own position from the ledger (O(log n)) when its own timer
        fires; nothing is pushed to waiters when others leave the queue, so draining a
        queue of n waiters costs at most n frames per interval, not O(n^2) frames.
        The caller cancels the ticket if this generator is abandoned.
        """
        last = ticket.position()
        yield QueuePosition(position=last, queued=self._gate.snapshot(upstream).queued)
        while True:
            lease = await ticket.wait(self._update_interval)
            if lease is not None:
                yield lease
                return
            position = ticket.position()
            if position != last:
                last = position
                yield QueuePosition(position=position, queued=self._gate.snapshot(upstream).queued)
