"""Golden transcripts: upstream chunk sequences (canonical events) -> the exact Responses events.

Each scenario is a list of upstream chunks (the canonical events one upstream chunk
decodes to) fed to the state machine chunk by chunk, optionally after the request
waited for a slot; the frames must equal `fixtures/<name>.sse` byte for byte, obey the
grammar (`tests/support/responses_grammar.py`: every event validated as the SDK's own
type) and be accepted by the official SDK's `responses.stream(...)` helper (replayed
through a mock transport). Set `UPDATE_GOLDEN=1` to rewrite the fixtures after an
intended change, then review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import openai
import pytest
from tests.support.responses_grammar import check_responses_stream

from adapters.inbound.responses.mapping import decode_request
from adapters.inbound.responses.stream import NO_FINISH, ResponseStream
from domain.canonical import (
    Finish,
    MessageStart,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)

FIXTURES = Path(__file__).parent / "fixtures"
START = MessageStart(id="chatcmpl-golden1", model="upstream", created=1700000000)
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
          "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]}
REQUEST = {"model": "reasoning", "input": "hi", "stream": True, "tools": [WEATHER, TIME, AGENTS]}


def usage(i: int, o: int) -> UsageReport:
    return UsageReport(usage=Usage(input_tokens=i, output_tokens=o))


Chunks = list[list[StreamEvent]]
SCENARIOS: dict[str, Chunks] = {
    "text_only": [
        [START, TextDelta(text="")],
        [TextDelta(text="Hello")],
        [TextDelta(text=" world")],
        [Finish(reason="end_turn")],
        [usage(12, 2)],
    ],
    "reasoning_then_text": [
        [START],
        [ThinkingDelta(text="Let")],
        [ThinkingDelta(text=" me think.")],
        [TextDelta(text="alpha")],
        [TextDelta(text=" bravo")],
        [Finish(reason="end_turn"), usage(4, 6)],
    ],
    "tool_call_arguments_split": [
        [START],
        [TextDelta(text="Checking.")],
        [ToolCallStart(index=0, id="chatcmpl-tool-7f", name="get_weather"), ToolArgsDelta(index=0, json_fragment="")],
        [ToolArgsDelta(index=0, json_fragment='{"ci')],
        [ToolArgsDelta(index=0, json_fragment='ty": "Pa')],
        [ToolArgsDelta(index=0, json_fragment='ris"}')],
        [Finish(reason="tool_use")],
        [usage(20, 9)],
    ],
    "parallel_tool_calls_interleaved": [
        [START],
        [ToolCallStart(index=0, id="call_a", name="get_weather"), ToolArgsDelta(index=0, json_fragment='{"city"')],
        [ToolCallStart(index=1, id="call_b", name="get_time"), ToolArgsDelta(index=1, json_fragment="{")],
        [ToolArgsDelta(index=0, json_fragment=': "Paris"}'), ToolArgsDelta(index=1, json_fragment="}")],
        [Finish(reason="tool_use"), usage(30, 12)],
    ],
    "namespaced_tool_call": [
        [START],
        [ThinkingDelta(text="Close it.")],
        [ToolCallStart(index=0, id="call_ns", name="multi_agent_v1__close_agent")],
        [ToolArgsDelta(index=0, json_fragment='{"target": "a1"}')],
        [Finish(reason="tool_use")],
        [usage(40, 7)],
    ],
    "max_output_tokens": [
        [START],
        [TextDelta(text="alpha")],
        [TextDelta(text=" bravo")],
        [Finish(reason="max_tokens")],
        [usage(3, 2)],
    ],
    "upstream_error_mid_stream": [
        [START],
        [TextDelta(text="alpha")],
        [StreamError(kind="upstream-error", message="The upstream failed: connection reset.", status=502)],
    ],
    "no_finish_reason": [
        [START],
        [ThinkingDelta(text="Hmm")],
        [TextDelta(text="alpha")],
        [StreamError(kind="upstream-protocol-error", message=NO_FINISH, status=502)],
    ],
    "queued_then_text": [  # the first chunk arrives after the request waited for a slot
        [START, TextDelta(text="alpha")],
        [Finish(reason="end_turn"), usage(2, 1)],
    ],
}
QUEUED = {"queued_then_text"}


def machine() -> ResponseStream:
    call = decode_request(msgspec.json.encode(REQUEST), request_id="golden1", created_at=1700000000)
    return ResponseStream(call.template, call.tools)


def render(name: str) -> bytes:
    stream = machine()
    frames = [stream.queued()] if name in QUEUED else []
    frames += [stream.feed(chunk) for chunk in SCENARIOS[name]]
    return b"".join(frames) + stream.finish()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_transcript(name: str) -> None:
    produced = render(name)
    path = FIXTURES / f"{name}.sse"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(produced)
    assert produced == path.read_bytes()
    check_responses_stream(produced)


def test_every_fixture_has_a_scenario() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.sse")) == sorted(SCENARIOS)


async def replay(body: bytes) -> tuple[list[Any], Any]:
    """Run the official SDK's `responses.stream()` over the transcript: its events, its final Response."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = openai.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(handler))
    client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", max_retries=0, http_client=http)
    async with client.responses.stream(model="reasoning", input="hi") as stream:
        events = [event async for event in stream]
        final = stream._state._completed_response  # None unless response.completed arrived
    return events, final


async def test_sdk_accumulates_text_and_reasoning() -> None:
    events, final = await replay(render("reasoning_then_text"))
    assert final.output_text == "alpha bravo" and final.status == "completed"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Let me think."
    assert final.usage.input_tokens == 4 and final.usage.total_tokens == 10
    deltas = [e.snapshot for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["alpha", "alpha bravo"]  # the helper's running snapshot


async def test_sdk_joins_split_arguments_and_keeps_calls_apart() -> None:
    _, final = await replay(render("tool_call_arguments_split"))
    call = final.output[1]
    assert (call.type, call.name, call.call_id, call.arguments) == (
        "function_call", "get_weather", "chatcmpl-tool-7f", '{"city": "Paris"}')
    _, final = await replay(render("parallel_tool_calls_interleaved"))
    assert [(c.name, c.arguments) for c in final.output] == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]


async def test_a_namespaced_call_comes_back_with_its_namespace() -> None:
    _, final = await replay(render("namespaced_tool_call"))
    call = final.output[1]
    assert (call.namespace, call.name, call.arguments) == ("multi_agent_v1", "close_agent", '{"target": "a1"}')


async def test_truncation_is_an_incomplete_response() -> None:
    events, final = await replay(render("max_output_tokens"))
    assert final is None  # no response.completed
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].status == "incomplete" and last.response.output_text == "alpha bravo"


@pytest.mark.parametrize("name", ["upstream_error_mid_stream", "no_finish_reason"])
async def test_a_failure_after_the_start_is_error_then_failed(name: str) -> None:
    events, final = await replay(render(name))
    assert final is None
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.error.code == "server_error"
    assert events[-1].response.error.message == events[-2].message


async def test_the_sdk_parses_a_queued_stream() -> None:
    events, final = await replay(render("queued_then_text"))
    assert [e.type for e in events[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and events[2].response.status == "in_progress"
    assert final.output_text == "alpha"
