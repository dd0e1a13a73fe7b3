"""A minimal third inbound dialect, defined in the test tree (seed 4.1: "adding a third
dialect requires no change here").

Surface `plain`: `POST /plain/v1/generate` takes `{"model": ..., "prompt": ...}` and
answers `{"text": ...}`; failures are `{"error": <kind>, "message": ...}` with the
failure's own status and `Retry-After`. It decodes into the canonical `ChatRequest` and
calls the same `ChatService.complete` as `/v1` and `/llm`, so it meets the same
admission gate: one cap and one FIFO queue per upstream, whatever the surface.

Everything it needs comes from `adapters.inbound._shared` (the `Route`, the
`EdgeContext` bootstrap hands to every dialect, the `serve` frame that renders errors
and turns hang-ups into cancellation) and from the canonical model. It is registered
exactly like the real dialects: `bootstrap.build_app(config, [*bootstrap.DIALECTS, dialect])`.
"""

from __future__ import annotations

import msgspec

from adapters.inbound._shared.dialect import EdgeContext, Route
from adapters.inbound._shared.endpoint import asgi_endpoint, retry_after_headers
from adapters.inbound._shared.exchange import Exchange
from application.chat import ChatService
from domain.canonical import ChatRequest, Message, TextPart
from domain.errors import GatewayError, InvalidRequest

SURFACE = "plain"
PATH = "/plain/v1/generate"
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


class Generate:
    """The work function of `POST /plain/v1/generate`."""

    __slots__ = ("_limit", "_service")

    def __init__(self, service: ChatService, max_body_bytes: int) -> None:
        self._service = service
        self._limit = max_body_bytes

    async def __call__(self, ex: Exchange) -> None:
        request = decode(await ex.read_body(self._limit), ex.request_id)
        ex.watch_disconnect()  # a hang-up while queued cancels the wait: the ticket leaves the queue
        response = await self._service.complete(request, ex.record)
        text = "".join(part.text for part in response.content if isinstance(part, TextPart))
        await ex.respond(200, msgspec.json.encode(GenerateResponse(text=text)), JSON)


class PlainDialect:
    """What bootstrap registers: the surface label and its routes."""

    __slots__ = ()
    name = SURFACE

    def routes(self, context: EdgeContext) -> list[Route]:
        work = Generate(context.service, context.max_body_bytes)
        endpoint = asgi_endpoint(SURFACE, PATH, ("POST",), work, PlainErrors(), context.observer)
        return [Route(PATH, ("POST",), endpoint)]


dialect = PlainDialect()
