"""Tool call arguments that are not a JSON object get one verdict on `/llm`, streamed or not.

vLLM 0.32 can answer a named `tool_choice` with arguments that are JSON but not an object
(`4120000000000.0`), streamed over several chunks. An Anthropic `tool_use.input` must be an
object, so the answer is the gateway's 502 `api_error` "The upstream produced tool call
arguments that are not a JSON object." as a status without a stream, and as the stream's
terminal `event: error` with one: never a `tool_use` block whose input is a number, `false`, a
list or text, and never `stop_reason: tool_use` / `message_stop` after one.

The stub calls the offered tool with a value of its schema (`{"const": V}` gives V) or, with
`x-stub-arguments`, with that text verbatim, in 2-3 fragments when streamed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

NOT_AN_OBJECT = "The upstream produced tool call arguments that are not a JSON object."
USER: Any = [{"role": "user", "content": "hi"}]
FORCED: Any = {"type": "tool", "name": "f"}
SCHEMAS: dict[str, Any] = {
    "number": {"const": 4120000000000.0},  # what vLLM 0.32 answered (docs: protocols, section 12)
    "false": {"const": False},
    "list": {"type": "array", "const": [1, 2]},
    "string": {"const": "Paris"},
    "not-json": {"type": "object", "x-stub-arguments": "city=Paris"},
    "two-objects": {"type": "object", "x-stub-arguments": '{"a": 1} {"b": 2}'},
}
WEATHER: Any = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def tools(schema: Any) -> Any:
    return [{"name": "f", "description": "a tool", "input_schema": schema}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("tool-arguments"))
    try:
        stub = procs.stub()
        yield procs.gateway("ping_interval_seconds = 0.5\n" + upstream_toml("plain", stub.url, ["plain"]))
    finally:
        procs.stop_all()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=20) as sdk:  # fmt: skip
        yield sdk


def verdict(error: anthropic.APIStatusError) -> tuple[str, str]:
    body: Any = error.body
    return body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
async def test_not_an_object_is_one_verdict_streamed_or_not(client: anthropic.AsyncAnthropic, kind: str) -> None:
    ask: Any = {"model": "plain", "max_tokens": 64, "messages": USER, "tools": tools(SCHEMAS[kind]),
                "tool_choice": FORCED}  # fmt: skip
    with pytest.raises(anthropic.InternalServerError) as plain:
        await client.messages.create(**ask)
    assert plain.value.status_code == 502 and verdict(plain.value) == ("api_error", NOT_AN_OBJECT)
    # the stream helper accumulates the tool input as it comes: it must never see one
    with pytest.raises(anthropic.APIStatusError) as helper:
        async with client.messages.stream(**ask) as stream:
            await stream.get_final_message()
    assert verdict(helper.value) == verdict(plain.value)
    # the raw events, up to the error
    seen: list[Any] = []
    with pytest.raises(anthropic.APIStatusError) as raw:
        async for event in await client.messages.create(**ask, stream=True):
            seen.append(event)
    assert verdict(raw.value) == verdict(plain.value)
    assert [event.type for event in seen] == ["message_start"]


@pytest.mark.parametrize("kind", ["number", "not-json"])
def test_the_stream_ends_with_an_error_event_and_nothing_else(gateway: Proc, kind: str) -> None:
    body = {"model": "plain", "max_tokens": 64, "stream": True, "messages": USER, "tools": tools(SCHEMAS[kind]),
            "tool_choice": FORCED}  # fmt: skip
    reply = httpx.post(f"{gateway.url}/llm/v1/messages", json=body, timeout=20)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = check_anthropic_stream(reply.content)  # the grammar, ending in `error`
    assert [e.name for e in events] == ["message_start", "error"]
    assert events[-1].data == {"type": "error", "error": {"type": "api_error", "message": NOT_AN_OBJECT}}
    for word in (b"tool_use", b"input_json_delta", b"message_stop", b"message_delta"):
        assert word not in reply.content


@pytest.mark.parametrize("streaming", [False, True])
async def test_object_arguments_still_make_a_tool_use(client: anthropic.AsyncAnthropic, streaming: bool) -> None:
    ask: Any = {"model": "plain", "max_tokens": 64, "messages": USER, "tools": tools(WEATHER), "tool_choice": FORCED}
    if streaming:
        async with client.messages.stream(**ask) as stream:
            message = await stream.get_final_message()
    else:
        message = await client.messages.create(**ask)
    assert message.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in message.content] == [("tool_use", {"city": "x"})]


@pytest.mark.parametrize("streaming", [False, True])
async def test_empty_arguments_are_an_empty_input(client: anthropic.AsyncAnthropic, streaming: bool) -> None:
    ask: Any = {"model": "plain", "max_tokens": 64, "messages": USER, "tools": tools({"x-stub-arguments": ""}),
                "tool_choice": FORCED}  # fmt: skip
    if streaming:
        async with client.messages.stream(**ask) as stream:
            message = await stream.get_final_message()
    else:
        message = await client.messages.create(**ask)
    assert message.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in message.content] == [("tool_use", {})]


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_call_cut_by_max_tokens_is_left_out(client: anthropic.AsyncAnthropic, streaming: bool) -> None:
    """Out of tokens mid-call (the stub cuts the arguments after one fragment, finish_reason
    `length`): `max_tokens` both ways, without the unfinished call (its input is no object)."""
    ask: Any = {"model": "plain", "max_tokens": 1, "messages": USER, "tools": tools(WEATHER), "tool_choice": FORCED}
    if streaming:
        async with client.messages.stream(**ask) as stream:
            message = await stream.get_final_message()
    else:
        message = await client.messages.create(**ask)
    assert message.stop_reason == "max_tokens" and message.content == []
