"""The `/llm` endpoints: raw ASGI work functions run inside the shared `serve` frame.

A stream's 200 is sent as late as possible, so that a refusal still gets its proper
HTTP status: at the first `event: queue` frame when the request waits for a slot,
otherwise with `message_start`. Once sent, failures become `event: error` frames.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from adapters.inbound._shared.dialect import EdgeContext, Route
from adapters.inbound._shared.endpoint import Work, asgi_endpoint, not_found_route
from adapters.inbound._shared.exchange import Exchange
from adapters.inbound.anthropic.errors import AnthropicErrors
from adapters.inbound.anthropic.mapping import (
    SURFACE,
    decode_count_tokens,
    decode_messages,
    encode_message,
    encode_models,
    encode_token_count,
)
from adapters.inbound.anthropic.stream import KEEP_ALIVE, PING, AnthropicStream, queue_frame
from application.chat import ChatService
from domain.canonical import ChatRequest, QueuePosition, StreamError
from domain.errors import GatewayError, NotSupported

_JSON = b"application/json"
_SSE = b"text/event-stream"
_END = object()  # the service stream is exhausted
ERRORS = AnthropicErrors()


def routes(context: EdgeContext) -> list[Route]:
    controller = AnthropicController(context)

    header_limit = context.limits.max_header_bytes

    def route(path: str, methods: tuple[str, ...], work: Work) -> Route:
        endpoint = asgi_endpoint(SURFACE, path, methods, work, ERRORS, context.observer, header_limit)
        return Route(path, methods, endpoint)

    return [
        route("/llm/v1/messages", ("POST",), controller.messages),
        route("/llm/v1/messages/count_tokens", ("POST",), controller.count_tokens),
        route("/llm/v1/models", ("GET",), controller.models),
        not_found_route(SURFACE, "/llm", ERRORS, context.observer, header_limit),
    ]


async def _next(items: AsyncIterator[Any]) -> Any:
    """The next item, or `_END`; StopAsyncIteration must not escape into a task."""
    try:
        return await anext(items)
    except StopAsyncIteration:
        return _END


def _failure(event: StreamError) -> GatewayError:
    """An upstream failure seen before anything was sent, to answer with its own status."""
    error = GatewayError(event.message)
    error.status, error.kind = event.status, event.kind
    return error


class AnthropicController:
    __slots__ = ("_created_at", "_limit", "_limits", "_ping", "_service")

    def __init__(self, context: EdgeContext) -> None:
        self._service: ChatService = context.service
        self._limit = context.max_body_bytes
        self._limits = context.limits
        self._ping = context.ping_interval_seconds
        self._created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the gateway's start

    async def models(self, ex: Exchange) -> None:
        body = encode_models(self._service.models(), self._created_at)
        await ex.respond(200, body, _JSON, [(b"request-id", ex.request_id.encode())])

    async def count_tokens(self, ex: Exchange) -> None:
        limits = self._limits
        body = await ex.read_body(self._limit, limits.body_timeout_seconds)
        request = decode_count_tokens(body, ex.request_id, limits)
        ex.record.model = request.model
        ex.record.upstream = self._service.upstream_for(request.model)
        ex.watch_disconnect()
        try:
            count = await self._service.count_tokens(request)
        except NotSupported:
            raise NotSupported(
                f"Token counting is not available for model '{request.model}': "
                "its upstream server has no tokenizer endpoint."
            ) from None
        ex.record.input_tokens = count
        await ex.respond(200, encode_token_count(count), _JSON, [(b"request-id", ex.request_id.encode())])

    async def messages(self, ex: Exchange) -> None:
        limits = self._limits
        body = await ex.read_body(self._limit, limits.body_timeout_seconds)
        request = decode_messages(body, ex.request_id, limits)
        record = ex.record
        record.model = request.model
        record.stream = request.stream
        record.upstream = self._service.upstream_for(request.model)
        ex.watch_disconnect()
        if request.stream:
            await self._stream(ex, request)
            return
        response = await self._service.complete(request, record)
        body = encode_message(response, request.model)
        record.input_tokens = response.usage.input_tokens
        record.output_tokens = response.usage.output_tokens
        record.finish_reason = response.finish_reason
        await ex.respond(200, body, _JSON, [(b"request-id", ex.request_id.encode())])

    async def _stream(self, ex: Exchange, request: ChatRequest) -> None:
        """Relay the service stream, flushing each chunk's frames at once.

        The next item is awaited in its own task with a timeout, so that a ping can be
        sent while tokens are slow without cancelling (and so closing) the generator.
        """
        items = cast(AsyncGenerator[Any, None], self._service.stream(request, report_queue=True, record=ex.record))
        machine = AnthropicStream(request.model)
        headers = [(b"request-id", ex.request_id.encode())]
        loop = asyncio.get_running_loop()
        record = ex.record
        queued_at: float | None = None
        admitted = False
        last_sent = loop.time()
        pending: asyncio.Task[Any] | None = None
        tail: list[bytes] = []
        try:
            while True:
                if pending is None:
                    pending = loop.create_task(_next(items))
                if not pending.done():
                    timeout = max(0.0, last_sent + self._ping - loop.time())
                    done, _ = await asyncio.wait((pending,), timeout=timeout)
                    if not done:
                        if ex.started:  # queued: comments; in the message: pings
                            await ex.send_chunk(PING if machine.in_message else KEEP_ALIVE)
                        last_sent = loop.time()
                        continue
                item, pending = pending.result(), None
                if item is _END:
                    break
                if isinstance(item, QueuePosition):
                    if not admitted:
                        if not ex.started:
                            queued_at = ex.elapsed()
                            await ex.start_stream(200, _SSE, headers)
                        await ex.send_chunk(queue_frame(item.position, item.queued))
                        last_sent = loop.time()
                    continue
                if not admitted:
                    admitted = True
                    if queued_at is not None:
                        record.queue_wait_seconds = ex.elapsed() - queued_at
                frames = machine.feed_many(item.events)
                if machine.closed:
                    tail = frames
                    break
                if frames:
                    if not ex.started:
                        await ex.start_stream(200, _SSE, headers)
                    if record.first_token_seconds is None and machine.blocks:
                        record.first_token_seconds = ex.elapsed()
                    await ex.send_chunk(b"".join(frames))
                    last_sent = loop.time()
        finally:
            if pending is not None and not pending.done():
                pending.cancel()  # runs the generator's cleanup: slot released, upstream closed
                await asyncio.wait((pending,))
                if not pending.cancelled():
                    pending.exception()  # retrieved: a failure past a hang-up has no one to tell
            await items.aclose()
        tail += machine.finish()
        self._record_end(ex, machine)
        if not ex.started:
            if machine.failure is not None and not machine.message_started:
                raise _failure(machine.failure)
            await ex.start_stream(200, _SSE, headers)
        await ex.end_stream(b"".join(tail))

    @staticmethod
    def _record_end(ex: Exchange, machine: AnthropicStream) -> None:
        record = ex.record
        record.input_tokens = machine.usage.input_tokens
        record.output_tokens = machine.usage.output_tokens
        record.finish_reason = machine.stop_reason
        if machine.failure is not None:
            record.error_kind = machine.failure.kind
