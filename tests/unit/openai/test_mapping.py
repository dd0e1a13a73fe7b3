"""OpenAI wire <-> canonical: decoding, the allowlist (nothing else is forwarded), responses, problem documents."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import Model
from openai.types.chat import ChatCompletion

from adapters.inbound._shared.errors import InternalError
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.openai.answers import encode_models, encode_response
from adapters.inbound.openai.errors import ProblemRenderer
from adapters.inbound.openai.mapping import decode_request
from adapters.outbound.openai_compat.request_body import encode_chat
from domain.canonical import (
    ChatResponse,
    ImagePart,
    Message,
    NativePayload,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolResultPart,
    ToolSpec,
    ToolUsePart,
    Usage,
)
from domain.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    QueueFull,
    QueueTimeout,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
)
from domain.sampling import Sampling

enc = msgspec.json.encode
dec = msgspec.json.decode


def decode(body: dict[str, Any], request_id: str = "rid") -> Any:
    return decode_request(enc(body), request_id)


def req(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [], **fields}


# --- requests ------------------------------------------------------------------------


def test_minimal_request_like_the_seeds_is_valid() -> None:
    decoded = decode({"model": "reasoning", "messages": []})
    chat = decoded.chat
    assert (chat.model, chat.messages, chat.stream) == ("reasoning", [], False)
    assert (chat.surface, chat.request_id, chat.sampling, chat.n) == ("openai", "rid", Sampling(), 1)
    assert decoded.include_usage is False


def test_every_named_field_is_decoded() -> None:
    schema = {"type": "object", "properties": {}}
    tool = {"type": "function", "function": {"name": "f", "description": "F", "parameters": schema}}
    chat = decode(
        req(max_tokens=10, temperature=0.5, top_p=0.9, top_k=40, stop="END", stream=True, tools=[tool],
            tool_choice="required", parallel_tool_calls=False, user="u-1")
    ).chat  # fmt: skip
    assert chat.max_tokens == 10 and chat.temperature == 0.5 and chat.top_p == 0.9 and chat.top_k == 40
    assert chat.stop == ["END"] and chat.stream is True and chat.user == "u-1"
    assert chat.tools == [ToolSpec(name="f", description="F", parameters=schema)]
    assert chat.tool_choice == ToolChoice(mode="required", parallel=False)
    assert chat.parallel_tool_calls is None  # the tool choice carries it


def test_max_completion_tokens_wins_and_stop_lists_and_named_tool_choice() -> None:
    named = {"type": "function", "function": {"name": "f"}}
    chat = decode(
        req(max_tokens=5, max_completion_tokens=7, stop=["a", "b"], tool_choice=named, temperature=1)
    ).chat
    assert chat.max_tokens == 7 and chat.stop == ["a", "b"] and chat.temperature == 1.0
    assert chat.tool_choice == ToolChoice(mode="named", name="f")


@pytest.mark.parametrize(
    ("options", "include"),
    [(None, False), ({}, True), ({"include_usage": True}, True), ({"include_usage": False}, False),
     ({"include_usage": None}, False)],
)  # fmt: skip
def test_include_usage_follows_vllm(options: dict[str, Any] | None, include: bool) -> None:
    body = req(stream=True) if options is None else req(stream=True, stream_options=options)
    decoded = decode(body)
    assert decoded.include_usage is include
    assert decoded.chat.continuous_usage_stats is None


def test_continuous_usage_stats_is_the_one_stream_option_handed_on() -> None:
    chat = decode(req(stream=True, stream_options={"include_usage": False, "continuous_usage_stats": True})).chat
    assert chat.continuous_usage_stats is True


ALLOWED: dict[str, Any] = dec(
    b'{"n": 2, "best_of": 3, "seed": 7, "logprobs": true, "top_logprobs": 3, "presence_penalty": 0.5,'
    b' "frequency_penalty": -0.25, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},'
    b' "min_p": 0.05, "repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": false},'
    b' "reasoning_effort": "low", "logit_bias": {"50256": -100}, "structured_outputs": {"regex": "a+"},'
    b' "guided_json": {"type": "object"}, "guided_choice": ["yes", "no"], "guided_regex": "[0-9]+",'
    b' "thinking_token_budget": 64}'
)
# What a client must never have forwarded (SECURITY.md), and members nobody models.
NEVER: dict[str, Any] = {"priority": -100, "request_id": "engine-id", "kv_transfer_params": {"do_remote_decode": True},
                         "chat_template": "{{ secrets }}", "cache_salt": "theirs", "ignore_eos": True,
                         "metadata": None, "min_tokens": 4000, "vllm_xargs": {"a": 1}}
THREE = InputLimits(max_choices={"m": 3})


def test_allowlisted_members_are_decoded_and_forwarded() -> None:
    chat = decode_request(enc(req(**ALLOWED)), "rid", THREE).chat
    assert (chat.n, chat.best_of, chat.logprobs, chat.top_logprobs) == (2, 3, True, 3)
    assert chat.reasoning == ReasoningConfig(effort="low", budget_tokens=64)
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    body = dec(encode_chat(chat))
    for name, value in ALLOWED.items():
        if name not in ("reasoning_effort", "thinking_token_budget"):
            assert body[name] == value, name
    assert (body["reasoning_effort"], body["thinking_token_budget"]) == ("low", 64)


def test_members_the_gateway_does_not_model_are_dropped() -> None:
    chat = decode(req(**NEVER, messages=[{"role": "user", "content": "hi"}])).chat
    body = dec(encode_chat(chat))
    assert set(body) == {"model", "messages"}, body


def test_parallel_tool_calls_without_tool_choice_goes_with_the_tools() -> None:
    chat = decode(req(parallel_tool_calls=False)).chat
    assert chat.tool_choice is None and chat.parallel_tool_calls is False
    assert "parallel_tool_calls" not in dec(encode_chat(chat))  # no tools: nothing to say it about
    tools = [ToolSpec(name="f")]
    assert dec(encode_chat(msgspec.structs.replace(chat, tools=tools)))["parallel_tool_calls"] is False


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 2}, "n"), ({"best_of": 2}, "best_of"), ({"n": 0}, "n"), ({"n": 64, "best_of": 64}, "n"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"), ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"a": 1}}, "logit_bias"), ({"top_logprobs": 21}, "top_logprobs"), ({"min_p": 2}, "min_p"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"seed": 2**64}, "seed"), ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a" * 4097}, "guided_regex"), ({"response_format": [1]}, "response_format"),
    ({"structured_outputs": {"json": {"a": "x" * 70000}}}, "structured_outputs"),
    ({"chat_template_kwargs": {str(i): 1 for i in range(33)}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"a": "x" * 17000}}, "chat_template_kwargs"),
    ({"reasoning_effort": "max"}, "reasoning_effort"),
])  # fmt: skip
def test_allowlisted_members_are_bounded(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode(req(**fields))
    assert caught.value.param == param, caught.value.message


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=12).map(lambda k: "x_" + k), _json, max_size=5))
def test_unknown_members_never_reach_the_upstream_whatever_their_value(extras: dict[str, Any]) -> None:
    chat = decode(req(**extras)).chat
    assert set(dec(encode_chat(chat))) == {"model", "messages"}


def test_roles_parts_and_tool_turns() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": None, "reasoning": "hmm", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "ok"},
    ]
    assert decode(req(messages=messages)).chat.messages == [
        Message(role="system", content=[TextPart(text="be brief")]),
        Message(role="system", content=[TextPart(text="sys")]),
        Message(role="user", name="ann",
                content=[TextPart(text="look"), ImagePart(url="data:image/png;base64,AAAA", detail="low")]),
        Message(role="assistant", content=[ThinkingPart(text="hmm"),
                                           ToolUsePart(id="c1", name="f", arguments='{"a":1}'),
                                           ToolUsePart(id="c2", name="g", arguments="{}")]),
        Message(role="user", content=[  # consecutive tool messages: one user turn
            ToolResultPart(tool_use_id="c1", content=[TextPart(text="one")]),
            ToolResultPart(tool_use_id="c2", content=[TextPart(text="two")])]),
        Message(role="user", content=[TextPart(text="thanks")]),
        Message(role="assistant", content=[TextPart(text="ok")]),
    ]  # fmt: skip


def _msg(message: str) -> bytes:
    return b'{"model": "m", "messages": [%s]}' % message.encode()


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"messages": []}', "model", "Missing required field `model`"),
        (b'{"model": 3, "messages": []}', "model", "Expected `str`"),
        (b'{"model": "m"}', "messages", "messages"),
        (_msg('{"role": "user", "content": 5}'), "messages[0].content", "messages[0].content"),
        (_msg('{"role": "user", "content": [{"type": "input_audio"}]}'), "messages[0].content[0].type",
         "input_audio"),
        (_msg('{"role": "wizard", "content": "x"}'), "messages[0].role", "wizard"),
        (_msg('{"content": "x"}'), "messages[0].role", "role"),
        (_msg('{"role": "tool", "content": "x"}'), "messages[0].tool_call_id", "tool_call_id"),
        (b'{"model": "m", "messages": [], "temperature": "hot"}', "temperature", "temperature"),
        (b'{"model": "m", "messages": [], "stop": 3}', "stop", "stop"),
        (b'{"model": "m", "messages": [], "tools": [{"type": "custom"}]}', "tools[0].type", "custom"),
        (b'{"model": "m", "messages": [], "tool_choice": "sometimes"}', "tool_choice", "sometimes"),
        (b'{"model": "m", "messages": [], "stream": "yes"}', "stream", "stream"),
    ],
)  # fmt: skip
def test_invalid_requests_name_the_field(body: bytes, param: str | None, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_request(body, "rid")
    assert info.value.param == param
    assert words in info.value.message


# --- responses -----------------------------------------------------------------------


def response(**fields: Any) -> ChatResponse:
    return ChatResponse(**{"id": "c", "model": "m", "created": 1, "content": [], "finish_reason": "end_turn",
                           **fields})  # fmt: skip


def test_canonical_response_encodes_as_a_chat_completion() -> None:
    parts = [ThinkingPart(text="think"), TextPart(text="Hel"), TextPart(text="lo")]
    usage = Usage(input_tokens=3, output_tokens=4)
    body = dec(encode_response(response(content=parts, finish_reason="stop_sequence", stop_sequence="END",
                                        usage=usage)))  # fmt: skip
    completion = ChatCompletion.model_validate(body)
    assert completion.object == "chat.completion" and completion.id == "c"
    choice = completion.choices[0]
    assert choice.message.content == "Hello" and choice.finish_reason == "stop"
    assert body["choices"][0]["message"]["reasoning"] == "think"
    assert body["choices"][0]["stop_reason"] == "END"
    assert completion.usage is not None and completion.usage.total_tokens == 7


def test_tool_calls_encode_with_null_content_and_tool_calls_reason() -> None:
    parts = [ToolUsePart(id="call_1", name="f", arguments='{"x":1}')]
    completion = ChatCompletion.model_validate(dec(encode_response(response(content=parts))))
    message = completion.choices[0].message
    assert message.content is None and completion.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "f", '{"x":1}')  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("content_filter", "content_filter")],
)
def test_finish_reasons(reason: Any, expected: str) -> None:
    other = NativePayload(format="other", data=b"{}")  # another dialect's bytes are never relayed
    body = encode_response(response(finish_reason=reason, native=other))
    assert dec(body)["choices"][0]["finish_reason"] == expected


def test_model_list() -> None:
    body = dec(encode_models(["reasoning", "qwen2.5:3b-instruct"], 42))
    assert body["object"] == "list"
    assert [Model.model_validate(card).id for card in body["data"]] == ["reasoning", "qwen2.5:3b-instruct"]
    assert body["data"][0] == {"id": "reasoning", "object": "model", "created": 42, "owned_by": "gateway"}


# --- problem documents -----------------------------------------------------------------

CLIENT, SERVER = "invalid_request_error", "server_error"


@pytest.mark.parametrize(
    ("error", "status", "kind", "error_type", "retry_after"),
    [
        (InvalidRequest("bad", param="messages[0].role"), 400, "invalid-request", CLIENT, None),
        (ModelNotFound("gpt-9"), 404, "model-not-found", CLIENT, None),
        (PayloadTooLarge("too big"), 413, "payload-too-large", CLIENT, None),
        (UpstreamUnavailable("refused"), 502, "upstream-unavailable", SERVER, None),
        (UpstreamError("upstream 500"), 502, "upstream-error", SERVER, None),
        (UpstreamRejected(422, "context too long"), 422, "upstream-rejected", CLIENT, None),
        (QueueFull(retry_after=3), 503, "queue-full", SERVER, b"3"),
        (QueueTimeout(retry_after=2), 503, "queue-timeout", SERVER, b"2"),
        (InternalError(), 500, "internal", SERVER, None),
    ],
)
def test_problem_documents(
    error: GatewayError, status: int, kind: str, error_type: str, retry_after: bytes | None
) -> None:
    code, body, content_type, headers = ProblemRenderer().render(error, "req-1")
    doc = dec(body)
    assert code == status and content_type == b"application/problem+json"
    assert doc["type"] == f"https://api.riotpiao.com/problems/{kind}"
    assert doc["status"] == status and doc["title"] == error.title and doc["detail"] == error.message
    assert doc["instance"] == "urn:request:req-1"
    param = getattr(error, "param", None)
    assert doc["error"] == {"message": error.message, "type": error_type, "param": param, "code": kind}
    assert dict(headers).get(b"retry-after") == retry_after


def test_context_length_carries_openais_code_and_param() -> None:
    text = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (...)"
    error = ContextLengthExceeded(text, prompt_tokens=8000, max_tokens=1000, limit=8192)
    code, body, _, _ = ProblemRenderer().render(error, "req-1")
    doc = dec(body)
    assert code == 400 and doc["status"] == 400
    assert doc["type"] == "https://api.riotpiao.com/problems/context-length-exceeded"
    assert doc["error"] == {"message": text, "type": CLIENT, "param": "messages", "code": "context_length_exceeded"}


def test_internal_error_reveals_nothing() -> None:
    doc = dec(ProblemRenderer().render(InternalError(), "r")[1])
    assert "Traceback" not in doc["detail"] and "request id" in doc["detail"]


def test_stream_error_frame_then_done() -> None:
    frame = ProblemRenderer().stream_error(UpstreamError("reset"), "r")
    first, second, rest = frame.split(b"\n\n")
    error = {"message": "reset", "type": "server_error", "param": None, "code": "upstream-error"}
    assert dec(first.removeprefix(b"data: ")) == {"error": error}
    assert second == b"data: [DONE]" and rest == b""
