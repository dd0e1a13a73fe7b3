"""The `/v1` Router: chat completions (plain and streamed) and the model list.

Failures are rendered by `ProblemRenderer` (the Router's exception handler). A stream's
first frame is awaited before the response is made, so anything refused before that
(unknown model, full queue, upstream down, a malformed first upstream event) still
gets its own status code.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, Router, get, post

from adapters.inbound._shared.dialect import METERED, EdgeContext, dialect_router
from adapters.inbound._shared.edge import Call, call_of, read_body, stream_response
from adapters.inbound._shared.errors import stream_failure
from adapters.inbound._shared.openapi import REQUEST_ERRORS, operation_class, request_body, responses, sse_event
from adapters.inbound.openai import schema as wire
from adapters.inbound.openai.errors import renderer
from adapters.inbound.openai.mapping import decode_request, encode_models, response_body
from adapters.inbound.openai.rate_headers import rate_limit_header_map
from adapters.inbound.openai.stream import NATIVE_FORMAT, ChunkWriter
from domain.canonical import ChatResponse, StreamChunk, StreamError
from domain.errors import GatewayError

SURFACE = "openai"
JSON = "application/json"
PROBLEM = "application/problem+json"
EVENT = sse_event("`data:` is a `chat.completion.chunk` (JSON), an `{\"error\": ...}` object after a failure, "
                  "and `[DONE]` last")


def router(context: EdgeContext) -> Router:
    """The `/v1` Router (what bootstrap mounts)."""
    service, limits = context.service, context.limits
    models_body = encode_models(service.models(), int(time.time()))  # encoded once at startup

    @post(
        "/chat/completions", status_code=200, summary="OpenAI chat completion",
        operation_id="OpenAI_chat_completion", dependencies=request_body(wire.ChatCompletionRequest),
        responses=responses(wire.ChatCompletion, wire.Problem, PROBLEM, REQUEST_ERRORS),
        operation_class=operation_class(events=EVENT), opt=METERED,
    )
    async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:  # or a Stream
        call = call_of(request)
        body = await read_body(request, limits.body_timeout_seconds)
        decoded = decode_request(body, call.request_id, limits)
        chat = decoded.chat
        call.record.stream = chat.stream
        call.watch()
        if chat.stream:
            consumer = call.identity.consumer
            batches = service.stream(chat, record=call.record, consumer=consumer)  # fills model, upstream, ...
            writer = ChunkWriter(decoded.include_usage, chat.model, call.request_id)
            frames = _frames(request, call, batches, writer)
            return await stream_response(call, frames, rate_headers=rate_limit_header_map)
        return _complete(call, await service.complete(chat, call.record, call.identity.consumer), chat.model)

    @get(
        "/models", summary="OpenAI model list", operation_id="OpenAI_model_list",
        responses=responses(wire.ModelList, wire.Problem, PROBLEM, [401, 431]),
    )
    async def models() -> Response[bytes]:
        return Response(models_body, media_type=JSON)

    return dialect_router("/v1", SURFACE, [chat_completions, models], renderer, context)


def _complete(call: Call, response: ChatResponse, model: str) -> Response[bytes]:
    call.stop_watching()
    record = call.record
    record.input_tokens = response.usage.input_tokens
    record.output_tokens = response.usage.output_tokens
    record.finish_reason = response.finish_reason
    headers = rate_limit_header_map(record.rate) if record.rate is not None else None
    return Response(response_body(response, model, NATIVE_FORMAT), media_type=JSON, headers=headers)


async def _frames(
    request: Request[Any, Any, Any], call: Call, batches: AsyncIterator[Any], writer: ChunkWriter
) -> AsyncIterator[bytes]:
    """The stream's frames: those of one upstream read (one batch) as one item.

    Until the first item is yielded, a failure is raised (the response has not started);
    after, it ends the stream with an error frame and `[DONE]`.
    """
    started = False
    try:
        async for batch in batches:
            if type(batch) is not list:  # report_queue=False: never a position
                continue
            if not started:
                _raise_early_failure(batch[0])  # nothing sent yet: the failure gets its own status
                call.record.first_token_seconds = call.elapsed()
            data = b"".join([writer.feed(chunk) for chunk in batch])
            if writer.error is not None:
                call.record.error_kind = writer.error.kind
                yield data
                return
            if data or not started:
                started = True
                yield data
        yield writer.finish()  # an upstream that answered nothing still gets a valid stream
    except Exception as error:
        if not started:
            raise
        yield stream_failure(error, renderer, request)
    finally:
        await batches.aclose()  # type: ignore[attr-defined]
        _record_usage(call, writer)


def _raise_early_failure(chunk: StreamChunk) -> None:
    """An upstream failure in the first chunk (e.g. a malformed or empty event stream) is
    raised, so that the client gets the failure's status, as on `/llm`, not a 200."""
    for event in chunk.events:
        if type(event) is StreamError:
            error = GatewayError(event.message)
            error.status, error.kind = event.status, event.kind
            raise error


def _record_usage(call: Call, writer: ChunkWriter) -> None:
    record = call.record
    if writer.usage is not None:
        record.input_tokens = writer.usage.input_tokens
        record.output_tokens = writer.usage.output_tokens
    if writer.finish_reason is not None:
        record.finish_reason = writer.finish_reason

