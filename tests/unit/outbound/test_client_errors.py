"""The errors an `OpenAICompatClient` call raises (against `scripted_upstream.py`, or a raw
socket): error answers by status and body (vLLM's message shown, anything else never), a body
that is not what was asked for, timeouts, resets and refused connections, before the head or
as a stream's final error chunk."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from tests.unit.outbound.scripted_upstream import CONTEXT_TOO_LONG, Upstream, collect, request, scripted_upstream

from domain.canonical import Finish, StreamError, TextDelta
from domain.errors import UpstreamError, UpstreamProtocolError, UpstreamRejected, UpstreamTimeout, UpstreamUnavailable


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    async with scripted_upstream() as state:
        yield state


@pytest.mark.parametrize(
    ("model", "message"), [("nested500", "EngineCore died"), ("flat500", "old vLLM failure")]
)
async def test_upstream_5xx(up: Upstream, model: str, message: str) -> None:
    c = up.client()
    with pytest.raises(UpstreamError) as caught:
        await c.complete(request(model))
    assert type(caught.value) is UpstreamError and caught.value.message == message
    with pytest.raises(UpstreamError, match=message):
        await collect(c, request(model))


async def test_context_too_long_is_rejected_with_vllm_message(up: Upstream) -> None:
    c = up.client()
    for call in (c.complete, lambda r: collect(c, r)):
        with pytest.raises(UpstreamRejected) as caught:
            await call(request("context400"))
        assert caught.value.status == 400 and caught.value.message == CONTEXT_TOO_LONG


async def test_garbage_body_is_a_protocol_error(up: Upstream) -> None:
    c = up.client()
    with pytest.raises(UpstreamProtocolError):
        await c.complete(request("garbage"))
    with pytest.raises(UpstreamProtocolError, match="without an event stream") as caught:
        await collect(c, request("garbage"))
    assert "oops" not in caught.value.message


@pytest.mark.parametrize(
    "content_type", ["text/event-stream; charset=utf-8", "Text/Event-Stream", " text/event-stream ;x=1"]
)
async def test_an_event_stream_is_known_by_its_media_type_whatever_its_parameters_or_case(
    up: Upstream, content_type: str
) -> None:
    chunks = await collect(up.client(), request("typed:" + content_type))
    assert Finish(reason="end_turn") in [e for c in chunks for e in c.events]


@pytest.mark.parametrize("content_type", ["text/event-streams", "application/json", "text/plain; x=text/event-stream"])
async def test_another_media_type_is_not_an_event_stream(up: Upstream, content_type: str) -> None:
    with pytest.raises(UpstreamProtocolError, match="without an event stream"):
        await collect(up.client(), request("typed:" + content_type))


@pytest.mark.parametrize(("model", "status"), [("html502", 502), ("html404", 404), ("bare500", 500)])
async def test_an_error_body_not_in_vllms_shape_is_never_shown(up: Upstream, model: str, status: int) -> None:
    c = up.client()
    for call in (c.complete, lambda r: collect(c, r)):
        with pytest.raises((UpstreamError, UpstreamRejected)) as caught:
            await call(request(model))
        assert caught.value.status == (502 if status >= 500 else status)
        assert caught.value.message == f"upstream '{c.name}' answered HTTP {status}"


async def test_an_upstream_message_is_cut_at_500_characters(up: Upstream) -> None:
    with pytest.raises(UpstreamError) as caught:
        await up.client().complete(request("long500"))
    assert caught.value.message == "x" * 500


async def test_stall_before_headers_times_out(up: Upstream) -> None:
    c = up.client(first_byte_timeout=0.3)
    with pytest.raises(UpstreamTimeout):
        await c.complete(request("stall_headers"))
    with pytest.raises(UpstreamTimeout):
        await collect(c, request("stall_headers"))


@pytest.mark.parametrize(
    ("model", "kinds", "status"),
    [
        ("stall_mid", {"upstream-timeout"}, 504),
        ("reset_mid", {"upstream-error", "upstream-protocol-error"}, 502),
        ("bad_frame", {"upstream-protocol-error"}, 502),
    ],
)
async def test_mid_stream_failure_is_a_final_error_chunk(
    up: Upstream, model: str, kinds: set[str], status: int
) -> None:
    chunks = await collect(up.client(idle_timeout=0.3), request(model))
    if model != "bad_frame":
        assert chunks[-2].events == [TextDelta(text="The answer is")]
    [last] = chunks[-1].events
    assert isinstance(last, StreamError) and last.kind in kinds and last.status == status
    assert "Error" not in last.message and "payload" not in last.message  # aiohttp's words stay in the log


async def test_reset_before_headers_is_unavailable(up: Upstream) -> None:
    with pytest.raises(UpstreamUnavailable):
        await up.client().complete(request("reset_headers"))


async def test_non_http_answer_is_a_protocol_error(up: Upstream) -> None:
    async def spam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"SPAM SPAM\r\n\r\n")
        writer.close()

    async with await asyncio.start_server(spam, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(UpstreamProtocolError, match="malformed HTTP response") as caught:
            await up.client(f"http://127.0.0.1:{port}").complete(request("json"))
        assert "SPAM" not in caught.value.message  # the parser quotes it: logged only


async def test_refused_port_is_unavailable(up: Upstream) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    c = up.client(f"http://127.0.0.1:{port}")
    with pytest.raises(UpstreamUnavailable):
        await c.complete(request("json"))
    with pytest.raises(UpstreamUnavailable):
        await collect(c, request("stream"))
