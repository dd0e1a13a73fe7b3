"""Anthropic request body -> canonical ChatRequest: every block type, every validation path."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.inbound.anthropic.mapping import decode_count_tokens, decode_messages
from domain.canonical import (
    ImagePart,
    Message,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolResultPart,
    ToolSpec,
    ToolUsePart,
)
from domain.errors import InvalidRequest

WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}


def decode(**fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    return decode_messages(msgspec.json.encode(body), "rid")


def rejected(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode(**fields)
    assert caught.value.status == 400
    return caught.value


def test_minimal_request_is_labelled_and_keeps_options_unset() -> None:
    request = decode()
    assert request.model == "m"
    assert request.max_tokens == 16
    assert request.messages == [Message(role="user", content=[TextPart(text="hi")])]
    assert (request.surface, request.request_id) == ("anthropic", "rid")
    assert not request.stream and request.stop == [] and request.tools == []
    assert request.tool_choice is None and request.reasoning is None and not request.prefill


def test_sampling_stop_user_and_stream() -> None:
    request = decode(
        stream=True,
        stop_sequences=["END"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
    )
    assert request.stream
    assert request.stop == ["END"]
    assert (request.temperature, request.top_p, request.top_k) == (0.5, 0.9, 40)
    assert request.user == "u-1"


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("Be brief.", "Be brief."),
        (
            [{"type": "text", "text": "One."}, {"type": "text", "text": "Two.", "cache_control": {}}],
            "One.\n\nTwo.",
        ),
    ],
)
def test_system_string_or_blocks_becomes_a_leading_system_message(system: Any, expected: str) -> None:
    request = decode(system=system)
    assert request.messages[0] == Message(role="system", content=[TextPart(text=expected)])
    assert request.messages[1].role == "user"


def test_empty_system_adds_nothing() -> None:
    assert [m.role for m in decode(system="").messages] == ["user"]


def test_system_turns_inside_messages_keep_their_place() -> None:
    messages = [
        {"role": "system", "content": "Early reminder."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}]},
        {"role": "user", "content": "go on"},
        {"role": "system", "content": "Last word."},
    ]
    request = decode(system="Top.", messages=messages)
    assert request.messages == [
        # the top-level system and a leading system turn are one system message, as any two
        # consecutive turns of one role are
        Message(role="system", content=[TextPart(text="Top."), TextPart(text="Early reminder.")]),
        Message(role="user", content=[TextPart(text="hi")]),
        Message(role="assistant", content=[TextPart(text="hello")]),
        Message(role="system", content=[TextPart(text="A."), TextPart(text="B.")]),
        Message(role="user", content=[TextPart(text="go on")]),
        Message(role="system", content=[TextPart(text="Last word.")]),
    ]
    assert not request.prefill  # a trailing system turn is no assistant prefill


def test_images_base64_and_url() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
        {"type": "image", "source": {"type": "url", "url": "https://img.example.com/y.jpg"}},
        {"type": "text", "text": "what?"},
    ]
    request = decode(messages=[{"role": "user", "content": content}])
    assert request.messages[0].content == [
        ImagePart(url="data:image/png;base64,QUJD"),
        ImagePart(url="https://img.example.com/y.jpg"),
        TextPart(text="what?"),
    ]


def test_tool_round_trip_history() -> None:
    messages = [
        {"role": "user", "content": "use get_weather"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [
                        {"type": "text", "text": "boom"},
                        {"type": "image", "source": {"type": "url", "url": "https://img.example.com/i"}},
                    ],
                },
                {"type": "tool_result", "tool_use_id": "toolu_3"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    request = decode(messages=messages, tools=[WEATHER])
    assistant, user = request.messages[1], request.messages[2]
    assert assistant.content == [
        ThinkingPart(text="hmm", signature=None),
        ThinkingPart(text="", signature="opaque", redacted=True),
        TextPart(text="Calling."),
        ToolUsePart(id="toolu_1", name="get_weather", arguments='{"city":"Paris"}'),
    ]
    assert user.content == [
        ToolResultPart(tool_use_id="toolu_1", content=[TextPart(text="sunny")]),
        ToolResultPart(
            tool_use_id="toolu_2", content=[TextPart(text="boom"), ImagePart(url="https://img.example.com/i")],
            is_error=True,
        ),
        ToolResultPart(tool_use_id="toolu_3", content=[]),
        TextPart(text="thanks"),
    ]


@pytest.mark.parametrize("signature", [{}, {"signature": None}, {"signature": ""}, {"signature": "sig"}])
def test_thinking_blocks_accept_any_signature_and_never_become_text(signature: dict[str, Any]) -> None:
    block = {"type": "thinking", "thinking": "deep", **signature}
    request = decode(
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "again"},
        ]
    )
    (part,) = request.messages[1].content
    assert part == ThinkingPart(text="deep", signature=signature.get("signature") or None)


def test_tool_use_input_keeps_the_clients_json_text() -> None:
    body = (
        b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"},'
        b'{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input": {"a" : [1, 2]} }]}]}'
    )
    part = decode_messages(body, "r").messages[1].content[0]
    assert isinstance(part, ToolUsePart)
    assert msgspec.json.decode(part.arguments) == {"a": [1, 2]}


def test_consecutive_same_role_turns_merge_and_final_assistant_is_a_prefill() -> None:
    request = decode(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "The answer is"},
        ]
    )
    assert request.messages == [
        Message(role="user", content=[TextPart(text="a"), TextPart(text="b")]),
        Message(role="assistant", content=[TextPart(text="The answer is")]),
    ]
    assert request.prefill  # sent as vLLM's continue_final_message without a generation prompt


def test_tools_and_every_tool_choice() -> None:
    tools = [WEATHER, {"name": "t2", "input_schema": {"type": "object"}, "type": "custom"}]
    request = decode(tools=tools, tool_choice={"type": "auto"})
    assert request.tools == [
        ToolSpec(name="get_weather", description="Weather", parameters={"type": "object"}),
        ToolSpec(name="t2", parameters={"type": "object"}),
    ]
    assert request.tool_choice == ToolChoice(mode="auto")
    expected = {
        "any": ToolChoice(mode="required", parallel=False),
        "tool": ToolChoice(mode="named", name="t2", parallel=False),
        "none": ToolChoice(mode="none"),
    }
    for kind, choice in expected.items():
        wire: dict[str, Any] = {"type": kind}
        if kind != "none":
            wire["disable_parallel_tool_use"] = True
        if kind == "tool":
            wire["name"] = "t2"
        assert decode(tools=tools, tool_choice=wire).tool_choice == choice


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, ReasoningConfig(enabled=True, budget_tokens=2048)),
        ({"type": "disabled"}, ReasoningConfig(enabled=False)),
        ({"type": "adaptive"}, ReasoningConfig(enabled=True)),
    ],
)
def test_thinking_config(thinking: dict[str, Any], expected: ReasoningConfig) -> None:
    assert decode(thinking=thinking).reasoning == expected


def test_unknown_fields_and_cache_control_are_ignored() -> None:
    content = [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}, "citations": None}]
    request = decode(messages=[{"role": "user", "content": content}], service_tier="auto", container=None)
    assert request.messages[0].content == [TextPart(text="hi")]


def test_count_tokens_needs_no_max_tokens() -> None:
    body = msgspec.json.encode(
        {"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    )
    request = decode_count_tokens(body, "r")
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.max_tokens is None and request.tools[0].name == "get_weather"
    with pytest.raises(InvalidRequest) as caught:
        decode_count_tokens(b'{"model":"m","messages":[]}', "r")
    assert caught.value.param == "messages"
