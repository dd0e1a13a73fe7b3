"""The `/llm` endpoints: raw ASGI work functions run inside the shared `serve` frame.

A stream's 200 is sent as late as possible, so that a refusal still gets its proper
HTTP status: at the first `event: queue` frame when the request waits for a slot,
otherwise with `message_start`. Once sent, failures become `event: error` frames.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
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


class _Pinger:
    """Per stream: after `interval` seconds with nothing sent, a ping inside the message, a
    keep-alive comment before it (queued), nothing before the response started.

    A loop timer re-arms itself from the last send; a task exists only while a ping is
    being sent, so a stream that never goes quiet costs one timer, not a task. Every send
    of the stream goes through `send`, under one lock, so a ping never interleaves with a
    frame; a tick that finds a send under way counts it as sending.
    """

    __slots__ = ("_ex", "_interval", "_last_sent", "_lock", "_loop", "_machine", "_task", "_timer")

    def __init__(self, ex: Exchange, machine: AnthropicStream, interval: float) -> None:
        self._ex = ex
        self._machine = machine
        self._interval = interval
        self._loop = loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self._last_sent = loop.time()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_at(self._last_sent + interval, self._tick)

    async def start(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Start the response (under the lock: no ping may race the response head)."""
        async with self._lock:
            await self._ex.start_stream(200, _SSE, headers)

    async def send(self, data: bytes) -> None:
        async with self._lock:
            try:
                await self._ex.send_chunk(data)
            finally:
                self._last_sent = self._loop.time()

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait((task,))

    def _tick(self) -> None:
        loop = self._loop
        due = self._last_sent + self._interval
        if due <= loop.time():
            if self._lock.locked() or not self._ex.started:
                # A frame is being sent (that counts as sending), or nothing may be sent
                # yet: wait a whole interval again.
                self._last_sent = loop.time()
            else:
                self._timer = None
                self._task = loop.create_task(self._ping())
                return
            due = self._last_sent + self._interval
        self._timer = loop.call_at(due, self._tick)

    async def _ping(self) -> None:
        frame = PING if self._machine.in_message else KEEP_ALIVE
        try:
            await self.send(frame)
        except Exception:  # the client is gone or the send failed: the handler finds out
            return
        if self._task is asyncio.current_task():  # not stopped meanwhile
            self._task = None
            self._timer = self._loop.call_at(self._last_sent + self._interval, self._tick)


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
        """Relay the service stream; the frames of one upstream read go out in one send.

        Items are awaited directly; one `_Pinger` per stream sends a ping (or a
        keep-alive comment) when nothing was sent for `ping_interval` seconds, so slow
        tokens never need a timeout around the generator (which would close it).
        """
        items = cast(AsyncGenerator[Any, None], self._service.stream(request, report_queue=True, record=ex.record))
        machine = AnthropicStream(request.model)
        headers = [(b"request-id", ex.request_id.encode())]
        record = ex.record
        queued_at: float | None = None
        admitted = False
        held: list[bytes] = []  # the closing frames, sent with the terminal ones
        pinger = _Pinger(ex, machine, self._ping)
        try:
            async for item in items:
                if type(item) is QueuePosition:
                    if not admitted:
                        if not ex.started:
                            queued_at = ex.elapsed()
                            await pinger.start(headers)
                        await pinger.send(queue_frame(item.position, item.queued))
                    continue
                if not admitted:
                    admitted = True
                    if queued_at is not None:
                        record.queue_wait_seconds = ex.elapsed() - queued_at
                frames: list[bytes] = []  # the frames of one upstream read go out in one send
                for chunk in item:
                    frames += machine.feed_many(chunk.events)
                    if machine.closed:
                        break
                if machine.closed:
                    held = frames
                    break
                if frames:
                    if not ex.started:
                        await pinger.start(headers)
                    if record.first_token_seconds is None and machine.blocks:
                        record.first_token_seconds = ex.elapsed()
                    await pinger.send(b"".join(frames))
        finally:
            await pinger.stop()
            await items.aclose()  # a no-op after a hang-up: the cancellation already closed it
        held += machine.finish()
        self._record_end(ex, machine)
        if not ex.started:
            if machine.failure is not None and not machine.message_started:
                raise _failure(machine.failure)
            await ex.start_stream(200, _SSE, headers)
        await ex.end_stream(b"".join(held))

    @staticmethod
    def _record_end(ex: Exchange, machine: AnthropicStream) -> None:
        record = ex.record
        record.input_tokens = machine.usage.input_tokens
        record.output_tokens = machine.usage.output_tokens
        record.finish_reason = machine.stop_reason
        if machine.failure is not None:
            record.error_kind = machine.failure.kind
