"""Golden SSE transcripts: canonical event sequences -> the exact Anthropic frames.

Each scenario is a list of upstream chunks (lists of canonical events) fed to the
state machine chunk by chunk; the frames must equal `fixtures/<name>.sse` byte for
byte, obey the grammar, and be accepted by the official SDK's stream accumulator
(replayed through a mock transport). Set `UPDATE_GOLDEN=1` to rewrite the fixtures
after an intended change, then review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import anthropic
import httpx2
import pytest
from tests.support.anthropic_grammar import check_anthropic_stream

from adapters.inbound.anthropic.stream import NO_FINISH, AnthropicStream
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
    "thinking_then_text": [
        [START],
        [ThinkingDelta(text="Let")],
        [ThinkingDelta(text=" me think.")],
        [TextDelta(text="alpha")],
        [TextDelta(text=" bravo")],
        [Finish(reason="end_turn"), usage(4, 6)],
    ],
    "one_tool_call": [
        [START],
        [TextDelta(text="Checking.")],
        [
            ToolCallStart(index=0, id="chatcmpl-tool-7f", name="get_weather"),
            ToolArgsDelta(index=0, json_fragment=""),
        ],
        [ToolArgsDelta(index=0, json_fragment='{"city": ')],
        [ToolArgsDelta(index=0, json_fragment='"Paris"}')],
        [Finish(reason="tool_use")],
        [usage(20, 9)],
    ],
    "several_tool_calls": [
        [START],
        [ToolCallStart(index=0, id="call_a", name="get_weather")],
        [ToolArgsDelta(index=0, json_fragment='{"city": "Paris"}')],
        [ToolCallStart(index=1, id="call_b", name="get_time")],
        [ToolArgsDelta(index=1, json_fragment="{}")],
        [Finish(reason="tool_use"), usage(30, 12)],
    ],
    "tool_arguments_not_an_object": [  # vLLM 0.32 with a named tool_choice; unstreamed: the same 502
        [START],
        [ToolCallStart(index=0, id="chatcmpl-tool-9a", name="get_weather")],
        [ToolArgsDelta(index=0, json_fragment="412000")],
        [ToolArgsDelta(index=0, json_fragment="0000000.0")],
        [Finish(reason="tool_use")],
        [usage(20, 3)],
    ],
    "max_tokens": [
        [START],
        [TextDelta(text="alpha")],
        [TextDelta(text=" bravo")],
        [Finish(reason="max_tokens")],
        [usage(3, 2)],
    ],
    "stop_sequence": [
        [START],
        [TextDelta(text="alpha bravo charlie delta ")],
        [Finish(reason="stop_sequence", stop_sequence="echo")],
        [usage(3, 4)],
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
}


def render(chunks: Chunks) -> bytes:
    machine = AnthropicStream("reasoning")
    frames = [b"".join(machine.feed_many(chunk)) for chunk in chunks]
    return b"".join(frames) + b"".join(machine.finish())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_transcript(name: str) -> None:
    produced = render(SCENARIOS[name])
    path = FIXTURES / f"{name}.sse"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(produced)
    assert produced == path.read_bytes()
    check_anthropic_stream(produced)


def test_every_fixture_has_a_scenario() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.sse")) == sorted(SCENARIOS)


async def replay(body: bytes) -> anthropic.types.Message:
    """Run the official SDK's `messages.stream()` over the transcript."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = anthropic.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(handler))
    client = anthropic.AsyncAnthropic(base_url="http://gw/llm", api_key="x", max_retries=0, http_client=http)
    async with client.messages.stream(
        model="reasoning", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        return await stream.get_final_message()


@pytest.mark.parametrize(
    "name",
    ["text_only", "thinking_then_text", "one_tool_call", "several_tool_calls", "max_tokens", "stop_sequence"],
)
async def test_sdk_accumulates_the_transcript(name: str) -> None:
    message = await replay(render(SCENARIOS[name]))
    assert message.id == "msg_golden1" and message.stop_reason is not None
    if name == "thinking_then_text":
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "Let me think."  # type: ignore[union-attr]
    if name == "several_tool_calls":
        inputs = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
        assert inputs == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    if name == "stop_sequence":
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "echo")


@pytest.mark.parametrize("name", ["upstream_error_mid_stream", "no_finish_reason", "tool_arguments_not_an_object"])
async def test_sdk_raises_on_the_error_frame(name: str) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        await replay(render(SCENARIOS[name]))
    assert caught.value.status_code == 200
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
