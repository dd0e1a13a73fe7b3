"""Canonical request -> vLLM `/v1/chat/completions` body."""

from __future__ import annotations

from typing import Any

import msgspec

from adapters.outbound.openai_compat.request_body import encode_chat, encode_tokenize
from domain.canonical import (
    ChatRequest,
    ImagePart,
    Message,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolChoiceMode,
    ToolResultPart,
    ToolSpec,
    ToolUsePart,
)
from domain.sampling import Sampling


def body(request: ChatRequest, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.json.decode(encode_chat(request, **kw))
    return out


def user(text: str) -> Message:
    return Message(role="user", content=[TextPart(text=text)])


def test_minimal_request_is_minimal() -> None:
    assert body(ChatRequest(model="m", messages=[user("hi")])) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_sampling_and_stop() -> None:
    request = ChatRequest(
        model="m",
        messages=[user("hi")],
        max_tokens=64,
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop=["###"],
        user="u-1",
    )
    out = body(request)
    assert out["max_tokens"] == 64 and out["temperature"] == 0.2 and out["top_p"] == 0.9
    assert out["top_k"] == 40 and out["stop"] == ["###"] and out["user"] == "u-1"


def test_empty_stop_and_tools_are_omitted() -> None:
    request = ChatRequest(model="m", messages=[user("hi")], tool_choice=ToolChoice(mode="auto"))
    out = body(request)
    assert "stop" not in out and "tools" not in out and "tool_choice" not in out


def test_conversation_with_tools_and_results() -> None:
    request = ChatRequest(
        model="m",
        messages=[
            Message(role="system", content=[TextPart(text="Be brief."), TextPart(text="Use tools.")]),
            user("weather and time in Paris?"),
            Message(
                role="assistant",
                content=[
                    ThinkingPart(text="Two calls.", signature="sig"),
                    ThinkingPart(text="", redacted=True, signature="opaque"),
                    TextPart(text="Checking."),
                    ToolUsePart(id="call_1", name="get_weather", arguments='{"city":"Paris"}'),
                    ToolUsePart(id="call_2", name="get_time", arguments="{}"),
                ],
            ),
            Message(
                role="user",
                content=[
                    ToolResultPart(tool_use_id="call_1", content=[TextPart(text="18C")]),
                    TextPart(text="thanks"),
                    ToolResultPart(
                        tool_use_id="call_2",
                        content=[TextPart(text="clock"), TextPart(text="down"), ImagePart(url="data:x")],
                        is_error=True,
                    ),
                ],
            ),
        ],
    )
    assert body(request)["messages"] == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
            "reasoning": "Two calls.",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: clock\ndown"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "thanks"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
    ]


def test_turn_of_only_tool_results_has_no_user_message() -> None:
    request = ChatRequest(
        model="m",
        messages=[
            Message(role="assistant", content=[ToolUsePart(id="c", name="f", arguments="{}")]),
            Message(role="user", content=[ToolResultPart(tool_use_id="c", content=[])]),
        ],
    )
    assert body(request)["messages"] == [
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": ""},
    ]


def test_images_and_names() -> None:
    request = ChatRequest(
        model="m",
        messages=[
            Message(
                role="user",
                name="alice",
                content=[TextPart(text="what is this?"), ImagePart(url="https://x/y.png", detail="low")],
            )
        ],
    )
    assert body(request)["messages"] == [
        {
            "role": "user",
            "name": "alice",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            ],
        }
    ]


def test_tools_and_choices() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [
        ToolSpec(name="get_weather", description="Weather now", parameters=schema),
        ToolSpec(name="noop"),
    ]
    named = ChatRequest(
        model="m",
        messages=[user("x")],
        tools=tools,
        tool_choice=ToolChoice(mode="named", name="noop", parallel=False),
    )
    out = body(named)
    assert out["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather now", "parameters": schema},
        },
        {"type": "function", "function": {"name": "noop", "parameters": {}}},
    ]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "noop"}}
    assert out["parallel_tool_calls"] is False
    modes: list[ToolChoiceMode] = ["auto", "none", "required"]
    for mode in modes:
        request = ChatRequest(model="m", messages=[user("x")], tools=tools, tool_choice=ToolChoice(mode=mode))
        assert body(request)["tool_choice"] == mode


def test_streaming_always_asks_for_usage_and_keeps_continuous_usage_stats() -> None:
    request = ChatRequest(model="m", messages=[user("x")], stream=True, continuous_usage_stats=True)
    out = body(request)
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_non_streaming_body_has_no_stream_options() -> None:
    request = ChatRequest(model="m", messages=[user("x")], stream=True, continuous_usage_stats=True,
                          sampling=Sampling(seed=1))
    out = body(request, stream=False)
    assert "stream" not in out and "stream_options" not in out and out["seed"] == 1


def test_allowlisted_parameters_sequences_prefill_and_salt() -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    sampling = Sampling(seed=7, response_format=response_format, repetition_penalty=1.1, min_p=0.1,
                        logit_bias={"5": 2.0}, guided_regex="a+")
    request = ChatRequest(model="m", messages=[user("x")], temperature=0.5, n=2, best_of=3, logprobs=True,
                          top_logprobs=1, sampling=sampling, prefill=True, cache_salt="s" * 43)
    out = body(request)
    assert out["temperature"] == 0.5 and out["model"] == "m"
    assert out["n"] == 2 and out["best_of"] == 3 and out["seed"] == 7 and out["logprobs"] is True
    assert out["response_format"] == response_format and out["repetition_penalty"] == 1.1
    assert (out["min_p"], out["logit_bias"], out["guided_regex"], out["top_logprobs"]) == (0.1, {"5": 2.0}, "a+", 1)
    assert (out["continue_final_message"], out["add_generation_prompt"]) == (True, False)
    assert out["cache_salt"] == "s" * 43
    plain = body(ChatRequest(model="m", messages=[user("x")]))
    assert set(plain) == {"model", "messages"}  # nothing unset is sent: vLLM's defaults hold


def test_reasoning_config_is_forwarded_model_specifically() -> None:
    request = ChatRequest(
        model="m",
        messages=[user("x")],
        reasoning=ReasoningConfig(enabled=False, budget_tokens=512),
        chat_template_kwargs={"custom": 1, "enable_thinking": True},
    )
    out = body(request)
    assert out["chat_template_kwargs"] == {"custom": 1, "enable_thinking": False}  # the reasoning switch wins
    assert out["thinking_token_budget"] == 512
    assert "chat_template_kwargs" not in body(
        ChatRequest(model="m", messages=[user("x")], reasoning=ReasoningConfig())
    )
    kwargs = ChatRequest(model="m", messages=[user("x")], chat_template_kwargs={"custom": 1})
    assert body(kwargs)["chat_template_kwargs"] == {"custom": 1}


def test_tokenize_body_uses_the_same_message_mapping() -> None:
    request = ChatRequest(model="m", messages=[user("count me")], max_tokens=5, stream=True)
    assert msgspec.json.decode(encode_tokenize(request)) == {
        "model": "m",
        "messages": [{"role": "user", "content": "count me"}],
    }


def test_tokenize_body_carries_what_shapes_the_prompt() -> None:
    """The chat template's kwargs (the reasoning switch winning) and a prefill's flags change the
    prompt vLLM renders, so they go with the count; sampling and output options do not."""
    request = ChatRequest(
        model="m", messages=[user("count me")], prefill=True, max_tokens=5, temperature=0.5,
        reasoning=ReasoningConfig(enabled=False, budget_tokens=64), chat_template_kwargs={"custom": 1},
    )  # fmt: skip
    assert msgspec.json.decode(encode_tokenize(request)) == {
        "model": "m",
        "messages": [{"role": "user", "content": "count me"}],
        "chat_template_kwargs": {"custom": 1, "enable_thinking": False},
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
