"""`/v1/completions` and `/v1/embeddings` decoding, answer bodies and the text-completion stream writer."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.openai.completions_mapping import (
    completion_body,
    decode_completion,
    decode_embeddings,
    embeddings_body,
)
from adapters.inbound.openai.text_stream import TextChunkWriter
from domain.canonical import (
    Finish,
    MessageStart,
    NativePayload,
    StreamChunk,
    StreamError,
    TextDelta,
    Usage,
    UsageReport,
)
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.errors import InvalidRequest
from domain.sampling import Sampling

LIMITS = InputLimits(max_messages=3, max_output_tokens={"m": 64})


def completion(limits: InputLimits = LIMITS, **body: Any) -> Any:
    return decode_completion(msgspec.json.encode({"model": "m", "prompt": "x", **body}), "rid", limits)


def test_every_field() -> None:
    call = completion(prompt=["def f():"], suffix="\n", max_tokens=8, temperature=0.1, top_p=0.5, stop="x", n=1,
                      best_of=1, echo=True, logprobs=2, seed=3, presence_penalty=0.4, frequency_penalty=0.6,
                      user="u", stream=True, stream_options={"include_usage": True}, unknown={"a": 1},
                      priority=-100, request_id="x", cache_salt="theirs", kv_transfer_params={})  # all dropped
    assert call.request == CompletionRequest(
        model="m", prompt=["def f():"], suffix="\n", max_tokens=8, temperature=0.1, top_p=0.5, stop=["x"], n=1,
        best_of=1, echo=True, logprobs=2, sampling=Sampling(seed=3, presence_penalty=0.4, frequency_penalty=0.6),
        user="u", stream=True, surface="openai", request_id="rid")
    assert call.include_usage
    assert completion().request.max_tokens == 64  # the upstream's cap is the default
    assert not completion(stream=True).include_usage


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 2}, "n"), ({"n": 0}, "n"), ({"best_of": 2}, "best_of"), ({"prompt": ["a"] * 4}, "prompt"),
    ({"logit_bias": {"1": -101}}, "logit_bias"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"top_k": -2}, "top_k"), ({"guided_json": 1}, "guided_json"),
    ({"prompt": []}, "prompt"), ({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": [[1, 2]]}, "prompt"),
    ({"max_tokens": 65}, "max_tokens"), ({"max_tokens": -1}, "max_tokens"), ({"logprobs": -1}, "logprobs"),
    ({"model": 1}, "model"), ({"stop": 5}, "stop"),
])
def test_completion_refusals(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        completion(**body)
    assert caught.value.param == param, caught.value.message


def test_choices_up_to_max_choices_and_several_prompts() -> None:
    four = InputLimits(max_messages=3, max_choices={"m": 4})
    request = completion(four, prompt=["a", "b"], n=2, best_of=4, top_k=5, min_p=0.1,
                         guided_choice=["x", "y"], response_format={"type": "json_object"}).request
    assert (request.prompt, request.n, request.best_of, request.top_k) == (["a", "b"], 2, 4, 5)
    assert request.sampling == Sampling(min_p=0.1, guided_choice=["x", "y"], response_format={"type": "json_object"})
    with pytest.raises(InvalidRequest) as caught:
        completion(four, n=5)
    assert caught.value.param == "n" and "at most 4 sequences" in caught.value.message


def test_token_id_prompts_and_bad_bodies() -> None:
    with pytest.raises(InvalidRequest) as caught:
        completion(prompt=[1, 2])
    assert "token-id prompts are not accepted" in caught.value.message
    for raw in (b"[]", b"{", b'{"prompt": "x"}'):
        with pytest.raises(InvalidRequest):
            decode_completion(raw)


def test_embeddings() -> None:
    request = decode_embeddings(b'{"model":"m","input":"a","dimensions":4,"encoding_format":"base64","user":"u"}')
    assert request == EmbeddingRequest(model="m", inputs=["a"], dimensions=4, encoding_format="base64", user="u",
                                       surface="openai")
    for body, param in (({"input": []}, "input"), ({"input": ["a"] * 4}, "input"), ({"input": [[1]]}, "input"),
                        ({"input": "a", "dimensions": 0}, "dimensions"),
                        ({"input": "a", "encoding_format": "int8"}, "encoding_format")):
        with pytest.raises(InvalidRequest) as caught:
            decode_embeddings(msgspec.json.encode({"model": "m", **body}), limits=LIMITS)
        assert caught.value.param == param


NATIVE = b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"up","choices":[{"index":0,"text":"ok",' \
         b'"logprobs":{"tokens":["ok"]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,' \
         b'"total_tokens":2}}'


def test_answers_are_relayed_and_renamed() -> None:
    answer = Completion(id="cmpl-1", model="up", created=1, text="ok", finish_reason="end_turn",
                        native=NativePayload(format="openai-completion", data=NATIVE))
    assert completion_body(answer, "up") == NATIVE
    renamed = msgspec.json.decode(completion_body(answer, "alias"))
    assert renamed["model"] == "alias" and renamed["choices"][0]["logprobs"] == {"tokens": ["ok"]}
    plain = msgspec.json.decode(completion_body(msgspec.structs.replace(answer, native=None,
                                                                        finish_reason="max_tokens"), "alias"))
    assert plain["choices"] == [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "length",
                                 "stop_reason": None}]
    vectors = Embeddings(model="up", vectors=[[0.6, 0.8]], usage=Usage(input_tokens=2))
    assert msgspec.json.decode(embeddings_body(vectors, "e")) == {
        "object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}], "model": "e",
        "usage": {"prompt_tokens": 2, "total_tokens": 2}}


def native(data: bytes, *events: Any) -> StreamChunk:
    return StreamChunk(events=list(events), native=NativePayload(format="openai-completion", data=data))


def test_the_stream_writer_relays_hides_usage_unless_asked_and_ends_with_done() -> None:
    start = native(b'{"model":"up","choices":[{"text":"a"}]}', MessageStart(id="c", model="up", created=1),
                   TextDelta(text="a"))
    usage = native(b'{"model":"up","choices":[],"usage":{}}', UsageReport(usage=Usage(input_tokens=1, output_tokens=1)))
    quiet = TextChunkWriter(include_usage=False, model="up", request_id="r")
    assert quiet.feed(start) == b'data: {"model":"up","choices":[{"text":"a"}]}\n\n'
    assert quiet.feed(usage) == b"" and quiet.usage == Usage(input_tokens=1, output_tokens=1)
    assert quiet.finish() == b"data: [DONE]\n\n" and quiet.finish() == b""
    alias = TextChunkWriter(include_usage=True, model="alias", request_id="r")
    assert b'"model":"alias"' in alias.feed(start) and alias.feed(usage).startswith(b"data: ")
    failed = TextChunkWriter(include_usage=True, model="up", request_id="r")
    frames = failed.feed(StreamChunk(events=[StreamError(kind="upstream-error", message="reset", status=502)]))
    assert frames.startswith(b'data: {"error":{"message":"reset"') and frames.endswith(b"data: [DONE]\n\n")
    assert failed.error is not None and failed.finish() == b""


def test_the_stream_writer_encodes_canonical_events() -> None:
    writer = TextChunkWriter(include_usage=True, model="m", request_id="r")
    frames = writer.feed(StreamChunk(events=[MessageStart(id="cmpl-9", model="m", created=5), TextDelta(text="hi"),
                                             Finish(reason="max_tokens")]))
    chunks = [msgspec.json.decode(f.removeprefix(b"data: ")) for f in frames.split(b"\n\n") if f]
    assert [c["choices"][0]["text"] for c in chunks] == ["hi", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[0]["id"] == "cmpl-9"
    assert writer.finish_reason == "max_tokens"
