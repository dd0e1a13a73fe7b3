"""Input limits below the network: decoders, the shared edge of the dialect Routers, the config."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from litestar import Litestar, Request, Response, post
from tests.support import asgi

from adapters.inbound._shared.bodies import read_body
from adapters.inbound._shared.call import call_of
from adapters.inbound._shared.dialect import EdgeContext, dialect_router
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.errors import ErrorRenderer
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.anthropic.errors import AnthropicErrors
from adapters.inbound.anthropic.mapping import decode_count_tokens, decode_messages
from adapters.inbound.openai.errors import ProblemRenderer
from adapters.inbound.openai.mapping import decode_request
from config import ConfigError, load_config_text
from domain.errors import GatewayError, InvalidRequest, PayloadTooLarge, RequestTimeout
from domain.records import RequestRecord
from wiring.http_app import input_limits

LIMITS = InputLimits(max_messages=3, max_content_blocks=2, max_output_tokens={"m": 100})
USER = {"role": "user", "content": "hi"}
BLOCKS = [{"type": "text", "text": "a"}] * 3


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [USER], **fields}).encode()


def refused(call: Any, *args: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        call(*args)
    return caught.value


# --- /v1 ---------------------------------------------------------------------------


def test_openai_counts_messages_and_parts() -> None:
    assert refused(decode_request, body(messages=[USER] * 4), "", LIMITS).param == "messages"
    error = refused(decode_request, body(messages=[{"role": "user", "content": BLOCKS}]), "", LIMITS)
    assert error.param == "messages[0].content" and "3 content blocks" in error.message
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turns = [USER, {"role": "assistant", "tool_calls": [call] * 3}]
    assert refused(decode_request, body(messages=turns), "", LIMITS).param == "messages[1].tool_calls"
    assert len(decode_request(body(messages=[USER] * 3), "", LIMITS).chat.messages) == 3


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_openai_output_cap_names_the_field(field: str) -> None:
    error = refused(decode_request, body(**{field: 101}), "", LIMITS)
    assert error.param == field and "at most 100" in error.message
    assert decode_request(body(**{field: 100}), "", LIMITS).chat.max_tokens == 100


def test_openai_output_cap_fills_in_and_spares_other_models() -> None:
    assert decode_request(body(), "", LIMITS).chat.max_tokens == 100  # none asked: the cap
    assert decode_request(body(model="other", max_tokens=10**6), "", LIMITS).chat.max_tokens == 10**6
    assert decode_request(body(model="other"), "", LIMITS).chat.max_tokens is None
    both = decode_request(body(max_tokens=50, max_completion_tokens=60), "", LIMITS).chat
    assert both.max_tokens == 60


def test_default_limits_are_the_documented_ones() -> None:
    limits = InputLimits()
    assert (limits.max_messages, limits.max_content_blocks, limits.max_header_bytes) == (2048, 512, 32768)
    assert limits.body_timeout_seconds == 30.0 and not limits.max_output_tokens
    assert len(decode_request(body(messages=[USER] * 2048)).chat.messages) == 2048
    assert refused(decode_request, body(messages=[USER] * 2049)).param == "messages"


@pytest.mark.parametrize("decode", [
    lambda raw: decode_request(raw),
    lambda raw: decode_messages(raw, ""),
    lambda raw: decode_count_tokens(raw, ""),
], ids=["v1", "llm", "count_tokens"])
@pytest.mark.parametrize("nesting", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000])
def test_deep_nesting_is_invalid_not_a_crash(decode: Any, nesting: bytes) -> None:
    raw = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"x":' + nesting + b"}"
    assert "nested too deeply" in refused(decode, raw).message


# --- /llm --------------------------------------------------------------------------


def test_anthropic_counts_messages_blocks_and_system() -> None:
    assert refused(decode_messages, body(max_tokens=5, messages=[USER] * 4), "", LIMITS).param == "messages"
    error = refused(decode_messages, body(max_tokens=5, messages=[{"role": "user", "content": BLOCKS}]), "", LIMITS)
    assert error.param == "messages.0.content"
    assert refused(decode_messages, body(max_tokens=5, system=BLOCKS), "", LIMITS).param == "system"
    assert refused(decode_count_tokens, body(messages=[USER] * 4), "", LIMITS).param == "messages"


def test_anthropic_output_cap() -> None:
    error = refused(decode_messages, body(max_tokens=101), "", LIMITS)
    assert error.param == "max_tokens" and "`max_tokens` is 101" in error.message
    assert decode_messages(body(max_tokens=100), "", LIMITS).max_tokens == 100
    assert decode_messages(body(model="other", max_tokens=10**6), "", LIMITS).max_tokens == 10**6


# --- the shared edge of every dialect Router -------------------------------------------


class Observer:
    def request_started(self, record: RequestRecord, headers: object) -> None:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        self.record = record


Work = Callable[[Request[Any, Any, Any]], Awaitable[Response[bytes]]]


def edge_app(work: Work, errors: ErrorRenderer = ProblemRenderer(), max_header_bytes: int = 0) -> EdgeMiddleware:
    """One route, `POST /s/r`, on a dialect Router with the shared edge (10-byte bodies)."""

    @post("/r", status_code=200)
    async def handler(request: Request[Any, Any, Any]) -> Response[bytes]:
        return await work(request)

    limits = InputLimits(max_header_bytes=max_header_bytes, body_timeout_seconds=0.05)
    context = EdgeContext(service=cast(Any, None), observer=Observer(), max_body_bytes=10,
                          ping_interval_seconds=1.0, limits=limits)
    return EdgeMiddleware(Litestar([dialect_router("/s", "s", [handler], errors, context)], openapi_config=None,
                                   logging_config=None))


async def echo_body(request: Request[Any, Any, Any]) -> Response[bytes]:
    return Response(await read_body(request, 0.05))


async def test_header_bytes_count_the_target_and_every_header() -> None:
    async def work(request: Request[Any, Any, Any]) -> Response[bytes]:
        return Response(str(call_of(request).header_bytes).encode())

    reply = await asgi.request(edge_app(work), "POST", "/s/r", headers=[(b"x-request-id", b"abc")])
    assert int(reply.body) == len(b"/s/r") + len(b"host") + len(b"test") + len(b"x-request-id") + 3
    assert reply.headers[b"x-request-id"] == b"abc"


async def send_parts(app: Litestar, parts: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]) -> Any:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop(0)
        await asyncio.sleep(10)  # a stuck client
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(asgi.scope("POST", "/s/r", headers), receive, send), 5)
    return sent


async def test_a_stuck_body_times_out_with_a_408_that_closes_the_connection() -> None:
    sent = await send_parts(edge_app(echo_body), [{"type": "http.request", "body": b"ab", "more_body": True}], [])
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"not received within 0.05 seconds" in sent[1]["body"]


async def test_a_body_in_pieces_within_the_time_and_size() -> None:
    pieces = [{"type": "http.request", "body": b"ab", "more_body": True},
              {"type": "http.request", "body": b"cd", "more_body": False}]
    sent = await send_parts(edge_app(echo_body), pieces, [])
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"abcd"
    sent = await send_parts(edge_app(echo_body), [], [(b"content-length", b"11")])
    assert sent[0]["status"] == 413 and b"larger than 10 bytes" in sent[1]["body"]
    too_long = [{"type": "http.request", "body": b"x" * 11, "more_body": False}]
    assert (await send_parts(edge_app(echo_body), too_long, []))[0]["status"] == 413


@pytest.mark.parametrize(("errors", "expected"), [(ProblemRenderer(), b"application/problem+json"),
                                                  (AnthropicErrors(), b"application/json")])
async def test_large_headers_are_a_431_in_the_surface_shape(errors: Any, expected: bytes) -> None:
    async def work(request: Request[Any, Any, Any]) -> Response[bytes]:
        raise AssertionError("not reached")

    reply = await asgi.request(edge_app(work, errors, 64), "POST", "/s/r", headers=[(b"x-big", b"a" * 64)])
    assert reply.status == 431 and reply.headers[b"content-type"] == expected
    assert b"at most 64" in reply.body


async def test_recursion_past_decoding_is_a_400_not_a_500() -> None:
    async def work(request: Request[Any, Any, Any]) -> Response[bytes]:
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")

    reply = await asgi.request(edge_app(work), "POST", "/s/r")
    assert reply.status == 400 and b"nested too deeply" in reply.body


async def test_an_unexpected_fault_is_a_500_revealing_nothing() -> None:
    async def work(request: Request[Any, Any, Any]) -> Response[bytes]:
        raise KeyError("secret-internal-name")

    reply = await asgi.request(edge_app(work), "POST", "/s/r")
    assert reply.status == 500 and reply.headers[b"content-type"] == b"application/problem+json"
    assert b"secret" not in reply.body and reply.json()["error"]["code"] == "internal"


# --- config and bootstrap ---------------------------------------------------------------

CONFIG = """
[server]
max_messages = 10
[upstreams.a]
url = "http://a:80"
models = ["m1", "m2"]
aliases = ["claude-*"]
max_output_tokens = 4096
[upstreams.b]
url = "http://b:80"
models = ["m3"]
"""


def test_config_keys_reach_the_limits() -> None:
    limits = input_limits(load_config_text(CONFIG))
    assert limits.max_messages == 10 and limits.max_content_blocks == 512
    assert dict(limits.max_output_tokens) == {"m1": 4096, "m2": 4096}
    assert limits.max_output_tokens.get("claude-sonnet-4-6") == 4096  # an alias has its upstream's cap
    assert limits.max_output_tokens.get("m3") is None and limits.max_output_tokens.get("other") is None
    server = load_config_text(CONFIG).server
    assert (server.max_header_bytes, server.header_timeout_seconds, server.body_timeout_seconds) == (32768, 10.0, 30.0)


@pytest.mark.parametrize(("text", "key"), [
    (CONFIG.replace("max_output_tokens = 4096", "max_output_tokens = 0"), "upstreams.a.max_output_tokens"),
    (CONFIG.replace("max_messages = 10", "max_messages = -1"), "server.max_messages"),
    (CONFIG.replace("max_messages = 10", "body_timeout_seconds = 0"), "server.body_timeout_seconds"),
])
def test_bad_limits_are_config_errors_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config_text(text)


def test_limit_errors_are_client_errors() -> None:
    for error in (RequestTimeout("x"), PayloadTooLarge("x")):
        assert isinstance(error, GatewayError) and 400 <= error.status < 500
