"""The `/v1` Router: chat completions and text completions (plain and streamed), embeddings,
the model list, and the problem+json 404 of every other `/v1/...` path.

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
from litestar.handlers import HTTPRouteHandler

from adapters.inbound._shared.bodies import read_body, stream_response
from adapters.inbound._shared.call import Call, call_of
from adapters.inbound._shared.dialect import METERED, EdgeContext, dialect_router
from adapters.inbound._shared.errors import ErrorRenderer, stream_failure
from adapters.inbound._shared.json_answer import json_answer
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound._shared.openapi import REQUEST_ERRORS, operation_class, request_body, responses, sse_event
from adapters.inbound._shared.ratelimit_headers import rate_limit_headers
from adapters.inbound.openai import completions_schema as cw
from adapters.inbound.openai import schema as wire
from adapters.inbound.openai.answers import encode_models, response_body
from adapters.inbound.openai.completions_mapping import (
    completion_body,
    decode_completion,
    decode_embeddings,
    embeddings_body,
)
from adapters.inbound.openai.errors import ProblemRenderer
from adapters.inbound.openai.mapping import decode_request
from adapters.inbound.openai.stream import NATIVE_FORMAT, ChunkWriter
from adapters.inbound.openai.text_stream import TextChunkWriter
from application.completions import CompletionService, EmbeddingService
from domain.canonical import ChatResponse, StreamChunk, StreamError
from domain.errors import GatewayError

SURFACE = "openai"
JSON = "application/json"
PROBLEM = "application/problem+json"
EVENT = sse_event("`data:` is a `chat.completion.chunk` (JSON), an `{\"error\": ...}` object after a failure, "
                  "and `[DONE]` last")
TEXT_EVENT = sse_event("`data:` is a `text_completion` chunk (JSON), an `{\"error\": ...}` object after a failure, "
                       "and `[DONE]` last")


def router(context: EdgeContext) -> Router:
    """The `/v1` Router (what bootstrap mounts)."""
    service, limits = context.service, context.limits
    errors = ProblemRenderer(context.problem_base_url)
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
            frames = _frames(request, call, batches, writer, errors)
            return await stream_response(call, frames, rate_headers=rate_limit_headers)
        return _complete(call, await service.complete(chat, call.record, call.identity.consumer), chat.model)

    @get(
        "/models", summary="OpenAI model list", operation_id="OpenAI_model_list",
        responses=responses(wire.ModelList, wire.Problem, PROBLEM, [401, 431]),
    )
    async def models() -> Response[bytes]:
        return Response(models_body, media_type=JSON)

    handlers = [chat_completions, models]
    if context.completions is not None:
        handlers.append(text_completions_handler(context.completions, limits, errors))
    if context.embeddings is not None:
        handlers.append(embeddings_handler(context.embeddings, limits))
    return dialect_router("/v1", SURFACE, handlers, errors, context)


def text_completions_handler(
    service: CompletionService, limits: InputLimits, errors: ErrorRenderer
) -> HTTPRouteHandler:
    @post(
        "/completions", status_code=200, summary="OpenAI text completion", operation_id="OpenAI_completion",
        dependencies=request_body(cw.CompletionRequest),
        responses=responses(cw.TextCompletion, wire.Problem, PROBLEM, REQUEST_ERRORS),
        operation_class=operation_class(events=TEXT_EVENT), opt=METERED,
    )
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:  # or a Stream
        call = call_of(request)
        decoded = decode_completion(await read_body(request, limits.body_timeout_seconds), call.request_id, limits)
        text = decoded.request
        call.record.stream, call.record.operation = text.stream, "text_completion"
        call.watch()
        consumer = call.identity.consumer
        if text.stream:
            writer = TextChunkWriter(decoded.include_usage, text.model, call.request_id)
            frames = _frames(request, call, service.stream(text, call.record, consumer), writer, errors)
            return await stream_response(call, frames, rate_headers=rate_limit_headers)
        answer = await service.complete(text, call.record, consumer)
        call.stop_watching()
        record = call.record
        record.input_tokens, record.output_tokens = answer.usage.input_tokens, answer.usage.output_tokens
        record.cached_tokens = answer.usage.cached_tokens
        record.finish_reason = answer.finish_reason
        return _answer(call, completion_body(answer, text.model))

    return completions


def embeddings_handler(service: EmbeddingService, limits: InputLimits) -> HTTPRouteHandler:
    @post(
        "/embeddings", status_code=200, summary="OpenAI embeddings", operation_id="OpenAI_embeddings",
        dependencies=request_body(cw.EmbeddingRequest),
        responses=responses(cw.EmbeddingList, wire.Problem, PROBLEM, REQUEST_ERRORS),
        operation_class=operation_class(), opt=METERED,
    )
    async def embeddings(request: Request[Any, Any, Any]) -> Response[bytes]:
        call = call_of(request)
        inputs = decode_embeddings(await read_body(request, limits.body_timeout_seconds), call.request_id, limits)
        call.record.operation = "embeddings"
        call.watch()
        answer = await service.embed(inputs, call.record, call.identity.consumer)
        call.stop_watching()
        call.record.input_tokens = answer.usage.input_tokens
        return _answer(call, embeddings_body(answer, inputs.model))

    return embeddings


def _answer(call: Call, body: bytes) -> Response[bytes]:
    """A JSON answer; a limited consumer's rate-limit headers go with it (`Call.rate_headers`)."""
    rate = call.record.rate
    if rate is not None:
        call.rate_headers = rate_limit_headers(rate)
    return json_answer(body, None)


def _complete(call: Call, response: ChatResponse, model: str) -> Response[bytes]:
    call.stop_watching()
    record = call.record
    record.input_tokens = response.usage.input_tokens
    record.output_tokens = response.usage.output_tokens
    record.cached_tokens = response.usage.cached_tokens
    record.finish_reason = response.finish_reason
    return _answer(call, response_body(response, model, NATIVE_FORMAT))


async def _frames(
    request: Request[Any, Any, Any], call: Call, batches: AsyncIterator[Any], writer: ChunkWriter | TextChunkWriter,
    errors: ErrorRenderer,
) -> AsyncIterator[bytes]:
    """The stream's frames: those of one upstream read (one batch) as one item.

    Until the first item is yielded, a failure is raised (the response has not started);
    after, it ends the stream with an error frame and `[DONE]`.

    Once the answer is finished and its usage came (only the upstream's `[DONE]` may
    follow, which vLLM writes with them), that read's frames wait for the next batch or
    the end, so the last frames and `[DONE]` go out in one send; anything the upstream
    still sends is handled as before.
    """
    started = False  # an item was yielded: the response has begun
    first = True
    held: bytes | None = None  # the frames of the read that finished the answer, sent with what follows
    try:
        async for batch in batches:
            if type(batch) is not list:  # report_queue=False: never a position
                continue
            if first:
                first = False
                _raise_early_failure(batch[0])  # nothing sent yet: the failure gets its own status
                call.record.first_token_seconds = call.elapsed()
            data = writer.feed(batch[0]) if len(batch) == 1 else b"".join([writer.feed(chunk) for chunk in batch])
            if held is not None:
                data, held = held + data, None
            if writer.error is not None:
                call.record.error_kind = writer.error.kind
                started = True
                yield data
                return
            if writer.usage is not None and writer.finish_reason is not None:
                held = data
                continue
            if data or not started:
                started = True
                yield data
        data = writer.finish()  # an upstream that answered nothing still gets a valid stream
        started = True
        yield data if held is None else held + data
    except Exception as error:
        if held is None and not started:
            raise
        failure = stream_failure(error, errors, request)
        yield failure if held is None else held + failure
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


def _record_usage(call: Call, writer: ChunkWriter | TextChunkWriter) -> None:
    record = call.record
    if writer.usage is not None:
        record.input_tokens = writer.usage.input_tokens
        record.output_tokens = writer.usage.output_tokens
        record.cached_tokens = writer.usage.cached_tokens
    if writer.finish_reason is not None:
        record.finish_reason = writer.finish_reason

