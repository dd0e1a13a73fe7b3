"""Responses request decoding (every field, every refusal naming its field) and answer encoding."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.responses.mapping import decode_request, encode_response
from adapters.inbound.responses.tools import flat_name
from domain.canonical import (
    ChatResponse,
    ImagePart,
    Message,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolResultPart,
    ToolUsePart,
    Usage,
)
from domain.errors import InvalidRequest
from domain.sampling import Sampling

WEATHER = {"type": "function", "name": "get_weather", "description": "w", "parameters": {"type": "object"}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "d", "tools": [
    {"type": "function", "name": "close_agent", "parameters": {"type": "object"}},
    {"type": "custom", "name": "freeform"},
]}


def decode(limits: InputLimits | None = None, **body: Any) -> Any:
    raw = msgspec.json.encode({"model": "m", "input": "hi", **body})
    return decode_request(raw, "rid", limits or InputLimits(), 1700000000)


def refused(param: str | None, **body: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode(**body)
    assert caught.value.param == param, caught.value.message
    return caught.value


def test_a_string_input_and_instructions() -> None:
    call = decode(instructions="Be brief.", max_output_tokens=7, temperature=0.2, top_p=0.9, user="u")
    chat = call.chat
    assert chat.messages == [Message(role="system", content=[TextPart(text="Be brief.")]),
                             Message(role="user", content=[TextPart(text="hi")])]
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.user) == (7, 0.2, 0.9, "u")
    assert (chat.surface, chat.request_id, chat.stream, chat.tools) == ("responses", "rid", False, [])
    template = call.template
    assert (template.id, template.created_at, template.status, template.model) == (
        "resp_rid", 1700000000, "in_progress", "m")
    assert template.instructions == "Be brief." and template.max_output_tokens == 7


def test_history_items_become_turns() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"role": "system", "content": "more rules"},  # an "easy" message: no type
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum"}],
         "content": [{"type": "reasoning_text", "text": "think"}], "encrypted_content": "x"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"P"}'},
        {"type": "function_call", "call_id": "c2", "name": "close_agent", "namespace": "multi_agent_v1",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only a summary"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    chat = decode(input=items, tools=[WEATHER, AGENTS]).chat
    assert chat.messages == [
        Message(role="system", content=[TextPart(text="rules")]),
        Message(role="system", content=[TextPart(text="more rules")]),
        Message(role="user", content=[TextPart(text="look"), ImagePart(url="data:image/png;base64,AA", detail="low")]),
        Message(role="assistant", content=[
            ThinkingPart(text="think"), TextPart(text="calling"),
            ToolUsePart(id="c1", name="get_weather", arguments='{"city":"P"}'),
            ToolUsePart(id="c2", name="multi_agent_v1__close_agent", arguments="{}"),
        ]),
        Message(role="user", content=[ToolResultPart(tool_use_id="c1", content=[TextPart(text="sunny")]),
                                      ToolResultPart(tool_use_id="c2", content=[TextPart(text="done")])]),
        Message(role="assistant", content=[ThinkingPart(text="only a summary"), TextPart(text="no")]),
    ]


def test_tools_functions_and_namespaces_are_offered_hosted_ones_left_out() -> None:
    call = decode(tools=[WEATHER, {"type": "web_search", "external_web_access": False}, AGENTS,
                         {"type": "file_search"}, {"type": "code_interpreter"}, {"type": "something_new"}])
    assert [t.name for t in call.chat.tools] == ["get_weather", "multi_agent_v1__close_agent"]
    assert call.chat.tools[0].parameters == {"type": "object"} and call.chat.tools[0].description == "w"
    assert call.tools.split("multi_agent_v1__close_agent") == ("close_agent", "multi_agent_v1")
    assert call.tools.split("get_weather") == ("get_weather", None)
    assert call.template.tools[1] == {"type": "web_search", "external_web_access": False}  # echoed as sent


def test_the_flat_name_is_codexs() -> None:
    assert flat_name("mcp__sample__", "_search") == "mcp__sample__search"
    assert flat_name("multi_agent_v1", "close_agent") == "multi_agent_v1__close_agent"


@pytest.mark.parametrize(("choice", "parallel", "expected", "offered"), [
    ("auto", None, ToolChoice(mode="auto"), 2),
    ("required", False, ToolChoice(mode="required", parallel=False), 2),
    ("none", None, ToolChoice(mode="none"), 2),
    ({"type": "function", "name": "get_weather"}, None, ToolChoice(mode="named", name="get_weather"), 2),
    ({"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}, None,
     ToolChoice(mode="named", name="multi_agent_v1__close_agent"), 2),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}, True,
     ToolChoice(mode="required", parallel=True), 1),
    (None, False, ToolChoice(mode="auto", parallel=False), 2),
    (None, None, None, 2),
])
def test_tool_choice(choice: Any, parallel: bool | None, expected: ToolChoice | None, offered: int) -> None:
    body: dict[str, Any] = {"tools": [WEATHER, AGENTS]}
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    chat = decode(**body).chat
    assert chat.tool_choice == expected and len(chat.tools) == offered


@pytest.mark.parametrize(("reasoning", "expected"), [
    ({"effort": "none"}, ReasoningConfig(enabled=False)),
    ({"effort": "low", "summary": "auto"}, ReasoningConfig(effort="low")),
    ({"effort": "xhigh"}, ReasoningConfig(effort="xhigh")),
    ({"summary": "auto"}, None),
])
def test_reasoning(reasoning: dict[str, Any], expected: ReasoningConfig | None) -> None:
    call = decode(reasoning=reasoning)
    assert call.chat.reasoning == expected
    assert call.template.reasoning.summary == reasoning.get("summary")


def test_text_format_is_the_chat_response_format() -> None:
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "name": "a", "schema": schema, "strict": True}
    assert decode(text={"format": fmt}).chat.sampling.response_format == {
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    assert decode(text={"format": {"type": "json_object"}}).chat.sampling.response_format == {"type": "json_object"}
    assert decode(text={"format": {"type": "text"}, "verbosity": "low"}).chat.sampling == Sampling()
    refused("text.format.schema", text={"format": {"type": "json_schema", "name": "a"}})
    big = {"type": "json_schema", "name": "a", "schema": {"description": "x" * 70000}}
    refused("text.format.schema", text={"format": big})  # bounded like a tool's schema


def test_accepted_and_ignored() -> None:  # and never forwarded: nothing but `sampling` carries a client's member
    call = decode(store=True, include=["reasoning.encrypted_content", "file_search_call.results"],
                  prompt_cache_key="s1", client_metadata={"a": 1}, truncation="auto", service_tier="flex",
                  metadata={"k": "v"})
    assert call.chat.sampling == Sampling()
    assert call.template.prompt_cache_key == "s1" and call.template.metadata == {"k": "v"}


@pytest.mark.parametrize(("field", "value"), [("previous_response_id", "resp_1"), ("conversation", "conv_1"),
                                              ("conversation", {"id": "conv_1"}), ("background", True)])
def test_stateful_features_are_refused(field: str, value: Any) -> None:
    error = refused(field, **{field: value})
    assert "full history" in error.message and "`input`" in error.message


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "nope"}]}, "input[0].type"),
    ({"input": [{"content": "no role, no type"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}, "input[0].content[0].text"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
     "input[0].output[0]"),
    ({"tools": [{"name": "no type"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [{**AGENTS, "tools": [{"type": "function", "name": 5}]}]}, "tools[0].tools[0].name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"model": 5}, "model"),
    ({"input": 5}, "input"),
])
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    refused(param, **body)


def test_a_missing_input_and_bad_bodies() -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_request(b'{"model": "m"}')
    assert caught.value.param == "input"
    deep = b'{"client_metadata": {"a": ' + b"[" * 100000
    for raw, text in ((b"[1]", "must be a JSON object"), (b"{", "not valid JSON"), (deep, "nested")):
        with pytest.raises(InvalidRequest) as caught:
            decode_request(raw)
        assert text in caught.value.message


def test_limits() -> None:
    limits = InputLimits(max_messages=2, max_content_blocks=1, max_output_tokens={"m": 10})
    assert decode(limits).chat.max_tokens == 10  # the cap is the default
    with pytest.raises(InvalidRequest) as caught:
        decode(limits, max_output_tokens=11)
    assert caught.value.param == "max_output_tokens"
    with pytest.raises(InvalidRequest) as caught:
        decode(limits, input=[{"role": "user", "content": "a"}] * 3)
    assert caught.value.param == "input"
    two = [{"type": "input_text", "text": "a"}] * 2
    with pytest.raises(InvalidRequest) as caught:
        decode(limits, input=[{"role": "user", "content": two}])
    assert caught.value.param == "input[0].content"


def answer(*parts: Any, reason: Any = "end_turn") -> ChatResponse:
    return ChatResponse(id="x", model="upstream", created=1, content=list(parts), finish_reason=reason,
                        usage=Usage(input_tokens=5, output_tokens=3))


def test_encode_an_answer() -> None:
    call = decode(tools=[AGENTS], metadata={"k": "v"})
    body = msgspec.json.decode(encode_response(answer(
        ThinkingPart(text="hmm"), TextPart(text="a"), TextPart(text="b"),
        ToolUsePart(id="c9", name="multi_agent_v1__close_agent", arguments="{}"), reason="tool_use"), call))
    assert body["status"] == "completed" and body["model"] == "m" and body["metadata"] == {"k": "v"}
    assert body["output"] == [
        {"type": "reasoning", "id": "rs_rid_0", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}],
         "status": "completed"},
        {"type": "message", "id": "msg_rid_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "ab", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_rid_2", "call_id": "c9", "name": "close_agent", "arguments": "{}",
         "status": "completed", "namespace": "multi_agent_v1"},
    ]
    assert body["usage"]["total_tokens"] == 8 and body["tools"] == [AGENTS]


def test_a_truncated_answer_is_incomplete() -> None:
    body = msgspec.json.decode(encode_response(answer(TextPart(text="a"), reason="max_tokens"), decode()))
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
