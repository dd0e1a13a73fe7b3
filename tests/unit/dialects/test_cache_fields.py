"""The dialects' KV-cache fields: the affinity key each surface reads, and cached prompt tokens
in each surface's usage (canonical `Usage.cached_tokens`, from vLLM's `prompt_tokens_details`)."""

from __future__ import annotations

from typing import Any

import msgspec
from openai.types.chat import ChatCompletion
from tests.support.anthropic_grammar import check_anthropic_stream

from adapters.inbound.anthropic.answers import encode_message
from adapters.inbound.anthropic.mapping import decode_messages
from adapters.inbound.anthropic.stream import AnthropicStream
from adapters.inbound.openai.answers import encode_response
from adapters.inbound.openai.mapping import decode_request
from adapters.inbound.openai.stream import ChunkWriter
from adapters.outbound.openai_compat.chat_response import response_from_completion
from adapters.outbound.openai_compat.request_body import encode_chat
from adapters.outbound.openai_compat.stream_mapping import StreamMapper
from domain.canonical import ChatResponse, Finish, MessageStart, StreamChunk, TextPart, Usage, UsageReport

USER: Any = [{"role": "user", "content": "hi"}]


def v1(**fields: Any) -> Any:
    return decode_request(msgspec.json.encode({"model": "m", "messages": USER, **fields})).chat


def llm(**fields: Any) -> Any:
    return decode_messages(msgspec.json.encode({"model": "m", "max_tokens": 8, "messages": USER, **fields}), "r")


def test_v1_affinity_key_is_prompt_cache_key_else_user_and_is_not_forwarded() -> None:
    assert v1(prompt_cache_key="conv-7", user="alice").affinity_key == "conv-7"
    assert v1(user="alice").affinity_key == "alice"
    assert v1().affinity_key is None and v1(prompt_cache_key="", user="").affinity_key is None
    body = msgspec.json.decode(encode_chat(v1(prompt_cache_key="conv-7", user="alice")))
    assert "prompt_cache_key" not in body and body["user"] == "alice"  # a gateway field now, as user stays


def test_llm_affinity_key_is_metadata_user_id() -> None:
    assert llm(metadata={"user_id": "u-42"}).affinity_key == "u-42"
    assert llm().affinity_key is None and llm(metadata={}).affinity_key is None


VLLM_USAGE = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
              "prompt_tokens_details": {"cached_tokens": 64}}  # fmt: skip
COMPLETION = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}  # fmt: skip


def test_the_upstream_usage_carries_cached_tokens_into_canonical() -> None:
    answer = response_from_completion(msgspec.json.encode({**COMPLETION, "usage": VLLM_USAGE}))
    assert answer.usage == Usage(input_tokens=100, output_tokens=5, cached_tokens=64)
    plain = response_from_completion(msgspec.json.encode({**COMPLETION, "usage": {"prompt_tokens": 3}}))
    assert plain.usage.cached_tokens is None
    null = {**VLLM_USAGE, "prompt_tokens_details": None}
    assert response_from_completion(msgspec.json.encode({**COMPLETION, "usage": null})).usage.cached_tokens is None
    mapper = StreamMapper()
    chunk = mapper.feed(msgspec.json.encode({"id": "c", "choices": [], "usage": VLLM_USAGE}))
    assert chunk is not None
    assert UsageReport(usage=Usage(input_tokens=100, output_tokens=5, cached_tokens=64)) in chunk.events


def answer(usage: Usage) -> ChatResponse:
    return ChatResponse(id="chatcmpl-1", model="m", created=1, content=[TextPart(text="ok")], finish_reason="end_turn",
                        usage=usage)  # fmt: skip


def test_v1_encodes_cached_tokens_in_prompt_tokens_details() -> None:
    cached = ChatCompletion.model_validate_json(encode_response(answer(Usage(input_tokens=100, output_tokens=5,
                                                                            cached_tokens=64))))  # fmt: skip
    assert cached.usage is not None and cached.usage.prompt_tokens == 100
    assert cached.usage.prompt_tokens_details is not None and cached.usage.prompt_tokens_details.cached_tokens == 64
    plain = msgspec.json.decode(encode_response(answer(Usage(input_tokens=3, output_tokens=1))))
    assert "prompt_tokens_details" not in plain["usage"]
    writer = ChunkWriter(include_usage=True, model="m", request_id="r")  # canonical events, not relayed
    usage = Usage(input_tokens=9, output_tokens=1, cached_tokens=8)
    frame = writer.feed(StreamChunk(events=[UsageReport(usage=usage)]))
    assert b'"prompt_tokens_details":{"cached_tokens":8}' in frame


def test_llm_reports_cache_reads_and_the_uncached_rest_as_input_tokens() -> None:
    body = msgspec.json.decode(encode_message(answer(Usage(input_tokens=100, output_tokens=5, cached_tokens=64)), "m"))
    assert body["usage"] == {"input_tokens": 36, "output_tokens": 5, "cache_read_input_tokens": 64}
    plain = msgspec.json.decode(encode_message(answer(Usage(input_tokens=3, output_tokens=1)), "m"))
    assert plain["usage"] == {"input_tokens": 3, "output_tokens": 1}
    odd = msgspec.json.decode(encode_message(answer(Usage(input_tokens=3, output_tokens=1, cached_tokens=9)), "m"))
    assert odd["usage"] == {"input_tokens": 0, "output_tokens": 1, "cache_read_input_tokens": 3}  # never negative


def test_llm_stream_usage_carries_cache_reads_at_start_and_in_the_message_delta() -> None:
    machine = AnthropicStream("m")
    frames = machine.feed_many([
        UsageReport(usage=Usage(input_tokens=100, output_tokens=0, cached_tokens=64)),
        MessageStart(id="chatcmpl-1", model="m", created=1),
        Finish(reason="end_turn"),
        UsageReport(usage=Usage(input_tokens=100, output_tokens=5, cached_tokens=64)),
    ]) + machine.finish()  # fmt: skip
    events = check_anthropic_stream(frames)
    assert events[0].data["message"]["usage"] == {"input_tokens": 36, "output_tokens": 0, "cache_read_input_tokens": 64}
    assert events[-2].data["usage"] == {"input_tokens": 36, "output_tokens": 5, "cache_read_input_tokens": 64}


def test_responses_affinity_key_is_prompt_cache_key_else_user() -> None:
    from adapters.inbound.responses.mapping import decode_request as decode_responses

    def responses(**fields: Any) -> Any:
        return decode_responses(msgspec.json.encode({"model": "m", "input": "hi", **fields})).chat

    assert responses(prompt_cache_key="codex-session", user="alice").affinity_key == "codex-session"
    assert responses(user="alice").affinity_key == "alice"
    assert responses().affinity_key is None
