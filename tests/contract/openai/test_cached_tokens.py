"""Cached prompt tokens reach the client, read by the official SDKs: a real gateway in front of a
`--prefix-cache` stub (which reports `usage.prompt_tokens_details.cached_tokens`, as vLLM does)
and a plain one (which reports nothing: nothing is invented).

`/v1` passes the upstream's field as it is; `/llm` reports `cache_read_input_tokens` with
`input_tokens` the uncached rest, in plain answers and in the stream's usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import anthropic
import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml

WORDS = " ".join(f"word{i}" for i in range(200))  # the stub's tokens are words: 200 + the question


def conversation(tag: str, question: str = "and then?") -> Any:
    return [{"role": "user", "content": f"{tag} {WORDS}"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": question}]  # fmt: skip


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("cached-tokens"))
    try:
        cached, plain = procs.together([
            partial(procs.stub, "--prefix-cache", "--prefill-ms-per-1k-tokens", "1", "--tokens", "4"),
            partial(procs.stub, "--tokens", "4")])
        yield procs.gateway(upstream_toml("cached", cached.url, ["cached"])
                            + upstream_toml("plain", plain.url, ["plain"]))
    finally:
        procs.stop_all()


@pytest.fixture
async def oai(gateway: Proc) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as sdk:
        yield sdk


@pytest.fixture
async def claude(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=20) as sdk:  # fmt: skip
        yield sdk


async def test_v1_passes_cached_tokens_in_plain_answers_and_the_stream_usage(oai: openai.AsyncOpenAI) -> None:
    first = await oai.chat.completions.create(model="cached", messages=conversation("v1-plain"))
    again = await oai.chat.completions.create(model="cached", messages=conversation("v1-plain", "and now?"))
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # nothing served before
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 160 <= cached < again.usage.prompt_tokens  # the shared leading blocks
    stream = await oai.chat.completions.create(model="cached", messages=conversation("v1-plain", "and so?"),
                                               stream=True, stream_options={"include_usage": True})  # fmt: skip
    usages = [chunk.usage async for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1 and usages[0].prompt_tokens_details is not None
    assert usages[0].prompt_tokens_details.cached_tokens == cached


async def test_llm_reports_cache_reads_with_input_tokens_the_uncached_rest(claude: anthropic.AsyncAnthropic) -> None:
    first = await claude.messages.create(model="cached", max_tokens=16, messages=conversation("llm-plain"))
    again = await claude.messages.create(model="cached", max_tokens=16, messages=conversation("llm-plain", "and now?"))
    assert first.usage.cache_read_input_tokens == 0
    total = first.usage.input_tokens  # nothing was cached: every token is input
    cached = again.usage.cache_read_input_tokens
    assert cached is not None and 160 <= cached < total
    assert again.usage.input_tokens + cached == total  # same length, same count: the rest is uncached
    async with claude.messages.stream(model="cached", max_tokens=16,
                                      messages=conversation("llm-plain", "and so?")) as stream:  # fmt: skip
        events = [event async for event in stream]
        final = await stream.get_final_message()
    assert final.usage.cache_read_input_tokens == cached and final.usage.input_tokens + cached == total
    deltas = [e for e in events if e.type == "message_delta"]
    assert deltas and deltas[-1].usage.cache_read_input_tokens == cached


async def test_nothing_is_invented_when_the_upstream_does_not_report_it(
    oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    answer = await oai.chat.completions.create(model="plain", messages=conversation("none"))
    assert answer.usage is not None and answer.usage.prompt_tokens_details is None
    message = await claude.messages.create(model="plain", max_tokens=16, messages=conversation("none"))
    assert message.usage.cache_read_input_tokens is None and message.usage.input_tokens == answer.usage.prompt_tokens


async def test_responses_name_cached_tokens_inside_input_tokens(oai: openai.AsyncOpenAI) -> None:
    def turn(question: str) -> Any:
        return [{"role": "user", "content": f"responses {WORDS}"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": question}]  # fmt: skip

    first = await oai.responses.create(model="cached", input=turn("and then?"))
    again = await oai.responses.create(model="cached", input=turn("and now?"))
    assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
    assert again.usage is not None
    cached = again.usage.input_tokens_details.cached_tokens
    assert 160 <= cached < again.usage.input_tokens  # OpenAI counts them inside input_tokens
    streamed = None
    async with oai.responses.stream(model="cached", input=turn("and so?")) as stream:
        async for _ in stream:
            pass
        streamed = await stream.get_final_response()
    assert streamed.usage is not None and streamed.usage.input_tokens_details.cached_tokens == cached
