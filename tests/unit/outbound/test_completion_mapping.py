"""vLLM text completions and embeddings <-> canonical: allowlisted bodies, answers, the stream mapper."""

from __future__ import annotations

import msgspec
import pytest

from adapters.outbound.openai_compat.completion_body import encode_completion, encode_embeddings
from adapters.outbound.openai_compat.completion_mapping import (
    TextStreamMapper,
    completion_from_body,
    embeddings_from_body,
)
from domain.canonical import Finish, MessageStart, StreamError, TextDelta, Usage, UsageReport
from domain.completions import CompletionRequest, EmbeddingRequest
from domain.errors import UpstreamError, UpstreamProtocolError
from domain.sampling import Sampling


def test_the_completion_body_is_built_from_modelled_fields_only() -> None:
    assert msgspec.json.decode(encode_completion(CompletionRequest(model="m", prompt=["x"]))) == {
        "model": "m", "prompt": "x"}
    full = CompletionRequest(model="m", prompt=["x"], suffix="y", max_tokens=3, temperature=0.5, stop=["s"],
                             echo=True, logprobs=1, sampling=Sampling(seed=2, logit_bias={"7": -1.0}), user="u",
                             stream=True, surface="openai", request_id="r", n=2, best_of=3, top_k=4,
                             cache_salt="salt")
    assert msgspec.json.decode(encode_completion(full)) == {
        "model": "m", "prompt": "x", "suffix": "y", "max_tokens": 3, "temperature": 0.5, "logprobs": 1, "seed": 2,
        "logit_bias": {"7": -1.0}, "n": 2, "best_of": 3, "top_k": 4, "cache_salt": "salt",
        "user": "u", "stop": ["s"], "echo": True, "stream": True, "stream_options": {"include_usage": True}}
    assert msgspec.json.decode(encode_embeddings(EmbeddingRequest(model="m", inputs=["a", "b"], dimensions=4,
                                                                  surface="openai"))) == {
        "model": "m", "input": ["a", "b"], "dimensions": 4}
    salted = EmbeddingRequest(model="m", inputs=["a"], cache_salt="salt")
    assert msgspec.json.decode(encode_embeddings(salted))["cache_salt"] == "salt"


def test_answers() -> None:
    raw = (b'{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":"ab",'
           b'"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2}}')
    answer = completion_from_body(raw)
    assert (answer.text, answer.finish_reason, answer.usage) == ("ab", "max_tokens", Usage(input_tokens=3,
                                                                                            output_tokens=2))
    assert answer.native is not None and answer.native.data == raw
    with pytest.raises(UpstreamProtocolError):
        completion_from_body(b'{"choices":[]}')
    with pytest.raises(UpstreamError):
        completion_from_body(b'{"error":{"message":"nope","code":500}}')
    vectors = embeddings_from_body(b'{"model":"e","data":[{"index":1,"embedding":[2.0]},'
                                   b'{"index":0,"embedding":"AAA="}],"usage":{"prompt_tokens":4,"total_tokens":4}}')
    assert vectors.vectors == ["AAA=", [2.0]] and vectors.usage.input_tokens == 4


def payloads(mapper: TextStreamMapper, *data: bytes) -> list[object]:
    events: list[object] = []
    for payload in data:
        chunk = mapper.feed(payload)
        if chunk is not None:
            events += chunk.events
    return events


HEAD = b'{"id":"cmpl-1","created":1,"model":"m","choices":[{"index":0,"text":%s,"finish_reason":%s}]}'


def test_a_streamed_completion() -> None:
    mapper = TextStreamMapper()
    events = payloads(mapper, HEAD % (b'"a"', b"null"), HEAD % (b'" b"', b"null"), HEAD % (b'""', b'"stop"'),
                      b'{"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}', b"[DONE]")
    assert events == [MessageStart(id="cmpl-1", model="m", created=1), TextDelta(text="a"), TextDelta(text=" b"),
                      Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=1, output_tokens=2))]
    assert mapper.ended and mapper.feed(HEAD % (b'"late"', b"null")) is None


def test_a_stream_that_stops_short_or_fails_ends_in_an_error() -> None:
    short = TextStreamMapper()
    events = payloads(short, HEAD % (b'"a"', b"null"), b"[DONE]")
    assert isinstance(events[-1], StreamError) and events[-1].kind == "upstream-protocol-error"
    eof = TextStreamMapper()
    payloads(eof, HEAD % (b'"a"', b"null"))
    closed = eof.close()
    assert closed is not None and isinstance(closed.events[0], StreamError)
    failing = TextStreamMapper()
    chunk = failing.feed(b'{"error":{"message":"engine dead","code":503}}')
    assert chunk is not None and chunk.events == [StreamError(kind="upstream-error", message="engine dead",
                                                              status=503)]
    assert chunk.native is not None
    bad = TextStreamMapper()
    assert isinstance(payloads(bad, b"{nope")[0], StreamError)
    finished = TextStreamMapper()
    payloads(finished, HEAD % (b'"a"', b'"length"'))
    assert finished.fail(UpstreamError("reset")) is None  # after the finish, a reset is no failure
