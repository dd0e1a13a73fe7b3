"""Deterministic answer building of the stub upstream (pure functions, no sockets)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stub.answers import WORDS, build_answer
from stub.chat_wire import completion_body, stream_frames
from stub.schema import CHAT_DECODER, ChatRequest, Tool, context_refusal, error_body, tokenize_body
from stub.tools import example_value, pick_tool, split_arguments, tool_arguments

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields: object) -> ChatRequest:
    return CHAT_DECODER.decode(msgspec.json.encode({"model": "m", "messages": [], **fields}))


def user(content: object) -> list[dict[str, object]]:
    return [{"role": "user", "content": content}]


def named(tool: Tool | None) -> str | None:
    return tool.function.name if tool else None


def sse_chunks(frames: list[bytes]) -> list[dict[str, Any]]:
    assert frames[-1] == b"data: [DONE]\n\n"
    assert all(f.startswith(b"data: ") and f.endswith(b"\n\n") for f in frames)
    return [msgspec.json.decode(f[6:-2]) for f in frames[:-1]]


def test_default_text_is_the_word_list() -> None:
    answer = build_answer(chat(), tokens=4, reasoning=False)
    assert "".join(answer.content) == "alpha bravo charlie delta"
    assert (answer.finish_reason, answer.stop_reason, answer.completion_tokens) == ("stop", None, 4)


def test_text_cycles_over_the_words() -> None:
    answer = build_answer(chat(), tokens=18, reasoning=False)
    assert answer.content[16:] == (" " + WORDS[0], " " + WORDS[1])


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_below_tokens_gives_length(field: str) -> None:
    answer = build_answer(chat(**{field: 3}), tokens=16, reasoning=False)
    assert "".join(answer.content) == "alpha bravo charlie"
    assert answer.finish_reason == "length"


def test_max_tokens_not_below_tokens_gives_stop() -> None:
    assert build_answer(chat(max_tokens=16), tokens=16, reasoning=False).finish_reason == "stop"


def test_stop_string_cuts_before_the_match() -> None:
    answer = build_answer(chat(stop=["zulu", "echo"]), tokens=16, reasoning=False)
    assert "".join(answer.content) == "alpha bravo charlie delta "
    assert (answer.finish_reason, answer.stop_reason) == ("stop", "echo")


def test_stop_string_mid_piece_and_as_plain_string() -> None:
    answer = build_answer(chat(stop="avo"), tokens=16, reasoning=False)
    assert answer.content == ("alpha", " br")
    assert answer.stop_reason == "avo"


def test_stop_string_beyond_length_limit_is_not_matched() -> None:
    answer = build_answer(chat(stop=["echo"], max_tokens=2), tokens=16, reasoning=False)
    assert (answer.finish_reason, answer.stop_reason) == ("length", None)


def test_reasoning_counts_in_completion_tokens_only_when_enabled() -> None:
    answer = build_answer(chat(), tokens=4, reasoning=True)
    assert "".join(answer.reasoning) == "Let me think about this."
    assert answer.completion_tokens == 4 + len(answer.reasoning) + 1  # and the end of thinking, as vLLM
    assert build_answer(chat(), tokens=4, reasoning=False).completion_tokens == 4


@pytest.mark.parametrize(("budget", "thought"), [(None, "Let me think about this."), (-1, "Let me think about this."),
                                                 (2, "Let me"), (0, ""), (99, "Let me think about this.")])
def test_a_thinking_budget_keeps_that_many_reasoning_tokens(budget: int | None, thought: str) -> None:
    answer = build_answer(chat(thinking_token_budget=budget), tokens=4, reasoning=True)
    assert "".join(answer.reasoning) == thought and answer.completion_tokens == 4 + len(answer.reasoning) + 1


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "x"),
        ({"type": "integer"}, 1),
        ({"type": "number"}, 1.5),
        ({"type": "boolean"}, True),
        ({"type": "array", "items": {"type": "string"}}, []),
        ({"enum": ["c", "f"]}, "c"),
        ({"type": ["null", "integer"]}, 1),
        ({"anyOf": [{"type": "boolean"}, {"type": "string"}]}, True),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
                "required": ["a", "z"],
            },
            {"a": {"b": 1}, "z": "x"},
        ),
        ({}, "x"),
    ],
)
def test_example_value_follows_the_schema(schema: dict[str, Any], expected: object) -> None:
    assert example_value(schema) == expected


def test_forced_required_calls_the_first_tool() -> None:
    req = chat(tools=[TIME, WEATHER], tool_choice="required")
    assert named(pick_tool(req)) == "get_time"


def test_forced_named_function() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answer = build_answer(chat(tools=[TIME, WEATHER], tool_choice=choice), 16, False)
    assert answer.tool == "get_weather"
    assert answer.finish_reason == "tool_calls"
    assert msgspec.json.decode(answer.arguments) == {"city": "x", "unit": "c"}


@pytest.mark.parametrize(
    "content",
    [
        "use get_weather for Paris",
        "  Use get_weather",
        [
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "use get_weather"},
        ],
    ],
)
def test_use_name_at_start_of_last_user_text_calls_the_tool(content: object) -> None:
    assert named(pick_tool(chat(tools=[TIME, WEATHER], messages=user(content)))) == "get_weather"


@pytest.mark.parametrize(
    "content",
    [
        "please use get_weather for Paris",
        "get_weather is a tool; use it",
        "use get_weathers",
        "use unknown_tool",
    ],
)
def test_tool_names_elsewhere_do_not_trigger(content: object) -> None:
    assert pick_tool(chat(tools=[TIME, WEATHER], messages=user(content))) is None


def test_after_a_tool_result_the_answer_is_text() -> None:
    messages = [
        *user("use get_weather"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ]
    answer = build_answer(chat(tools=[WEATHER], messages=messages), 16, False)
    assert answer.tool is None
    assert answer.finish_reason == "stop"


def test_tool_choice_none_wins_over_use_name() -> None:
    req = chat(tools=[WEATHER], tool_choice="none", messages=user("use get_weather"))
    assert pick_tool(req) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": "required"},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [WEATHER], "tool_choice": "sometimes"},
    ],
)
def test_invalid_tool_choice_is_a_value_error(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        build_answer(chat(**fields), 16, False)


def test_split_arguments_gives_two_or_more_fragments() -> None:
    assert split_arguments("{}") == ["{", "}"]
    text = '{"city":"x","unit":"c"}'
    assert len(split_arguments(text)) == 3
    assert "".join(split_arguments(text)) == text


@pytest.mark.parametrize(
    ("parameters", "arguments"),
    [
        ({"const": 4120000000000.0}, "4120000000000.0"),  # what vLLM 0.32 answered a named tool_choice with
        ({"const": False}, "false"),
        ({"type": "array", "const": [1, 2]}, "[1,2]"),
        ({"type": "object", "x-stub-arguments": "city=Paris"}, "city=Paris"),
        ({"x-stub-arguments": ""}, ""),
        (None, '"x"'),
    ],
)
def test_tool_arguments_follow_the_schema_or_come_verbatim(parameters: Any, arguments: str) -> None:
    assert tool_arguments(parameters) == arguments


def test_arguments_that_are_not_an_object_stream_in_fragments() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"const": 4120000000000.0}}}
    answer = build_answer(chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}), 16, False)
    chunks = sse_chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "call", include_usage=False))
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[2:-1]]
    assert len(pieces) == 3 and "".join(pieces) == "4120000000000.0"
    body = msgspec.json.decode(completion_body(answer, "chatcmpl-1", 7, "m", "call"))
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "4120000000000.0"


def test_max_tokens_cuts_a_call_mid_arguments_with_length() -> None:
    whole = build_answer(chat(tools=[WEATHER], tool_choice="required"), 16, False)
    cut = build_answer(chat(tools=[WEATHER], tool_choice="required", max_tokens=1), 16, False)
    assert (whole.finish_reason, cut.finish_reason) == ("tool_calls", "length")
    assert cut.arguments == split_arguments(whole.arguments)[0] and cut.completion_tokens == 1
    roomy = build_answer(chat(tools=[WEATHER], tool_choice="required", max_tokens=3), 16, False)
    assert (roomy.arguments, roomy.finish_reason) == (whole.arguments, "tool_calls")


def test_completion_body_shape() -> None:
    answer = build_answer(chat(messages=user("hi there")), tokens=2, reasoning=True)
    body = msgspec.json.decode(completion_body(answer, "chatcmpl-1", 7, "m", "t"))
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["content"] == "alpha bravo"
    assert message["reasoning"] == "Let me think about this."
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}  # 5 + </think> + 2


def test_stream_frames_order_and_usage() -> None:
    answer = build_answer(chat(), tokens=3, reasoning=True)
    chunks = sse_chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "t", include_usage=True))
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [d.get("reasoning") for d in deltas[1:6]] == ["Let", " me", " think", " about", " this."]
    assert [d.get("content") for d in deltas[6:9]] == ["alpha", " bravo", " charlie"]
    assert deltas[9] == {}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 9  # 5 reasoning + </think> + 3 content
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}


def test_stream_frames_tool_call_and_no_usage() -> None:
    answer = build_answer(chat(tools=[WEATHER], tool_choice="required"), 16, False)
    chunks = sse_chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "call", include_usage=False))
    first = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert first == {
        "index": 0,
        "id": "call",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[2:-1]]
    assert len(pieces) >= 2
    assert msgspec.json.decode("".join(pieces)) == {"city": "x", "unit": "c"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_error_body_is_vllm_nested_shape() -> None:
    assert msgspec.json.decode(error_body(500, "boom")) == {
        "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
    }


def test_tokenize_counts_whitespace_words_deterministically() -> None:
    one = msgspec.json.decode(tokenize_body(b'{"model":"m","prompt":"a b  c"}'))
    two = msgspec.json.decode(tokenize_body(b'{"model":"m","messages":[{"role":"user","content":"a b c"}]}'))
    assert one == two
    assert one["count"] == 3 and len(one["tokens"]) == 3 and one["max_model_len"] == 8192
    with pytest.raises(ValueError):
        tokenize_body(b'{"model":"m"}')


def test_max_tokens_over_the_room_left_is_shortened_to_fit() -> None:
    """vLLM 0.32: a prompt that fits with too large a max_tokens is answered, not refused."""
    answer = build_answer(chat(messages=user("a b c d e f"), max_tokens=500), 16, False, max_model_len=10)
    assert (answer.prompt_tokens, answer.completion_tokens, answer.finish_reason) == (6, 4, "length")
    roomy = build_answer(chat(messages=user("a b c"), max_tokens=500), 16, False, max_model_len=100)
    assert (roomy.completion_tokens, roomy.finish_reason) == (16, "stop")


def test_the_context_refusal_counts_only_to_the_limit_plus_one() -> None:
    message, param = context_refusal(3672, 64, 2048)
    assert param == "input_tokens"
    assert "your prompt contains at least 2049 input tokens, for a total of at least 2113 tokens" in message
    assert message.endswith("(parameter=input_tokens, value=2049)")
    assert context_refusal(9000, None, 2048)[0].startswith(
        "This model's maximum context length is 2048 tokens. However, you requested 0 output tokens"
    )
    exact, none = context_refusal(2048, 64, 2048)
    assert none is None and exact.startswith("The decoder prompt (length 2048) plus")
    assert msgspec.json.decode(error_body(400, message, param))["error"]["param"] == "input_tokens"
