"""Every surface against the real vLLM, with the official SDKs as clients, plain and streamed:
the answer is vLLM's (its greedy text, byte for byte), and usage is vLLM's own count (the tiny
model never stops early, so every answer is exactly `max_tokens` long)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MODEL, Fleet, VllmServer

TOKENS = 12


@pytest.fixture(scope="module")
def upstream(vllm_fleet: Fleet) -> VllmServer:
    return vllm_fleet["main"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: VllmServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-surfaces"))
    try:
        yield procs.gateway(vllm_toml(upstream))
    finally:
        procs.stop_all()


@pytest.fixture
async def oai(gateway: Proc) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=60) as sdk:
        yield sdk


@pytest.fixture
async def claude(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=60) as sdk:  # fmt: skip
        yield sdk


def said(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def prompt_tokens(upstream: VllmServer, messages: list[Any]) -> int:
    count = upstream.post("/tokenize", {"model": MODEL, "messages": messages})["count"]
    assert isinstance(count, int)
    return count


def greedy(upstream: VllmServer, messages: list[Any]) -> str:
    answer: Any = upstream.post("/v1/chat/completions", {"model": MODEL, "messages": messages,
                                                          "max_tokens": TOKENS, "temperature": 0})  # fmt: skip
    text: str = answer["choices"][0]["message"]["content"]
    return text


async def test_chat_completions_plain_and_streamed(oai: openai.AsyncOpenAI, upstream: VllmServer) -> None:
    messages = said("chat completions, plain")
    plain = await oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0)
    assert plain.choices[0].message.content == greedy(upstream, messages)
    assert plain.choices[0].finish_reason == "length"
    assert plain.usage is not None
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (prompt_tokens(upstream, messages), TOKENS)
    stream = await oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0,
                                               stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == TOKENS


async def test_text_completions_plain_and_streamed(oai: openai.AsyncOpenAI, upstream: VllmServer) -> None:
    direct: Any = upstream.post("/v1/completions", {"model": MODEL, "prompt": "text completions", "max_tokens": TOKENS,
                                                     "temperature": 0})  # fmt: skip
    plain = await oai.completions.create(model=MODEL, prompt="text completions", max_tokens=TOKENS, temperature=0)
    assert plain.choices[0].text == direct["choices"][0]["text"]
    assert plain.usage is not None and plain.usage.completion_tokens == TOKENS
    assert plain.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    stream = await oai.completions.create(model=MODEL, prompt="text completions", max_tokens=TOKENS, temperature=0,
                                          stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == TOKENS


async def test_responses_plain_and_streamed(oai: openai.AsyncOpenAI, upstream: VllmServer) -> None:
    messages = said("responses api")
    plain = await oai.responses.create(model=MODEL, input="responses api", max_output_tokens=TOKENS, temperature=0)
    assert plain.output_text == greedy(upstream, messages)
    assert plain.usage is not None and plain.usage.output_tokens == TOKENS
    assert plain.usage.input_tokens == prompt_tokens(upstream, messages)
    # Cut at max_output_tokens: "incomplete", as OpenAI's API ends such an answer.
    assert plain.status == "incomplete" and plain.incomplete_details is not None
    assert plain.incomplete_details.reason == "max_output_tokens"
    stream = await oai.responses.create(model=MODEL, input="responses api", max_output_tokens=TOKENS,
                                        temperature=0, stream=True)  # fmt: skip
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.output_text == plain.output_text
    assert final.usage is not None and final.usage.output_tokens == TOKENS


async def test_messages_plain_streamed_and_counted(claude: anthropic.AsyncAnthropic, upstream: VllmServer) -> None:
    messages = said("anthropic messages")
    counted = await claude.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == prompt_tokens(upstream, messages)
    plain = await claude.messages.create(model=MODEL, max_tokens=TOKENS, messages=messages)
    assert plain.stop_reason == "max_tokens" and plain.usage.output_tokens == TOKENS
    assert plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0) == counted.input_tokens
    async with claude.messages.stream(model=MODEL, max_tokens=TOKENS, messages=messages) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == TOKENS
    assert final.content and final.content[0].type == "text" and final.content[0].text


async def test_embeddings_on_a_model_that_serves_none_is_a_clear_4xx(oai: openai.AsyncOpenAI) -> None:
    # vLLM serves /v1/embeddings only for a pooling model: a generative one answers 404.
    with pytest.raises(openai.APIStatusError) as refused:
        await oai.embeddings.create(model=MODEL, input="hello")
    assert 400 <= refused.value.status_code < 500
