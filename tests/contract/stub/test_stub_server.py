"""The stub upstream as a real subprocess on loopback, driven by the official openai SDK
and raw HTTP: chat answers, other endpoints, errors, HTTP/1.1 connection handling."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import openai
import pytest

from stub.launcher import running_stub

PARAMS = {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
CALLED = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
SIXTEEN = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    with running_stub() as base:
        yield base


@pytest.fixture(scope="module")
def reasoning_url() -> Iterator[str]:
    with running_stub("--reasoning") as base:
        yield base


def sdk(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0)


async def create(base: str, **fields: Any) -> Any:
    """One chat completion through the openai SDK; a stream is collected into a list."""
    fields = {"model": "m", "messages": [], **fields}
    async with sdk(base) as client:
        result = await client.chat.completions.create(**fields)
        return [chunk async for chunk in result] if fields.get("stream") else result


async def post_chat(base: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    return await post(base, "/v1/chat/completions", {"model": "m", "messages": [], **fields})


async def post(base: str, path: str, body: object | bytes) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    async with aiohttp.ClientSession() as session, session.post(base + path, data=data) as resp:
        return resp.status, msgspec.json.decode(await resp.read())


# -- chat completions through the openai SDK --------------------------------------------
async def test_non_stream_via_openai_sdk(stub_url: str) -> None:
    resp = await create(stub_url, model="reasoning", messages=[{"role": "user", "content": "a b"}])
    assert resp.id.startswith("chatcmpl-") and resp.model == "reasoning"
    assert resp.choices[0].message.content == SIXTEEN
    assert resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (2, 16)
    assert resp.usage.total_tokens == 18


async def test_stream_with_and_without_include_usage_via_openai_sdk(stub_url: str) -> None:
    chunks = await create(stub_url, stream=True, stream_options={"include_usage": True})
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert len(text) == 16 and "".join(text) == SIXTEEN
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    chunks = await create(stub_url, stream=True)
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is None


async def test_reasoning_field_non_stream_and_stream(reasoning_url: str) -> None:
    resp = await create(reasoning_url)
    assert resp.choices[0].message.reasoning == "Let me think about this."
    assert resp.choices[0].message.content == SIXTEEN
    deltas = [c.choices[0].delta for c in await create(reasoning_url, stream=True)]
    kinds = ["r" if getattr(d, "reasoning", None) else "c" if d.content else "-" for d in deltas]
    assert "".join(kinds) == "-" + "r" * 5 + "c" * 16 + "-"


REFUSAL = ("thinking_token_budget is set but reasoning_config is not configured. Please set "
           "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")  # vLLM 0.32's words


async def test_a_thinking_budget_is_refused_without_reasoning_as_vllm_refuses_it(tmp_path: Path) -> None:
    """vLLM 0.32 without --reasoning-parser: a plain request is a 400; a stream gets its 200,
    then the error as the first frame and [DONE] (the engine refuses it once the stream is out).
    Neither ever starts."""
    log = tmp_path / "stub.log"
    with running_stub("--log", str(log)) as base:
        status, payload = await post_chat(base, thinking_token_budget=64)
        assert status == 400 and payload["error"] == {"message": REFUSAL, "type": "BadRequestError",
                                                      "param": None, "code": 400}  # fmt: skip
        body = msgspec.json.encode({"model": "m", "messages": [], "stream": True, "thinking_token_budget": 0})
        async with aiohttp.ClientSession() as session, session.post(base + "/v1/chat/completions",
                                                                    data=body) as resp:  # fmt: skip
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            frames = (await resp.read()).split(b"\n\n")
        assert msgspec.json.decode(frames[0].removeprefix(b"data: "))["error"]["message"] == REFUSAL
        assert frames[1:] == [b"data: [DONE]", b""]
        assert (await post_chat(base, thinking_token_budget=-1))[0] == 200  # -1: unlimited, i.e. none
        status, payload = await post_chat(base, thinking_token_budget=-2)
        assert status == 400 and "non-negative integer or -1" in payload["error"]["message"]
    assert log.read_text().count("chat start") == 1  # only the request without a budget started


async def test_a_thinking_budget_cuts_the_reasoning_with_reasoning(reasoning_url: str) -> None:
    resp = await create(reasoning_url, extra_body={"thinking_token_budget": 2})
    assert resp.choices[0].message.reasoning == "Let me" and resp.choices[0].message.content == SIXTEEN
    deltas = [c.choices[0].delta for c in await create(reasoning_url, stream=True,
                                                       extra_body={"thinking_token_budget": 0})]  # fmt: skip
    assert not any(getattr(d, "reasoning", None) for d in deltas)


async def test_forced_tool_call_non_stream(stub_url: str) -> None:
    resp = await create(stub_url, tools=[WEATHER], tool_choice="required")
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "get_weather"
    assert msgspec.json.decode(call.function.arguments) == {"city": "x", "days": 1}


async def test_named_tool_call_streamed(stub_url: str) -> None:
    text = [{"type": "text", "text": "use get_weather in Oslo"}]
    chunks = await create(
        stub_url, stream=True, tools=[WEATHER], messages=[{"role": "user", "content": text}]
    )
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert calls[0].id.startswith("chatcmpl-tool-") and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == "" and len(calls) >= 3
    arguments = "".join(call.function.arguments for call in calls)
    assert msgspec.json.decode(arguments) == {"city": "x", "days": 1}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Please use get_weather for Oslo"}],
        [
            {"role": "user", "content": "use get_weather"},
            {"role": "assistant", "content": None, "tool_calls": [CALLED]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    ],
    ids=["name-mid-text", "after-tool-result"],
)
async def test_text_answer_when_no_explicit_tool_request(stub_url: str, messages: list[Any]) -> None:
    resp = await create(stub_url, messages=messages, tools=[WEATHER])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == SIXTEEN and not resp.choices[0].message.tool_calls


async def test_max_tokens_gives_length(stub_url: str) -> None:
    resp = await create(stub_url, max_tokens=3)
    assert resp.choices[0].message.content == "alpha bravo charlie"
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3


async def test_stop_string_gives_stop_reason(stub_url: str) -> None:
    status, body = await post_chat(stub_url, stop=["golf"])
    choice = body["choices"][0]
    assert status == 200
    assert choice["message"]["content"] == "alpha bravo charlie delta echo foxtrot "
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "golf")


# -- other endpoints and errors ---------------------------------------------------------
async def test_seed_request_with_empty_messages_is_200(stub_url: str) -> None:
    status, body = await post_chat(stub_url, model="reasoning")
    assert status == 200 and body["choices"][0]["message"]["content"] == SIXTEEN


@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/v1/chat/completions", b"{not json", 400, "BadRequestError"),
        ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError"),
        ("/v1/chat/completions", {"model": "m", "tool_choice": "required"}, 400, "BadRequestError"),
        ("/v1/nothing", {}, 404, "NotFoundError"),
    ],
)
async def test_errors_use_vllm_shape(stub_url: str, path: str, body: object, status: int, kind: str) -> None:
    got, payload = await post(stub_url, path, body)
    assert got == status
    assert payload["error"]["type"] == kind and payload["error"]["code"] == status
    assert payload["error"]["param"] is None and payload["error"]["message"]


async def test_error_rate_one_answers_500(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--error-rate", "1", "--hold", "5", "--log", str(log)) as base:
        started = time.monotonic()
        status, payload = await post_chat(base)
        assert time.monotonic() - started < 2  # answered at once, before any hold
        with pytest.raises(openai.InternalServerError):
            await create(base)
    assert status == 500
    assert payload["error"]["type"] == "InternalServerError" and payload["error"]["code"] == 500
    assert log.read_text() == ""  # rejected requests never start


async def test_models_health_and_tokenize(stub_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(stub_url + "/health") as resp:
            assert resp.status == 200 and await resp.read() == b""
        async with session.get(stub_url + "/v1/models") as resp:
            models = msgspec.json.decode(await resp.read())
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["stub"]
    assert models["data"][0]["object"] == "model" and models["data"][0]["owned_by"] == "stub"
    status, tokens = await post(stub_url, "/tokenize", {"model": "m", "prompt": "one two three"})
    assert status == 200 and tokens["count"] == 3 and len(tokens["tokens"]) == 3
    assert tokens["max_model_len"] == 8192
    messages = [{"role": "user", "content": "one two three"}]
    assert (await post(stub_url, "/tokenize", {"model": "m", "messages": messages}))[1] == tokens


async def test_models_option_lists_and_restricts_models() -> None:
    with running_stub("--models", "reasoning,qwen2.5:3b-instruct") as base:
        async with sdk(base) as client:
            listed = [m.id async for m in client.models.list()]
        ok = await create(base, model="qwen2.5:3b-instruct")
        with pytest.raises(openai.NotFoundError):
            await create(base, model="other")
    assert listed == ["reasoning", "qwen2.5:3b-instruct"] and ok.model == "qwen2.5:3b-instruct"


async def test_keep_alive_pipelining_chunked_body_and_connection_close(stub_url: str) -> None:
    port = int(stub_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"m","messages":[],"max_tokens":1}'
    writer.write(
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        b"a\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
        % (body[:10], len(body) - 10, body[10:])
        + b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    data = await asyncio.wait_for(reader.read(), 5)  # read() returns at EOF: the server closed
    writer.close()
    assert re.findall(rb"HTTP/1\.1 (\d+)", data) == [b"200", b"200", b"200"]
    order = [data.index(b"content-length: 0"), data.index(b'"alpha"'), data.index(b'"list"')]
    assert order == sorted(order) and b"connection: close" in data
