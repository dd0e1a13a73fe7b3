"""A minimal third inbound dialect, defined in the test tree (the design's promise: "adding a third
dialect requires no change here").

Surface `plain`: `POST /plain/v1/generate` takes `{"model": ..., "prompt": ...}` and
answers `{"text": ...}`; failures are `{"error": <kind>, "message": ...}` with the
failure's own status and `Retry-After`. It decodes into the canonical `ChatRequest` and
calls the same `ChatService.complete` as `/v1` and `/llm`, so it meets the same
admission gate: one cap and one FIFO queue per upstream, whatever the surface.

Everything it needs comes from `adapters.inbound._shared` (the `EdgeContext` bootstrap
hands to every dialect, `dialect_router` which gives its Router the shared edge: one
record per request, errors rendered by its `ErrorRenderer`, hang-ups while waiting
turned into cancellation) and from the canonical model. It is registered exactly like
the real dialects: `bootstrap.build_app(config, [*bootstrap.DIALECTS, router])`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, Router, post

from adapters.inbound._shared.bodies import read_body
from adapters.inbound._shared.call import call_of
from adapters.inbound._shared.dialect import METERED, EdgeContext, dialect_router
from adapters.inbound._shared.errors import retry_after_headers
from domain.canonical import ChatRequest, Message, TextPart
from domain.errors import GatewayError, InvalidRequest

SURFACE = "plain"
PATH = "/plain/v1/generate"  # the Router at `/plain`, its handler at `/v1/generate`
JSON = b"application/json"


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    prompt: str
    max_tokens: int | None = None


class GenerateResponse(msgspec.Struct):
    text: str


class ErrorBody(msgspec.Struct):
    error: str
    message: str


_DECODER = msgspec.json.Decoder(GenerateRequest)


def decode(body: bytes, request_id: str) -> ChatRequest:
    """Wire format -> the dialect-neutral canonical request."""
    try:
        wire = _DECODER.decode(body)
    except msgspec.DecodeError as error:  # ValidationError is a DecodeError
        raise InvalidRequest(f"Invalid request body: {error}") from None
    return ChatRequest(
        model=wire.model,
        messages=[Message(role="user", content=[TextPart(text=wire.prompt)])],
        max_tokens=wire.max_tokens,
        surface=SURFACE,  # a label for logs and traces; admission never reads it
        request_id=request_id,
    )


class PlainErrors:
    """This dialect's `ErrorRenderer`: its own error shape, the shared decision's status."""

    __slots__ = ()

    def render(self, error: GatewayError, request_id: str) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        body = msgspec.json.encode(ErrorBody(error=error.kind, message=error.message))
        return error.status, body, JSON, retry_after_headers(error)

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        return b""  # this dialect never streams


def router(context: EdgeContext) -> Router:
    """What bootstrap registers: this dialect's Router, mounted at `/plain`."""
    service = context.service

    @post("/v1/generate", status_code=200, opt=METERED)
    async def generate(request: Request[Any, Any, Any]) -> Response[bytes]:
        call = call_of(request)
        chat = decode(await read_body(request, context.limits.body_timeout_seconds), call.request_id)
        call.watch()  # a hang-up while queued cancels the wait: the ticket leaves the queue
        response = await service.complete(chat, call.record)
        text = "".join(part.text for part in response.content if isinstance(part, TextPart))
        return Response(msgspec.json.encode(GenerateResponse(text=text)), media_type="application/json")

    return dialect_router("/plain", SURFACE, [generate], PlainErrors(), context)
