"""The OpenAPI document of the dialect endpoints, as declarations on their Litestar handlers.

Litestar's own generator writes `docs/openapi.json` (`scripts/openapi.py` dumps it) and
serves it at `/schema`. The wire Structs are declared on the handlers: the response
ones through `ResponseSpec`, the request body through `request_body` (below), because
a handler decodes its body itself. What `ResponseSpec` cannot say (an SSE alternative to
a 200, the `Retry-After` header of a 503) is added by the handler's `operation_class`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from litestar.di import Provide
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Schema,
)

SCHEMA_PATH = "/schema"  # outside every dialect's prefix

DESCRIPTION = """\
LLM gateway in front of self-hosted OpenAI-compatible model servers (vLLM). Two client
dialects over the same upstreams: `/v1` is OpenAI Chat Completions, `/llm` is Anthropic
Messages. Requests are admitted per upstream under a concurrency cap; overflow waits in
a bounded FIFO queue (503 + Retry-After when full). Streaming answers
(`"stream": true`) are server-sent events. Errors: `/v1` answers RFC 9457 problem
documents with an OpenAI-style `error` member, `/llm` the Anthropic error shape (see
docs/errors.md). API keys: with `[auth] mode = "required"` every request needs a key as
`Authorization: Bearer <key>` or `x-api-key: <key>` (401 otherwise); with auth off (the
default) none is checked (README "API keys", SECURITY.md). Consumers over a request or
token limit get 429 with Retry-After and the dialect's rate-limit headers."""

ERRORS = {  # status -> when (docs/errors.md)
    400: "Invalid request: malformed JSON, wrong types, missing fields, a limit exceeded",
    401: "Missing, unknown or revoked API key, or two different keys (only with `[auth] mode = \"required\"`)",
    404: "Unknown model (or path)",
    405: "Method not allowed",
    408: "The request body was not received within `server.body_timeout_seconds`",
    413: "Request body larger than `server.max_body_bytes`",
    429: "The consumer is over a request or token limit (with Retry-After)",
    431: "Request target and headers larger than `server.max_header_bytes`",
    501: "Token counting is not available: the model's upstream has no tokenizer endpoint",
    502: "The upstream failed or answered malformed",
    503: "Queue full, queue wait timed out, or draining (with Retry-After)",
    504: "The upstream timed out",
}
REQUEST_ERRORS = (400, 401, 404, 405, 408, 413, 429, 431, 502, 503, 504)  # of a request that reaches an upstream

_RETRY_AFTER = OpenAPIHeader(
    required=True, description="whole seconds to wait", schema=Schema(type=OpenAPIType.STRING, pattern="^[0-9]+$")
)


def openapi_config(version: str) -> OpenAPIConfig:
    """The app's OpenAPI: JSON only (no documentation site), at `SCHEMA_PATH`."""
    return OpenAPIConfig(
        title="gateway", version=version, description=DESCRIPTION, path=SCHEMA_PATH,
        render_plugins=[JsonRenderPlugin()],
    )


def request_body(struct: type[Any]) -> dict[str, Provide]:
    """`dependencies=` that document `struct` as the handler's JSON request body.

    A handler reads its body itself (`read_body`, with its timeout) and decodes it with
    its dialect's decoder (whose error wording clients see), so it takes no `data:`.
    Litestar documents the `data:` of a handler's dependencies as its body, and resolves
    only the dependencies a handler asks for: this one is described and never run.
    """

    async def body(data: Any) -> None:  # pragma: no cover - never resolved
        raise AssertionError("request_body is a declaration")

    body.__annotations__["data"] = struct  # the Struct itself, not a name to resolve
    return {"request_body": Provide(body)}


def responses(
    ok: type[Any], error: type[Any], error_media_type: str, statuses: Iterable[int]
) -> dict[int, ResponseSpec]:
    """The 200 answer `ok`, and each status in `statuses` answered with `error`."""
    specs = {200: ResponseSpec(ok, description="Success", generate_examples=False)}
    for status in statuses:
        specs[status] = ResponseSpec(
            error, description=ERRORS[status], media_type=error_media_type, generate_examples=False
        )
    return specs


def sse_event(description: str, names: list[str] | None = None) -> Schema:
    """One server-sent event (the OpenAPI 3.2 convention for `text/event-stream`)."""
    event = Schema(type=OpenAPIType.STRING, enum=names)
    return Schema(
        type=OpenAPIType.OBJECT, description=description,
        properties={"event": event, "data": Schema(type=OpenAPIType.STRING), "id": Schema(type=OpenAPIType.STRING),
                    "retry": Schema(type=OpenAPIType.INTEGER)},
    )


def operation_class(events: Schema | None = None) -> type[Operation]:
    """An `operation_class` adding what `ResponseSpec` cannot: `events` as the 200's
    `text/event-stream` alternative, and a required `Retry-After` on a 503."""

    @dataclass
    class DialectOperation(Operation):
        def __post_init__(self) -> None:
            answers = self.responses or {}
            ok, refused = answers.get("200"), answers.get("503")
            if events is not None and isinstance(ok, OpenAPIResponse):
                ok.content = {**(ok.content or {}), "text/event-stream": OpenAPIMediaType(schema=events)}
            if isinstance(refused, OpenAPIResponse):
                refused.headers = {"Retry-After": _RETRY_AFTER}

    return DialectOperation
