"""Tool call arguments that are not a JSON object, on the `/v1` surfaces: relayed as they came.

OpenAI's own answers carry a call's `arguments` as a string the client parses (OpenAI says the
model may produce invalid JSON), so both `/v1/chat/completions` and `/v1/responses` pass vLLM's
string on untouched, streamed or not: the same `arguments` either way, never an error. (`/llm`
cannot: an Anthropic `tool_use.input` is an object; `tests/contract/anthropic/test_tool_arguments.py`.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml

ARGUMENTS: dict[str, tuple[Any, str]] = {  # the stub's schema for the tool -> the arguments it answers
    "number": ({"const": 4120000000000.0}, "4120000000000.0"),  # what vLLM 0.32 answered
    "false": ({"const": False}, "false"),
    "not-json": ({"type": "object", "x-stub-arguments": "city=Paris"}, "city=Paris"),
    "empty": ({"type": "object", "x-stub-arguments": ""}, ""),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("tool-arguments-relay"))
    try:
        stub = procs.stub()
        yield procs.gateway(upstream_toml("plain", stub.url, ["plain"]))
    finally:
        procs.stop_all()


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)


@pytest.mark.parametrize("kind", sorted(ARGUMENTS))
def test_chat_completions_relay_the_same_arguments_streamed_or_not(client: openai.OpenAI, kind: str) -> None:
    schema, arguments = ARGUMENTS[kind]
    ask: Any = {"model": "plain", "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}}}  # fmt: skip
    plain = client.chat.completions.create(**ask).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.tool_calls
    assert plain.message.tool_calls[0].function.arguments == arguments  # type: ignore[union-attr]
    pieces, reasons = [], []
    for chunk in client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            pieces += [call.function.arguments or "" for call in choice.delta.tool_calls or () if call.function]
    assert "".join(pieces) == arguments and reasons[-1] == "tool_calls"


@pytest.mark.parametrize("kind", sorted(ARGUMENTS))
def test_responses_relay_the_same_arguments_streamed_or_not(client: openai.OpenAI, kind: str) -> None:
    schema, arguments = ARGUMENTS[kind]
    ask: Any = {"model": "plain", "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": {"type": "function", "name": "f"}}  # fmt: skip
    plain = client.responses.create(**ask)
    assert plain.status == "completed"
    assert [(item.type, getattr(item, "arguments", None)) for item in plain.output] == [("function_call", arguments)]
    events = list(client.responses.create(**ask, stream=True))
    assert events[-1].type == "response.completed"
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output  # type: ignore[union-attr]
    assert done == [arguments] and deltas == arguments
    assert [(item.type, getattr(item, "arguments", None)) for item in final] == [("function_call", arguments)]


def test_a_call_cut_by_max_tokens_is_relayed_cut_both_ways(client: openai.OpenAI) -> None:
    """Out of tokens mid-call (the stub cuts after one fragment): `length` / `incomplete` with
    the arguments as far as they got, streamed or not."""
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    chat: Any = {"model": "plain", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": weather}}],
                 "tool_choice": "required"}  # fmt: skip
    plain = client.chat.completions.create(**chat).choices[0]
    cut = plain.message.tool_calls[0].function.arguments  # type: ignore[index, union-attr]
    assert plain.finish_reason == "length" and cut and not cut.endswith("}")
    pieces = [call.function.arguments or "" for chunk in client.chat.completions.create(**chat, stream=True)
              for choice in chunk.choices for call in choice.delta.tool_calls or () if call.function]  # fmt: skip
    assert "".join(pieces) == cut
    ask: Any = {"model": "plain", "input": "hi", "max_output_tokens": 1, "tool_choice": "required",
                "tools": [{"type": "function", "name": "f", "parameters": weather}]}  # fmt: skip
    response = client.responses.create(**ask)
    assert response.status == "incomplete" and response.output[0].arguments == cut  # type: ignore[union-attr]
    events = list(client.responses.create(**ask, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].arguments == cut  # type: ignore[union-attr]
