"""The `/llm` Router: messages (plain and streamed), count_tokens and the model list.

A stream's 200 goes out with its first frame, awaited before the response is made, so
a refusal still gets its proper HTTP status: the first `event: queue` frame when the
request waits for a slot, otherwise `message_start`. Once sent, failures become
`event: error` frames.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, Router, get, post

from adapters.inbound._shared.bodies import read_body, stream_response
from adapters.inbound._shared.call import Call, call_of
from adapters.inbound._shared.dialect import METERED, EdgeContext, dialect_router
from adapters.inbound._shared.errors import stream_failure
from adapters.inbound._shared.json_answer import json_answer
from adapters.inbound._shared.openapi import REQUEST_ERRORS, operation_class, request_body, responses, sse_event
from adapters.inbound.anthropic import schema as wire
from adapters.inbound.anthropic.answers import encode_message, encode_models, encode_token_count
from adapters.inbound.anthropic.errors import AnthropicErrors
from adapters.inbound.anthropic.frames import KEEP_ALIVE, PING, queue_comment, queue_frame
from adapters.inbound.anthropic.mapping import SURFACE, decode_count_tokens, decode_messages
from adapters.inbound.anthropic.rate_headers import rate_limit_headers
from adapters.inbound.anthropic.stream import AnthropicStream
from domain.canonical import QueuePosition, StreamError
from domain.errors import GatewayError, InvalidRequest, NotSupported

JSON = "application/json"
ERRORS = AnthropicErrors()
# Turns this request's `event: queue` frames on or off (`[server] queue_events` is the default).
QUEUE_EVENTS_HEADER = "x-gateway-queue-events"
_SWITCH = {"on": True, "off": False}
EVENT = sse_event(
    "Anthropic stream events; `queue` (`{\"type\":\"queue\",\"position\":N}`) is this gateway's extension, "
    "sent while the request waits for a slot",
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
     "message_stop", "ping", "error", "queue"],
)


def router(context: EdgeContext) -> Router:
    """The `/llm` Router (what bootstrap mounts)."""
    service, limits, ping = context.service, context.limits, context.ping_interval_seconds
    queue_events: bool = context.options.get("queue_events", True)
    created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the gateway's start

    @post(
        "/v1/messages", status_code=200, summary="Anthropic message", operation_id="Anthropic_message",
        dependencies=request_body(wire.MessagesParams),
        responses=responses(wire.MessageOut, wire.ErrorBody, JSON, REQUEST_ERRORS),
        operation_class=operation_class(events=EVENT), opt=METERED,
    )
    async def messages(request: Request[Any, Any, Any]) -> Response[Any]:  # or a Stream
        call = call_of(request)
        chat = decode_messages(await read_body(request, limits.body_timeout_seconds), call.request_id, limits)
        record = call.record
        record.model, record.stream = chat.model, chat.stream
        record.upstream = service.upstream_for(chat.model)
        headers = {"request-id": call.request_id}
        news = queue_frame if _queue_events(request, queue_events) else queue_comment
        call.watch()
        if chat.stream:
            items = service.stream(chat, report_queue=True, record=record, consumer=call.identity.consumer,
                                   heartbeat=ping)
            frames = _frames(request, call, items, AnthropicStream(chat.model), news, ping)
            return await stream_response(call, frames, headers, rate_limit_headers)
        response = await service.complete(chat, record, call.identity.consumer)
        call.stop_watching()
        if record.rate is not None:  # sent by the edge middleware (`Call.rate_headers`)
            call.rate_headers = rate_limit_headers(record.rate)
        record.input_tokens = response.usage.input_tokens
        record.output_tokens = response.usage.output_tokens
        record.cached_tokens = response.usage.cached_tokens
        record.finish_reason = response.finish_reason
        return json_answer(encode_message(response, chat.model), headers)

    @post(
        "/v1/messages/count_tokens", status_code=200, summary="Anthropic token count",
        operation_id="Anthropic_token_count", dependencies=request_body(wire.CountTokensParams),
        responses=responses(wire.TokenCount, wire.ErrorBody, JSON, sorted([*REQUEST_ERRORS, 501])),
        operation_class=operation_class(), opt=METERED,  # counts like any request (its own call upstream)
    )
    async def count_tokens(request: Request[Any, Any, Any]) -> Response[bytes]:
        call = call_of(request)
        chat = decode_count_tokens(await read_body(request, limits.body_timeout_seconds), call.request_id, limits)
        call.record.model = chat.model
        call.record.upstream = service.upstream_for(chat.model)
        call.watch()
        try:
            count = await service.count_tokens(chat, call.record)
        except NotSupported:
            raise NotSupported(
                f"Token counting is not available for model '{chat.model}': "
                "its upstream server has no tokenizer endpoint."
            ) from None
        call.stop_watching()
        call.record.input_tokens = count
        return Response(encode_token_count(count), media_type=JSON, headers={"request-id": call.request_id})

    @get(
        "/v1/models", summary="Anthropic model list", operation_id="Anthropic_model_list",
        responses=responses(wire.ModelList, wire.ErrorBody, JSON, [401, 431]),
    )
    async def models(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = encode_models(service.models(), created_at)
        return Response(body, media_type=JSON, headers={"request-id": call_of(request).request_id})

    return dialect_router("/llm", SURFACE, [messages, count_tokens, models], ERRORS, context)


def _queue_events(request: Request[Any, Any, Any], default: bool) -> bool:
    """Whether a queued stream gets `event: queue` frames (else SSE comments, which strict clients skip)."""
    value = request.headers.get(QUEUE_EVENTS_HEADER)
    if value is None:
        return default
    switch = _SWITCH.get(value.strip().lower())
    if switch is None:
        raise InvalidRequest(f"The {QUEUE_EVENTS_HEADER} header must be 'on' or 'off', not {value[:64]!r}.")
    return switch


async def _frames(
    request: Request[Any, Any, Any], call: Call, items: AsyncIterator[Any], machine: AnthropicStream,
    queue_news: Callable[[int, int], bytes], ping: float,
) -> AsyncIterator[bytes]:
    """The stream's frames; those of one upstream read go out as one item.

    Before the first item nothing is sent, and a failure is raised (its own status).
    After it, the service's heartbeat (an empty batch after `ping_interval_seconds` without
    news, `ChatService.stream`) is a ping inside the message and a keep-alive comment before
    it; before the response started it is nothing. While a tool call is collected the upstream
    keeps sending but nothing goes out: a ping every `ping` seconds keeps proxies from closing
    the quiet connection. A hang-up cancels the task reading the items, which closes the
    service stream and frees the slot.
    """
    record = call.record
    admitted = started = False
    quiet: float | None = None  # since when a tool call's collection has sent nothing
    held: list[bytes] = []  # the closing frames, sent with the terminal ones
    try:
        try:
            async for item in items:
                if type(item) is QueuePosition:
                    if not admitted:
                        started = True
                        yield queue_news(item.position, item.queued)
                    continue
                if not item:  # the heartbeat
                    if started:
                        yield PING if machine.in_message else KEEP_ALIVE
                    continue
                admitted = True  # the service noted the queue wait at admission, not here (after TTFT)
                frames: list[bytes] = []
                for chunk in item:
                    frames += machine.feed_many(chunk.events)
                    if machine.closed:
                        break
                if machine.closed:
                    held = frames
                    break
                if frames:
                    if record.first_token_seconds is None and machine.blocks:
                        record.first_token_seconds = call.elapsed()
                    started, quiet = True, None
                    yield b"".join(frames)
                elif machine.collecting:
                    now = time.monotonic()
                    if quiet is None:
                        quiet = now
                    elif now - quiet >= ping:
                        quiet = now
                        yield PING
        except Exception as error:
            if not started:
                raise
            yield stream_failure(error, ERRORS, request)
            return
        # Ended early (a failure closed the message): the service stream closes now.
        await items.aclose()  # type: ignore[attr-defined]
        held += machine.finish()
        _record_end(call, machine)
        if not started and machine.failure is not None and not machine.message_started:
            raise _failure(machine.failure)
        yield b"".join(held)
    finally:
        # Ended, left or stalled (the middleware closes this generator): the service stream
        # closes, which frees the slot, before this returns.
        await items.aclose()  # type: ignore[attr-defined]


def _failure(event: StreamError) -> GatewayError:
    """An upstream failure seen before anything was sent, to answer with its own status."""
    error = GatewayError(event.message)
    error.status, error.kind = event.status, event.kind
    return error


def _record_end(call: Call, machine: AnthropicStream) -> None:
    record = call.record
    record.input_tokens = machine.usage.input_tokens
    record.output_tokens = machine.usage.output_tokens
    record.cached_tokens = machine.usage.cached_tokens
    record.finish_reason = machine.stop_reason
    if machine.failure is not None:
        record.error_kind = machine.failure.kind
