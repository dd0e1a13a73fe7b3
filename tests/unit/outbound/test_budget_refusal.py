"""vLLM's refusal of a thinking budget (`reasoning_refusal`), through `OpenAICompatClient` against
a scripted aiohttp server on 127.0.0.1 that answers as vLLM 0.32 without a reasoning parser: a
plain request with a budget gets a 400, a streamed one a 200 whose first frame is the error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from adapters.outbound.openai_compat.context_errors import upstream_rejection
from domain.canonical import ChatRequest, Message, ReasoningConfig, StreamChunk, StreamError, TextPart
from domain.errors import ThinkingBudgetRefused, UpstreamRejected

REFUSAL = ("thinking_token_budget is set but reasoning_config is not configured. Please set "
           "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")
ANSWER = (Path(__file__).parent / "fixtures" / "plain_text_usage.sse").read_bytes()


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def make_app(seen: list[dict[str, Any]]) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        refused = "thinking_token_budget" in body and body["model"] == "refuses"
        if not body.get("stream"):
            if refused:
                return web.json_response(_error(REFUSAL), status=400)
            raise web.HTTPNotFound()  # the plain answers are not what these tests are about
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if refused or body["model"] == "other_error":
            message = REFUSAL if refused else "Some other engine check failed."
            await resp.write(b"data: " + json.dumps(_error(message)).encode() + b"\n\ndata: [DONE]\n\n")
        else:
            if body["model"] == "quiet":  # the head at once, the first token later (vLLM's prefill)
                await asyncio.sleep(0.3)
            await resp.write(ANSWER)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def client() -> AsyncIterator[tuple[OpenAICompatClient, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    server = TestServer(make_app(seen), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/"))
    sessions = {"up": upstream_session(url)}
    yield OpenAICompatClient(sessions, name="up", base_url=url, first_byte_timeout=2, idle_timeout=2), seen
    await sessions["up"].close()
    await server.close()


def request(model: str, budget: int | None = 64, stream: bool = True) -> ChatRequest:
    return ChatRequest(model=model, messages=[Message(role="user", content=[TextPart(text="hi")])], stream=stream,
                       reasoning=ReasoningConfig(enabled=True, budget_tokens=budget))  # fmt: skip


async def read(c: OpenAICompatClient, req: ChatRequest, heartbeat: float | None = None) -> list[list[StreamChunk]]:
    async with c.open_stream(req, heartbeat=heartbeat) as reads:
        return [batch async for batch in reads]


def test_the_refusal_is_known_by_its_words_and_only_in_a_400() -> None:
    refused = upstream_rejection(400, REFUSAL)
    assert isinstance(refused, ThinkingBudgetRefused) and (refused.status, refused.message) == (400, REFUSAL)
    older = upstream_rejection(400, "thinking_token_budget is set but reasoning_config is not configured. "
                                    "Please set --reasoning-config to use thinking_token_budget.")  # fmt: skip
    assert isinstance(older, ThinkingBudgetRefused)
    other = upstream_rejection(400, "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.")
    assert type(other) is UpstreamRejected
    assert type(upstream_rejection(422, REFUSAL)) is UpstreamRejected


async def test_a_plain_refusal_is_raised(client: tuple[OpenAICompatClient, list[dict[str, Any]]]) -> None:
    c, _ = client
    with pytest.raises(ThinkingBudgetRefused, match="reasoning_config is not configured"):
        await c.complete(request("refuses", stream=False))


async def test_a_refusal_in_a_streams_first_frame_is_raised_while_it_opens(
    client: tuple[OpenAICompatClient, list[dict[str, Any]]],
) -> None:
    c, seen = client
    with pytest.raises(ThinkingBudgetRefused) as refused:
        async with c.open_stream(request("refuses")):
            pytest.fail("entered a refused stream")
    assert refused.value.message == REFUSAL and seen[-1]["thinking_token_budget"] == 64


async def test_a_served_budget_streams_as_any_answer(client: tuple[OpenAICompatClient, list[dict[str, Any]]]) -> None:
    c, seen = client
    with_budget = await read(c, request("serves"))
    without = await read(c, request("serves", budget=None))
    assert with_budget == without and with_budget[0][0].events  # the first read, read ahead, then the rest
    assert [body.get("thinking_token_budget") for body in seen] == [64, None]


async def test_another_first_frame_error_is_the_streams_own(
    client: tuple[OpenAICompatClient, list[dict[str, Any]]],
) -> None:
    c, _ = client
    [[chunk]] = await read(c, request("other_error"))
    [event] = chunk.events
    assert isinstance(event, StreamError) and event.message == "Some other engine check failed."


async def test_a_heartbeat_ends_the_read_ahead(client: tuple[OpenAICompatClient, list[dict[str, Any]]]) -> None:
    """A quiet upstream is generating (vLLM refuses at once): the look ahead stops at the
    heartbeat, which still reaches the consumer, and nothing is lost."""
    c, _ = client
    got = await read(c, request("quiet"), heartbeat=0.1)
    assert [] in got
    assert [chunk for batch in got for chunk in batch] == [
        chunk for batch in await read(c, request("serves")) for chunk in batch
    ]

