"""The `/v1` work functions: chat completions (plain and streamed) and the model list.

Each runs inside `serve` (adapters.inbound._shared.endpoint), which renders failures
with `ProblemRenderer` and reports one record per request. A stream's 200 is sent
only when the first chunk arrives, so anything refused before that (unknown model,
full queue, upstream down) still gets its own status code.
"""

from __future__ import annotations

import time

from adapters.inbound._shared.dialect import EdgeContext, Route
from adapters.inbound._shared.endpoint import Work, asgi_endpoint, not_found_route
from adapters.inbound._shared.exchange import Exchange
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.openai.errors import renderer
from adapters.inbound.openai.mapping import decode_request, encode_models, response_body
from adapters.inbound.openai.stream import NATIVE_FORMAT, ChunkWriter
from application.chat import ChatService
from domain.canonical import ChatRequest, ChatResponse, StreamChunk, StreamError
from domain.errors import GatewayError

SURFACE = "openai"
JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"


class ChatCompletions:
    """POST /v1/chat/completions."""

    __slots__ = ("_limit", "_limits", "_service")

    def __init__(self, service: ChatService, max_body_bytes: int, limits: InputLimits | None = None) -> None:
        self._service = service
        self._limit = max_body_bytes
        self._limits = limits or InputLimits()

    async def __call__(self, ex: Exchange) -> None:
        limits = self._limits
        body = await ex.read_body(self._limit, limits.body_timeout_seconds)
        decoded = decode_request(body, ex.request_id, limits)
        request = decoded.chat
        ex.record.stream = request.stream
        ex.watch_disconnect()
        if request.stream:
            await self._stream(ex, request, decoded.include_usage)
        else:
            await self._complete(ex, request)

    async def _complete(self, ex: Exchange, request: ChatRequest) -> None:
        response: ChatResponse = await self._service.complete(request, ex.record)
        record = ex.record
        record.input_tokens = response.usage.input_tokens
        record.output_tokens = response.usage.output_tokens
        record.finish_reason = response.finish_reason
        await ex.respond(200, response_body(response, request.model, NATIVE_FORMAT), JSON)

    async def _stream(self, ex: Exchange, request: ChatRequest, include_usage: bool) -> None:
        """Relay the service stream: the frames of one upstream read (one batch) go out in
        one send, as soon as that read is handled."""
        writer = ChunkWriter(include_usage, request.model, ex.request_id)
        batches = self._service.stream(request, record=ex.record)  # fills model, upstream, queue wait
        try:
            async for batch in batches:
                if type(batch) is not list:  # report_queue=False: never a position
                    continue
                if not ex.started:
                    _raise_early_failure(batch[0])  # nothing sent yet: the failure gets its own status
                    ex.record.first_token_seconds = ex.elapsed()
                    await ex.start_stream(200, EVENT_STREAM)
                data = b"".join([writer.feed(chunk) for chunk in batch])
                if writer.error is not None:
                    ex.record.error_kind = writer.error.kind
                    await ex.end_stream(data)
                    return
                if data:
                    await ex.send_chunk(data)
            if not ex.started:  # an upstream that answered nothing still gets a valid stream
                await ex.start_stream(200, EVENT_STREAM)
            await ex.end_stream(writer.finish())
        finally:
            await batches.aclose()  # type: ignore[attr-defined]
            _record_usage(ex, writer)


def _raise_early_failure(chunk: StreamChunk) -> None:
    """An upstream failure in the first chunk (e.g. a malformed or empty event stream) is
    raised, so that the client gets the failure's status, as on `/llm`, not a 200."""
    for event in chunk.events:
        if type(event) is StreamError:
            error = GatewayError(event.message)
            error.status, error.kind = event.status, event.kind
            raise error


def _record_usage(ex: Exchange, writer: ChunkWriter) -> None:
    record = ex.record
    if writer.usage is not None:
        record.input_tokens = writer.usage.input_tokens
        record.output_tokens = writer.usage.output_tokens
    if writer.finish_reason is not None:
        record.finish_reason = writer.finish_reason


def model_list(body: bytes) -> Work:
    """GET /v1/models: the configured names, encoded once at startup."""

    async def work(ex: Exchange) -> None:
        await ex.respond(200, body, JSON)

    return work


def routes(context: EdgeContext) -> list[Route]:
    """The `/v1` routes, each a raw ASGI endpoint."""
    observer, header_limit = context.observer, context.limits.max_header_bytes
    chat = ChatCompletions(context.service, context.max_body_bytes, context.limits)
    models = model_list(encode_models(context.service.models(), int(time.time())))
    return [
        Route(
            "/v1/chat/completions",
            ("POST",),
            asgi_endpoint(SURFACE, "/v1/chat/completions", ("POST",), chat, renderer, observer, header_limit),
        ),
        Route(
            "/v1/models",
            ("GET",),
            asgi_endpoint(SURFACE, "/v1/models", ("GET",), models, renderer, observer, header_limit),
        ),
        not_found_route(SURFACE, "/v1", renderer, observer, header_limit),
    ]
