"""A scripted aiohttp server on 127.0.0.1 standing in for a vLLM upstream, and the helpers the
`OpenAICompatClient` tests drive it with.

The request's `model` picks the server's behaviour, so one server serves every case.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from domain.canonical import ChatRequest, Message, StreamChunk, TextPart

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


@asynccontextmanager
async def scripted_upstream() -> AsyncIterator[Upstream]:
    """The server running, its sessions closed at the end."""
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
