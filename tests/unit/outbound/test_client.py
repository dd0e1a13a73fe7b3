"""`OpenAICompatClient` (over aiohttp) against a scripted aiohttp server on 127.0.0.1.

The request's `model` picks the server's behaviour, so one server serves every case.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.support.events import flat_events

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from domain.canonical import (
    ChatRequest,
    Finish,
    Message,
    StreamChunk,
    StreamError,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolUsePart,
)
from domain.errors import (
    NotSupported,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)

FIXTURES = Path(__file__).parent / "fixtures"
CONTEXT_TOO_LONG = (
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
    "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
)
COMPLETION = (FIXTURES / "completion_tool_calls.json").read_bytes()


@dataclass
class Upstream:
    """The scripted server's address and what it saw."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    peers: list[object] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    sessions: dict[str, aiohttp.ClientSession] = field(default_factory=dict)

    def client(self, url: str | None = None, **kw: float) -> OpenAICompatClient:
        """A client with a session of its own, as the container gives each upstream address."""
        timeouts = {"connect_timeout": 1.0, "first_byte_timeout": 2.0, "idle_timeout": 2.0} | kw
        name = f"test{len(self.sessions)}"
        self.sessions[name] = upstream_session(url or self.url)
        return OpenAICompatClient(self.sessions, name=name, base_url=url or self.url, **timeouts)


PROXY_PAGE = "<html><body><h1>502 Bad Gateway</h1> 10.42.7.13:8012 <hr>nginx/1.25.3</body></html>"


def error(status: int, message: str, flat: bool = False) -> web.Response:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    info: dict[str, Any] = {"message": message, "type": kind, "param": None, "code": status}
    payload = {"object": "error", **info} if flat else {"error": info}
    return web.json_response(payload, status=status)


async def sse(request: web.Request, frames: list[bytes], end: bool = True,
              content_type: str = "text/event-stream") -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    await resp.prepare(request)
    for frame in frames:
        for piece in (frame[:5], frame[5:]):  # cut every frame mid-line
            await resp.write(piece)
    if end:
        await resp.write_eof()
    return resp


def make_app(state: Upstream) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.bodies.append(body)
        state.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        state.headers.append({k.lower(): v for k, v in request.headers.items()})
        model = body["model"]
        if model == "json":
            return web.Response(body=COMPLETION, content_type="application/json")
        if model == "stream":
            return await sse(request, [(FIXTURES / "plain_text_usage.sse").read_bytes()])
        if model.startswith("typed:"):  # the answer under another Content-Type header
            return await sse(request, [(FIXTURES / "plain_text_usage.sse").read_bytes()],
                             content_type=model.removeprefix("typed:"))
        if model == "nested500":
            return error(500, "EngineCore died")
        if model == "flat500":
            return error(500, "old vLLM failure", flat=True)
        if model == "context400":
            return error(400, CONTEXT_TOO_LONG)
        if model == "garbage":
            return web.Response(text="<html>oops</html>", content_type="text/html")
        if model in ("html502", "html404"):  # an ingress's page, naming what is behind it
            status = 502 if model == "html502" else 404
            return web.Response(text=PROXY_PAGE, content_type="text/html", status=status)
        if model == "bare500":  # a proxy's JSON, not vLLM's shape
            return web.json_response({"error": "backend 10.42.7.13:8012 down", "detail": "nginx"}, status=500)
        if model == "long500":
            return error(500, "x" * 2000)
        if model == "reset_headers" and request.transport is not None:
            request.transport.abort()
            await asyncio.sleep(1)
        if model == "bad_frame":
            return await sse(request, [b'data: {"id":"b","choices":[]}\n\n', b"data: {oops\n\n"])
        if model == "stall_headers":
            await asyncio.sleep(30)
        if model in ("stall_mid", "reset_mid"):
            resp = await sse(request, [(FIXTURES / "no_finish_eof.sse").read_bytes()], end=False)
            if model == "reset_mid" and request.transport is not None:
                request.transport.abort()
                return resp
            await asyncio.sleep(30)
        if model == "burst":  # three frames in one write, then the end in another
            resp = await sse(request, [], end=False)
            await resp.write(b"".join(
                b'data: {"id":"b","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % t for t in (b"a", b"b")
            ) + b'data: {"id":"b","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
            await asyncio.sleep(0.05)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if model in ("done_then_hold", "done_then_end"):  # [DONE], then the body's end late or never
            resp = await sse(request, [(FIXTURES / "plain_text_usage.sse").read_bytes()], end=False)
            try:
                await asyncio.sleep(30 if model == "done_then_hold" else 0.2)
            except asyncio.CancelledError:
                state.disconnected.set()
                raise
            await resp.write_eof()
            return resp
        if model == "slow":  # the answer's frames, the first half a second before the rest
            frames = (FIXTURES / "plain_text_usage.sse").read_bytes().split(b"\n\n")
            resp = await sse(request, [frames[0] + b"\n\n"], end=False)
            await asyncio.sleep(0.5)
            await resp.write(b"\n\n".join(frames[1:]))
            await resp.write_eof()
            return resp
        if model in ("endless", "endless_slow"):
            frame = b'data: {"id":"e","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
            resp = await sse(request, [], end=False)
            try:
                while True:
                    await resp.write(frame)
                    await asyncio.sleep(0.01 if model == "endless" else 0.3)
            except (ConnectionResetError, asyncio.CancelledError):
                state.disconnected.set()
                raise
        raise web.HTTPNotFound()

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        if body["model"] == "no-tokenize":
            raise web.HTTPNotFound()
        return web.json_response({"count": 7, "max_model_len": 8192, "tokens": [1] * 7})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/tokenize", tokenize)
    return app


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    state = Upstream()
    server = TestServer(make_app(state), host="127.0.0.1")
    await server.start_server()
    state.url = str(server.make_url("/"))
    yield state
    for session in state.sessions.values():
        await session.close()
    await server.close()


def request(model: str) -> ChatRequest:
    return ChatRequest(model=model, messages=[Message(role="user", content=[TextPart(text="hi")])])


async def collect(c: OpenAICompatClient, req: ChatRequest) -> list[StreamChunk]:
    return [chunk for batch in await batches(c, req) for chunk in batch]


async def batches(c: OpenAICompatClient, req: ChatRequest) -> list[list[StreamChunk]]:
    async with c.open_stream(req) as reads:
        return [batch async for batch in reads]


async def test_complete_maps_the_answer(up: Upstream) -> None:
    response = await up.client().complete(request("json"))
    assert response.content == [
        ThinkingPart(text="Need the weather."),
        TextPart(text="Let me check."),
        ToolUsePart(id="chatcmpl-tool-1", name="get_weather", arguments='{"city": "Paris"}'),
    ]
    assert (response.id, response.finish_reason) == ("chatcmpl-42", "tool_use")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (50, 20)
    assert response.native is not None and response.native.data == COMPLETION
    assert "stream" not in up.bodies[0]
    sent = up.headers[0]
    assert sent["accept-encoding"] == "identity"  # bytes are relayed as they come: never compressed
    assert "user-agent" not in sent and "cookie" not in sent


async def test_stream_yields_canonical_chunks(up: Upstream) -> None:
    chunks = await collect(up.client(), request("stream"))
    events = flat_events(chunks)
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert texts == [TextDelta(text="Hello"), TextDelta(text=" there"), TextDelta(text="!")]
    assert Finish(reason="end_turn") in events
    assert all(c.native is not None for c in chunks)
    assert up.bodies[0]["stream"] is True
    assert up.bodies[0]["stream_options"] == {"include_usage": True}


async def test_chunks_of_one_read_come_as_one_batch(up: Upstream) -> None:
    got = await batches(up.client(), request("burst"))
    assert len(got[0]) == 3  # the server's first write held three events
    assert all(batch for batch in got)  # never an empty batch


async def test_finished_stream_returns_its_connection_to_the_pool(up: Upstream) -> None:
    c = up.client()
    await collect(c, request("stream"))
    await collect(c, request("stream"))
    assert up.peers[0] == up.peers[1]


async def test_done_ends_the_stream_before_the_body_ends(up: Upstream) -> None:
    """The consumer's stream ends at [DONE]; an upstream that then keeps its body open
    for 30 s loses the connection after the grace period instead of holding it."""
    c = up.client()
    started = asyncio.get_running_loop().time()
    chunks = await collect(c, request("done_then_hold"))
    assert asyncio.get_running_loop().time() - started < 0.5
    assert Finish(reason="end_turn") in [e for chunk in chunks for e in chunk.events]
    await asyncio.wait_for(up.disconnected.wait(), 3)


async def test_a_body_that_ends_after_done_still_returns_its_connection(up: Upstream) -> None:
    c = up.client()
    started = asyncio.get_running_loop().time()
    await collect(c, request("done_then_end"))
    assert asyncio.get_running_loop().time() - started < 0.15  # not held up by the end 0.2 s later
    await asyncio.sleep(0.4)  # the end has arrived: aiohttp pooled the connection
    await collect(c, request("stream"))
    assert up.peers[0] == up.peers[1]


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


async def heartbeat_batches(c: OpenAICompatClient, req: ChatRequest, heartbeat: float) -> list[list[StreamChunk]]:
    async with c.open_stream(req, heartbeat=heartbeat) as reads:
        return [batch async for batch in reads]


async def test_a_heartbeat_is_an_empty_batch_while_the_upstream_is_quiet_and_nothing_is_lost(up: Upstream) -> None:
    c = up.client()
    got = await heartbeat_batches(c, request("slow"), 0.1)
    first_gap = next(i for i, batch in enumerate(got) if not batch)
    assert first_gap == 1  # the first frame, then heartbeats while the upstream is quiet
    assert 3 <= sum(1 for batch in got if not batch) <= 5  # one per 0.1 s of the half second
    chunks = [chunk for batch in got for chunk in batch]
    assert chunks == [chunk for batch in await batches(c, request("stream")) for chunk in batch]  # all of it


async def test_heartbeats_do_not_reset_the_idle_timeout(up: Upstream) -> None:
    got = await heartbeat_batches(up.client(idle_timeout=0.35), request("stall_mid"), 0.1)
    assert sum(1 for batch in got if not batch) >= 2
    [last] = got[-1][-1].events
    assert isinstance(last, StreamError) and last.kind == "upstream-timeout"


async def test_a_hang_up_during_a_heartbeat_wait_still_aborts_the_upstream(up: Upstream) -> None:
    beats = 0

    async def consume() -> None:
        nonlocal beats
        async with up.client().open_stream(request("endless_slow"), heartbeat=0.05) as reads:
            async for batch in reads:
                beats += not batch

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert beats >= 2  # the heartbeats' cancellations were taken back; the hang-up's was not
    await asyncio.wait_for(up.disconnected.wait(), 2)


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


async def test_cancelling_the_consumer_aborts_the_upstream(up: Upstream) -> None:
    flowing = asyncio.Event()

    async def consume() -> None:
        async with up.client().open_stream(request("endless")) as chunks:
            async for _ in chunks:
                flowing.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(flowing.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(up.disconnected.wait(), 2)


async def test_leaving_the_stream_early_aborts_the_upstream(up: Upstream) -> None:
    async with up.client().open_stream(request("endless")) as chunks:
        async for _ in chunks:
            break
    await asyncio.wait_for(up.disconnected.wait(), 2)


async def test_count_tokens(up: Upstream) -> None:
    c = up.client(up.url + "/")  # a trailing slash on the root
    assert await c.count_tokens(request("any")) == 7
    with pytest.raises(NotSupported):
        await c.count_tokens(request("no-tokenize"))
