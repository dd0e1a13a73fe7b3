"""Tool calls against the real vLLM (`--enable-auto-tool-choice --tool-call-parser hermes`).

A forced call (a named tool choice) is decoded under vLLM's grammar, which lets the arguments be
any JSON value: the model here ends the call as soon as it can, with a number (as vLLM 0.32 was
seen to answer with a real model: `"arguments":"4120000000000.0"`). `/llm` answers such a call
with one verdict, plain or streamed: the same 502, and a stream never ends with a `tool_use`
whose input is not an object. `/v1` relays the arguments string as it came, as OpenAI's API
does. Tools offered with `auto` are a normal answer (vLLM needs its tool parser for that)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MODEL, Fleet, VllmServer

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ANTHROPIC_TOOL: Any = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}
OPENAI_TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: Any = {"temperature": 0}  # this SDK takes sampling settings only as extra members


@pytest.fixture(scope="module")
def upstream(vllm_fleet: Fleet) -> VllmServer:
    return vllm_fleet["main"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: VllmServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-tools"))
    try:
        yield procs.gateway(vllm_toml(upstream))
    finally:
        procs.stop_all()


def test_vllm_itself_answers_a_forced_call_with_arguments_that_are_not_an_object(upstream: VllmServer) -> None:
    answer: Any = upstream.post("/v1/chat/completions", {
        "model": MODEL, "messages": ASK, "max_tokens": 40, "temperature": 0, "tools": [OPENAI_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})  # fmt: skip
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert arguments.isdigit()  # a number: what the gateway's /llm must not pass on as a tool input


async def test_llm_gives_one_verdict_plain_or_streamed(gateway: Proc) -> None:
    forced: Any = {"type": "tool", "name": "get_weather"}
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0) as claude:
        with pytest.raises(anthropic.InternalServerError) as plain:
            await claude.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=ASK,
                                         tools=[ANTHROPIC_TOOL], tool_choice=forced)  # fmt: skip
        assert plain.value.status_code == 502 and "not a JSON object" in str(plain.value)
        events: list[Any] = []
        with pytest.raises(anthropic.APIStatusError) as streamed:
            stream = await claude.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=ASK,
                                                  tools=[ANTHROPIC_TOOL], tool_choice=forced, stream=True)  # fmt: skip
            async for event in stream:
                events.append(event)
        assert "not a JSON object" in str(streamed.value)
    assert not [e for e in events if e.type in ("message_delta", "message_stop")]  # no stop_reason tool_use
    assert not [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]


async def test_v1_relays_the_arguments_as_they_came_plain_or_streamed(gateway: Proc) -> None:
    forced: Any = {"type": "function", "function": {"name": "get_weather"}}
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as oai:
        plain = await oai.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, messages=ASK,
                                                  tools=[OPENAI_TOOL], tool_choice=forced)  # fmt: skip
        calls = plain.choices[0].message.tool_calls
        assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather"
        stream = await oai.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, messages=ASK,
                                                   tools=[OPENAI_TOOL], tool_choice=forced, stream=True)  # fmt: skip
        pieces = [call.function.arguments or "" async for chunk in stream if chunk.choices
                  for call in chunk.choices[0].delta.tool_calls or [] if call.function]  # fmt: skip
    assert "".join(pieces) == calls[0].function.arguments and calls[0].function.arguments.isdigit()


async def test_tools_offered_with_auto_are_an_ordinary_answer(gateway: Proc) -> None:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0) as claude:
        answer = await claude.messages.create(model=MODEL, max_tokens=12, messages=ASK, tools=[ANTHROPIC_TOOL])
        async with claude.messages.stream(model=MODEL, max_tokens=12, messages=ASK, tools=[ANTHROPIC_TOOL]) as stream:
            final = await stream.get_final_message()
    # The model here never writes <tool_call> by itself: the answer is text, cut at max_tokens.
    for message in (answer, final):
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 12
        assert [block.type for block in message.content] == ["text"]
