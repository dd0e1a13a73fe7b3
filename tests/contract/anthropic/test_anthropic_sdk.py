"""The official `anthropic` SDK against a real `gateway serve` and real stub upstreams.

One gateway serves every upstream kind, each behind its own model name: plain,
`--reasoning`, `--error-rate 1`, a port nobody listens on, and a held upstream with
cap 1 (queue depth 1) for queue frames and a full queue.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import anthropic
import msgspec
import pytest
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, free_port, upstream_toml

MAX_BODY = 65536
USER: Any = [{"role": "user", "content": "hi"}]
WEATHER: Any = {
    "name": "get_weather", "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}  # fmt: skip
CAP_ONE: dict[str, float] = {
    "sequence_slots": 2,
    "max_in_flight": 1,
    "queue_depth": 1,
    "queue_timeout_seconds": 30,
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("anthropic-sdk"))
    try:
        plain, thinker, broken, held = procs.together([
            partial(procs.stub, "--tokens", "8"), partial(procs.stub, "--reasoning", "--tokens", "4"),
            partial(procs.stub, "--error-rate", "1"), partial(procs.stub, "--hold", "1.5", "--tokens", "2")])
        toml = (f"max_body_bytes = {MAX_BODY}\nping_interval_seconds = 0.5\n"
                "queue_update_interval_seconds = 0.2\n"
                + upstream_toml("plain", plain.url, ["plain"])
                + upstream_toml("thinker", thinker.url, ["thinker"])
                + upstream_toml("broken", broken.url, ["broken"])
                + upstream_toml("closed", f"http://127.0.0.1:{free_port()}", ["closed"])
                + upstream_toml("held", held.url, ["held"], CAP_ONE))  # fmt: skip
        yield procs.gateway(toml)
    finally:
        procs.stop_all()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=20) as sdk:  # fmt: skip
        yield sdk


# --- success paths -----------------------------------------------------------------------


async def test_create(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(model="plain", max_tokens=64, messages=USER)
    assert message.id.startswith("msg_") and message.model == "plain" and message.role == "assistant"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "alpha bravo charlie delta echo foxtrot golf hotel"  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == 8 and message.usage.input_tokens == 1
    assert message._request_id  # the request-id header


async def test_stop_sequence_and_max_tokens(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(
        model="plain", max_tokens=64, messages=USER, stop_sequences=["delta"]
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "delta")
    message = await client.messages.create(model="plain", max_tokens=2, messages=USER)
    assert message.stop_reason == "max_tokens" and message.content[0].text == "alpha bravo"  # type: ignore[union-attr]


async def test_stream_text_and_final_message(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(model="plain", max_tokens=64, messages=USER) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == "alpha bravo charlie delta echo foxtrot golf hotel" and len(pieces) == 8
    assert (
        final.stop_reason == "end_turn" and final.usage.output_tokens == 8 and final.usage.input_tokens == 1
    )
    assert final.content[0].text == "".join(pieces)  # type: ignore[union-attr]


async def test_reasoning_upstream_gives_a_thinking_block_first(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(model="thinker", max_tokens=64, messages=USER)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Let me think about this."  # type: ignore[union-attr]
    async with client.messages.stream(model="thinker", max_tokens=64, messages=USER) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Let me think about this."  # type: ignore[union-attr]
    assert final.content[1].text == "alpha bravo charlie delta"  # type: ignore[union-attr]
    # the client sends the thinking block back (empty signature): accepted, never forwarded as text
    history: Any = [
        *USER,
        {"role": "assistant", "content": final.content},
        {"role": "user", "content": "more"},
    ]
    again = await client.messages.create(
        model="thinker",
        max_tokens=64,
        messages=history,
    )
    assert again.stop_reason == "end_turn"


@pytest.mark.parametrize("streaming", [False, True])
async def test_tool_use_round_trip(client: anthropic.AsyncAnthropic, streaming: bool) -> None:
    ask: Any = [{"role": "user", "content": "use get_weather for Paris"}]
    call: Any
    if streaming:
        async with client.messages.stream(
            model="plain", max_tokens=64, messages=ask, tools=[WEATHER]
        ) as stream:
            call = await stream.get_final_message()
    else:
        call = await client.messages.create(model="plain", max_tokens=64, messages=ask, tools=[WEATHER])
    assert call.stop_reason == "tool_use"
    (block,) = [b for b in call.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"city": "x"}
    result: Any = [
        *ask,
        {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}]},
    ]
    answer = await client.messages.create(model="plain", max_tokens=64, messages=result, tools=[WEATHER])
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"


async def test_forced_tool_choice(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(model="plain", max_tokens=64, messages=USER, tools=[WEATHER],
                                           tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    assert [b.type for b in message.content] == ["tool_use"]


async def test_models_and_count_tokens(client: anthropic.AsyncAnthropic) -> None:
    page = await client.models.list()
    assert sorted(m.id for m in page.data) == ["broken", "closed", "held", "plain", "thinker"]
    assert page.has_more is False
    count = await client.messages.count_tokens(
        model="plain", messages=[{"role": "user", "content": "one two three"}]
    )
    assert count.input_tokens == 3


def test_older_sdk_headers_are_accepted(gateway: Proc) -> None:
    body = msgspec.json.encode({"model": "plain", "max_tokens": 4, "messages": USER})
    request = urllib.request.Request(f"{gateway.url}/llm/v1/messages", data=body, headers={
        "content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.headers["request-id"]
        assert msgspec.json.decode(response.read())["stop_reason"] == "max_tokens"


# --- queue frames -------------------------------------------------------------------------


async def test_queued_stream_gets_queue_frames_then_a_normal_message(gateway: Proc) -> None:
    body = msgspec.json.encode({"model": "held", "max_tokens": 8, "stream": True, "messages": USER})

    def post() -> bytes:
        request = urllib.request.Request(f"{gateway.url}/llm/v1/messages", data=body,
                                         headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=20) as response:
            data: bytes = response.read()
            return data

    first = asyncio.create_task(asyncio.to_thread(post))
    await asyncio.sleep(0.4)
    queued = await asyncio.to_thread(post)
    await first
    assert queued.startswith(b'event: queue\ndata: {"type":"queue","position":1,"queued":1}\n\n')
    assert b": keep-alive\n\n" in queued.split(b"event: message_start")[0]
    events = check_anthropic_stream(queued, allow_queue=True)
    assert events[0].name == "message_start" and events[-1].name == "message_stop"
    dropped = b"".join(f + b"\n\n" for f in queued.split(b"\n\n") if f and not f.startswith(b"event: queue"))
    check_anthropic_stream(dropped)  # without the extension it is still a complete Anthropic stream


async def test_sdk_tolerates_queue_frames(gateway: Proc, client: anthropic.AsyncAnthropic) -> None:
    blocker = asyncio.create_task(client.messages.create(model="held", max_tokens=8, messages=USER))
    await asyncio.sleep(0.4)
    async with client.messages.stream(model="held", max_tokens=8, messages=USER) as stream:
        kinds: list[str] = [str(event.type) async for event in stream]
        final = await stream.get_final_message()
    await blocker
    assert kinds[0] == "queue" and "message_start" in kinds
    assert final.content[0].text == "alpha bravo"  # type: ignore[union-attr]


# --- errors ----------------------------------------------------------------------------


def _check(error: anthropic.APIStatusError, status: int, kind: str) -> None:
    assert error.status_code == status
    assert error.body["type"] == "error" and error.body["error"]["type"] == kind  # type: ignore[index]
    assert error.request_id and error.body["request_id"] == error.request_id  # type: ignore[index]


DOCUMENT: Any = [
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "document", "source": {}}]}
]


async def test_bad_request(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model="plain",
            max_tokens=8,
            messages=DOCUMENT,
        )
    _check(caught.value, 400, "invalid_request_error")
    assert caught.value.body["error"]["message"].startswith("messages.0.content.1.type:")  # type: ignore[index]


async def test_unknown_model(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client.messages.create(model="nope", max_tokens=8, messages=USER)
    _check(caught.value, 404, "not_found_error")


async def test_too_large(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.RequestTooLargeError) as caught:
        await client.messages.create(
            model="plain", max_tokens=8, messages=[{"role": "user", "content": "x" * MAX_BODY}]
        )
    _check(caught.value, 413, "request_too_large")


@pytest.mark.parametrize("model", ["broken", "closed"])
@pytest.mark.parametrize("streaming", [False, True])
async def test_upstream_failure_is_internal_server_error(
    client: anthropic.AsyncAnthropic, model: str, streaming: bool
) -> None:
    with pytest.raises(anthropic.InternalServerError) as caught:
        if streaming:
            async with client.messages.stream(model=model, max_tokens=8, messages=USER) as stream:
                await stream.get_final_message()
        else:
            await client.messages.create(model=model, max_tokens=8, messages=USER)
    _check(caught.value, 502, "api_error")


async def test_full_queue_is_503_with_retry_after(client: anthropic.AsyncAnthropic) -> None:
    busy = [
        asyncio.create_task(client.messages.create(model="held", max_tokens=8, messages=USER))
        for _ in range(2)
    ]  # one admitted, one queued: the queue (depth 1) is full
    await asyncio.sleep(0.4)
    with pytest.raises(anthropic.ServiceUnavailableError) as caught:
        await client.messages.create(model="held", max_tokens=8, messages=USER)
    await asyncio.gather(*busy)
    _check(caught.value, 503, "overloaded_error")
    assert int(caught.value.response.headers["retry-after"]) >= 1


def test_wrong_method(gateway: Proc) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{gateway.url}/llm/v1/messages", timeout=10)
    assert caught.value.code == 405
    assert msgspec.json.decode(caught.value.read())["error"]["type"] == "invalid_request_error"
