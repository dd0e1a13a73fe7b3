"""The Responses Router: `POST /v1/responses`, plain and streamed.

It is mounted at `/v1` beside the Chat Completions Router, which owns the prefix's
unknown paths (one problem+json 404 for all of `/v1`). Failures are the `/v1` problem
documents. A stream's first frame is awaited before the response exists, so a refusal
(full queue, unknown model, a consumer over its limit, an upstream that refuses at once)
keeps its own status; a request that waits for a slot first gets `response.created`
(status `queued`) and `response.queued`, and later failures end the stream with `error`
and `response.failed`. Keep-alive comments (which every SSE parser skips) go out every
`ping_interval_seconds` while nothing else does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, Router, post

from adapters.inbound._shared.bodies import read_body, stream_response
from adapters.inbound._shared.call import Call, call_of
from adapters.inbound._shared.dialect import METERED, EdgeContext, dialect_router
from adapters.inbound._shared.errors import as_gateway_error
from adapters.inbound._shared.json_answer import json_answer
from adapters.inbound._shared.openapi import REQUEST_ERRORS, operation_class, request_body, responses, sse_event
from adapters.inbound._shared.problem import Problem
from adapters.inbound._shared.ratelimit_headers import rate_limit_headers
from adapters.inbound._shared.sse import comment_frame
from adapters.inbound.responses import objects as o
from adapters.inbound.responses import schema as w
from adapters.inbound.responses.errors import ResponsesErrors
from adapters.inbound.responses.mapping import SURFACE, decode_request, encode_response
from adapters.inbound.responses.stream import ResponseStream
from domain.canonical import ChunkBatch, QueuePosition, StreamError
from domain.errors import GatewayError

JSON = "application/json"
PROBLEM = "application/problem+json"
KEEP_ALIVE = comment_frame()
EVENT = sse_event(
    "Responses API stream events, each `data:` a JSON object whose `type` is the event name and whose "
    "`sequence_number` counts from 0",
    ["response.created", "response.queued", "response.in_progress", "response.output_item.added",
     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
     "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
     "response.function_call_arguments.delta", "response.function_call_arguments.done",
     "response.output_item.done", "response.completed", "response.incomplete", "error", "response.failed"],
)


def router(context: EdgeContext) -> Router:
    """The Responses Router at `/v1` (what bootstrap mounts)."""
    service, limits, interval = context.service, context.limits, context.ping_interval_seconds

    @post(
        "/responses", status_code=200, summary="OpenAI Responses API: create a response",
        operation_id="OpenAI_create_response", dependencies=request_body(w.CreateResponse),
        responses=responses(o.ResponseObject, Problem, PROBLEM, REQUEST_ERRORS),
        operation_class=operation_class(events=EVENT), opt=METERED,
    )
    async def create_response(request: Request[Any, Any, Any]) -> Response[Any]:  # or a Stream
        call = call_of(request)
        body = await read_body(request, limits.body_timeout_seconds)
        decoded = decode_request(body, call.request_id, limits, int(time.time()))
        chat = decoded.chat
        record = call.record
        record.stream = chat.stream
        call.watch()
        consumer = call.identity.consumer
        if chat.stream:
            items = service.stream(chat, report_queue=True, record=record, consumer=consumer, heartbeat=interval)
            machine = ResponseStream(decoded.template, decoded.tools)
            frames = _frames(request, call, items, machine)
            return await stream_response(call, frames, rate_headers=rate_limit_headers)
        answer = await service.complete(chat, record, consumer)
        call.stop_watching()
        record.input_tokens = answer.usage.input_tokens
        record.output_tokens = answer.usage.output_tokens
        record.cached_tokens = answer.usage.cached_tokens
        record.finish_reason = answer.finish_reason
        if record.rate is not None:  # sent by the edge middleware (`Call.rate_headers`)
            call.rate_headers = rate_limit_headers(record.rate)
        return json_answer(encode_response(answer, decoded), None)

    errors = ResponsesErrors(context.problem_base_url)
    return dialect_router("/v1", SURFACE, [create_response], errors, context, unknown_paths=False)


async def _frames(
    request: Request[Any, Any, Any], call: Call, items: AsyncIterator[QueuePosition | ChunkBatch],
    machine: ResponseStream,
) -> AsyncIterator[bytes]:
    """The stream's frames; those of one upstream read go out as one item.

    Before anything is sent a failure is raised (its own status). After, the service's
    heartbeat (an empty batch after `ping_interval_seconds` without news,
    `ChatService.stream`) is a keep-alive; before, it is nothing. A hang-up cancels the
    task reading the items, which closes the service stream and frees the slot.
    """
    record = call.record
    started = False
    try:
        try:
            async for item in items:
                if isinstance(item, QueuePosition):  # positions stay an /llm extension: only "queued" is said
                    data = machine.queued()
                elif not item:  # the heartbeat
                    if started:
                        yield KEEP_ALIVE
                    continue
                else:
                    if not started:
                        _raise_early_failure(item)  # nothing sent yet: the failure gets its own status
                    data = b"".join([machine.feed(chunk.events) for chunk in item])
                    if record.first_token_seconds is None and machine.started:
                        record.first_token_seconds = call.elapsed()
                if data:
                    started = True
                    yield data
                if machine.closed:
                    break
        except Exception as error:
            if not started:
                raise
            failure = as_gateway_error(error, request, call.request_id)
            yield machine.fail(failure.kind, failure.message, failure.status)
            return
        if not machine.closed:
            yield machine.finish()
    finally:
        await items.aclose()  # type: ignore[attr-defined]  # frees the slot now, however the stream ended
        _record_end(call, machine)


def _raise_early_failure(batch: ChunkBatch) -> None:
    """An upstream failure in the first chunk is raised, so that the client gets its status."""
    for event in batch[0].events:
        if type(event) is StreamError:
            error = GatewayError(event.message)
            error.status, error.kind = event.status, event.kind
            raise error


def _record_end(call: Call, machine: ResponseStream) -> None:
    record = call.record
    if machine.usage is not None:
        record.input_tokens = machine.usage.input_tokens
        record.output_tokens = machine.usage.output_tokens
        record.cached_tokens = machine.usage.cached_tokens
    if machine.reason is not None:
        record.finish_reason = machine.reason
    if machine.failure is not None:
        record.error_kind = machine.failure.kind
