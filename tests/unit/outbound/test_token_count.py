"""`OpenAICompatClient`'s token counts against a scripted aiohttp server on 127.0.0.1: the real
prompt size behind a context-length refusal that gave only a lower bound (and the bound kept when
`/tokenize` fails), and `count_tokens` against vLLM's and llama.cpp's `/tokenize` answers.

The request's `model` picks the server's behaviour, so one server serves every case.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from domain.canonical import ChatRequest, Message, TextPart
from domain.completions import CompletionRequest
from domain.errors import ContextLengthExceeded, NotSupported, UpstreamProtocolError

BOUND = (
    "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens and your prompt "
    "contains at least 2049 input tokens, for a total of at least 2113 tokens. Please reduce the length of the "
    "input prompt or the number of requested output tokens. (parameter=input_tokens, value=2049)"
)
EXACT = (
    "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens and your prompt "
    "contains 3000 input tokens, for a total of 3064 tokens."
)
TOKENIZE_ANSWERS: dict[str, Any] = {
    "vllm": {"count": 3672, "max_model_len": 2048, "tokens": [1] * 3672},
    "few": {"count": 12, "max_model_len": 2048, "tokens": [1] * 12},
    "tokens-only": {"tokens": [5, 6, 7, 8]},  # a server that counted the chat body, without `count`
    "llama": {"tokens": []},  # llama-server: a chat body has no `content`, so nothing is tokenized
    "llama-old": {"tokens": []},  # ... one without /apply-template
    "neither": {"max_model_len": 2048},
}


@dataclass
class Upstream:
    url: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sessions: dict[str, aiohttp.ClientSession] = field(default_factory=dict)
    replicas: list[ReplicaSessions] = field(default_factory=list)

    def client(self, base_url: str | None = None, recount_timeout: float = 1.0) -> OpenAICompatClient:
        name = f"test{len(self.sessions)}"
        self.sessions[name] = upstream_session(base_url or self.url)
        self.replicas.append(ReplicaSessions())
        return OpenAICompatClient(self.sessions, name=name, base_url=base_url or self.url, connect_timeout=1.0,
                                  first_byte_timeout=2.0, idle_timeout=2.0, replicas=self.replicas[-1],
                                  recount_timeout=recount_timeout)  # fmt: skip

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


def _refusal(message: str) -> web.Response:
    info = {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
    return web.json_response({"error": info}, status=400)


def make_app(state: Upstream) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        state.calls.append((request.path, body))
        return _refusal(EXACT if body["model"] == "exact" else BOUND)

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        state.calls.append(("/tokenize", body))
        if "content" in body:  # llama-server's own form: a token per word, and the BOS with add_special
            return web.json_response({"tokens": [1] * body["add_special"] + [9] * len(body["content"].split())})
        model = body["model"]
        if model == "slow":
            await asyncio.sleep(5)
        if model == "absent":
            raise web.HTTPNotFound()
        if model == "broken":
            return web.json_response({"error": {"message": "tokenizer died", "code": 500}}, status=500)
        if model == "garbage":
            return web.Response(text="<html>", content_type="text/html")
        return web.json_response(TOKENIZE_ANSWERS.get(model, TOKENIZE_ANSWERS["vllm"]))

    async def apply_template(request: web.Request) -> web.Response:
        body = await request.json()
        state.calls.append(("/apply-template", body))
        if body["model"] == "llama-old":
            raise web.HTTPNotFound()
        text = " ".join(f"<|{m['role']}|> {m['content']}" for m in body["messages"])
        return web.json_response({"prompt": text + " <|assistant|>"})

    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions"):
        app.router.add_post(path, generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/apply-template", apply_template)
    return app


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    state = Upstream()
    server = TestServer(make_app(state), host="127.0.0.1")
    await server.start_server()
    state.url = str(server.make_url("/")).rstrip("/")
    yield state
    for session in state.sessions.values():
        await session.close()
    for replicas in state.replicas:
        await replicas.close()
    await server.close()


def chat(model: str, text: str = "one two three") -> ChatRequest:
    return ChatRequest(model=model, messages=[Message(role="user", content=[TextPart(text=text)])], max_tokens=64)


async def refused(c: OpenAICompatClient, request: ChatRequest | CompletionRequest, stream: bool,
                  replica: str | None = None) -> ContextLengthExceeded:  # fmt: skip
    with pytest.raises(ContextLengthExceeded) as caught:
        if isinstance(request, ChatRequest):
            if stream:
                async with c.open_stream(request, replica):
                    pass
            else:
                await c.complete(request, replica)
        elif stream:
            async with c.open_text_stream(request, replica):
                pass
        else:
            await c.complete_text(request, replica)
    return caught.value


@pytest.mark.parametrize("stream", [False, True])
async def test_a_lower_bound_is_replaced_by_the_servers_count(up: Upstream, stream: bool) -> None:
    error = await refused(up.client(), chat("vllm"), stream)
    assert (error.prompt_tokens, error.max_tokens, error.limit, error.exact) == (3672, 64, 2048, True)
    assert "your prompt contains 3672 input tokens, for a total of 3736 tokens" in error.message
    assert up.paths() == ["/v1/chat/completions", "/tokenize"]
    assert up.calls[1][1] == {"model": "vllm", "messages": [{"role": "user", "content": "one two three"}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_text_prompt_is_counted_as_a_text_prompt(up: Upstream, stream: bool) -> None:
    error = await refused(up.client(), CompletionRequest(model="vllm", prompt=["one two"], max_tokens=64), stream)
    assert (error.prompt_tokens, error.exact) == (3672, True)
    assert up.calls[1] == ("/tokenize", {"model": "vllm", "prompt": "one two"})


async def test_several_text_prompts_keep_the_bound(up: Upstream) -> None:
    error = await refused(up.client(), CompletionRequest(model="vllm", prompt=["a", "b"]), False)
    assert (error.prompt_tokens, error.exact) == (2049, False) and up.paths() == ["/v1/completions"]


async def test_the_count_is_asked_of_the_replica_that_refused(up: Upstream) -> None:
    c = up.client(base_url="http://127.0.0.1:9")  # the upstream's identity only: nothing listens there
    error = await refused(c, chat("vllm"), False, replica=up.url)
    assert error.prompt_tokens == 3672 and up.paths() == ["/v1/chat/completions", "/tokenize"]


async def test_an_exact_refusal_asks_nothing_more(up: Upstream) -> None:
    error = await refused(up.client(), chat("exact"), False)
    assert (error.prompt_tokens, error.message) == (3000, EXACT) and up.paths() == ["/v1/chat/completions"]


@pytest.mark.parametrize("model", ["absent", "broken", "garbage", "few", "neither"])
@pytest.mark.parametrize("stream", [False, True])
async def test_without_a_believable_count_the_refusal_keeps_its_bound(up: Upstream, model: str, stream: bool) -> None:
    error = await refused(up.client(), chat(model), stream)
    assert (error.prompt_tokens, error.exact, error.message) == (2049, False, BOUND)


async def test_the_count_is_bounded_in_time(up: Upstream) -> None:
    started = time.monotonic()
    error = await refused(up.client(recount_timeout=0.3), chat("slow"), False)
    assert time.monotonic() - started < 2
    assert (error.prompt_tokens, error.exact) == (2049, False)


# --- count_tokens ---------------------------------------------------------------------------


async def test_count_tokens_reads_vllms_count(up: Upstream) -> None:
    assert await up.client().count_tokens(chat("vllm")) == 3672
    assert up.paths() == ["/tokenize"]


async def test_count_tokens_counts_tokens_when_there_is_no_count(up: Upstream) -> None:
    assert await up.client().count_tokens(chat("tokens-only")) == 4


async def test_count_tokens_asks_llama_server_its_own_way(up: Upstream) -> None:
    """llama-server tokenizes `content` only: the chat template's text, with the BOS."""
    assert await up.client().count_tokens(chat("llama")) == 1 + len("<|user|> one two three <|assistant|>".split())
    assert up.paths() == ["/tokenize", "/apply-template", "/tokenize"]
    assert up.calls[1][1] == up.calls[0][1]  # the template gets the chat body
    assert up.calls[2][1] == {"content": "<|user|> one two three <|assistant|>", "add_special": True}


async def test_count_tokens_failures(up: Upstream) -> None:
    c = up.client()
    with pytest.raises(UpstreamProtocolError, match="neither `count` nor `tokens`"):
        await c.count_tokens(chat("neither"))
    with pytest.raises(UpstreamProtocolError, match="malformed /tokenize answer"):
        await c.count_tokens(chat("garbage"))
    with pytest.raises(NotSupported):
        await c.count_tokens(chat("absent"))
    with pytest.raises(NotSupported, match="/apply-template"):
        await c.count_tokens(chat("llama-old"))
