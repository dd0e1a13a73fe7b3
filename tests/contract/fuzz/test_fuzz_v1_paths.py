"""Hostile `/v1/responses`, `/v1/completions` and `/v1/embeddings` bodies against a real gateway:
every answer is a success (a Responses stream obeying the grammar, a text stream ending in
`[DONE]`) or a 4xx problem document; never a 5xx, never a dropped connection. Fixed seed and
budget (CI)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.contract.fuzz.edge import CAPPED_OUTPUT, Edge, check_openai
from tests.contract.fuzz.strategies import MODELS, SCHEMAS, TEXT, encode, field, optional
from tests.support.responses_grammar import check_responses_stream

FUZZ = settings(
    max_examples=150, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
STATUSES: list[int] = []  # of the Responses examples: the fuzzing must reach answers too
TOKENS = field(st.integers(1, CAPPED_OUTPUT), odd=[0, -1, CAPPED_OUTPUT + 1, 2**31, 2**64])


@st.composite
def responses_item(draw: Callable[..., Any]) -> Any:
    kind = draw(field(st.sampled_from(["message", "message", "function_call", "function_call_output", "reasoning",
                                       None]), odd=["item_reference", "web_search_call", ""]))
    if kind in ("message", None):
        part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": TEXT})
        image = st.fixed_dictionaries({"type": st.just("input_image"), "image_url": TEXT})
        item: dict[str, Any] = {"role": draw(field(st.sampled_from(["user", "assistant", "system", "developer"]),
                                                   odd=["tool", ""])),
                                "content": draw(field(TEXT | st.lists(field(part | image), max_size=6)))}
        if kind:
            item["type"] = kind
        return item
    if kind == "function_call":
        return {"type": kind, "call_id": draw(field(TEXT)), "name": "f", "arguments": draw(field(TEXT)),
                "namespace": draw(field(st.none() | st.just("ns")))}
    if kind == "function_call_output":
        return {"type": kind, "call_id": draw(field(TEXT)), "output": draw(field(TEXT))}
    if kind == "reasoning":
        return {"type": kind, "summary": draw(field(st.lists(st.fixed_dictionaries(
            {"type": st.just("summary_text"), "text": TEXT}), max_size=2)))}
    return {"type": kind, "id": draw(TEXT)}


@st.composite
def responses_body(draw: Callable[..., Any]) -> bytes:
    body: dict[str, Any] = {"model": draw(field(MODELS, 30)),
                            "input": draw(field(TEXT | st.lists(field(responses_item()), max_size=6), 30))}
    optional(draw, body, "instructions", TEXT)
    optional(draw, body, "max_output_tokens", TOKENS)
    optional(draw, body, "stream", st.booleans())
    optional(draw, body, "reasoning", st.fixed_dictionaries({"effort": st.sampled_from(["none", "low", "high"])}))
    optional(draw, body, "text", st.just({"format": {"type": "json_object"}}))
    optional(draw, body, "metadata", st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3))
    optional(draw, body, "store", st.booleans())
    optional(draw, body, "include", st.lists(TEXT, max_size=2))
    if draw(st.booleans()):
        function = {"type": "function", "name": "f", "parameters": draw(field(SCHEMAS))}
        group = {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}
        tools = st.sampled_from([function, group, {"type": "web_search"}, {"type": "custom", "name": "c"}])
        body["tools"] = draw(field(st.lists(field(tools), max_size=3)))
        optional(draw, body, "tool_choice", st.sampled_from(
            ["auto", "none", "required", {"type": "function", "name": "f"}, {"type": "file_search"},
             {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}]))
        optional(draw, body, "parallel_tool_calls", st.booleans())
    return encode(body)


@st.composite
def completion_body(draw: Callable[..., Any]) -> bytes:
    body: dict[str, Any] = {"model": draw(field(MODELS, 30)),
                            "prompt": draw(field(TEXT | st.lists(TEXT, max_size=2), 20))}
    optional(draw, body, "suffix", TEXT)
    optional(draw, body, "max_tokens", TOKENS)
    optional(draw, body, "stream", st.booleans())
    optional(draw, body, "stream_options", st.fixed_dictionaries({"include_usage": st.booleans()}))
    optional(draw, body, "n", st.integers(0, 3))
    optional(draw, body, "echo", st.booleans())
    optional(draw, body, "logprobs", st.integers(-1, 5))
    optional(draw, body, "stop", TEXT | st.lists(TEXT, max_size=2))
    return encode(body)


@st.composite
def embedding_body(draw: Callable[..., Any]) -> bytes:
    body: dict[str, Any] = {"model": draw(field(MODELS, 30)),
                            "input": draw(field(TEXT | st.lists(TEXT, max_size=4), 20))}
    optional(draw, body, "dimensions", st.integers(-1, 64))
    optional(draw, body, "encoding_format", st.sampled_from(["float", "base64", "int8"]))
    return encode(body)


@FUZZ
@given(body=responses_body())
def test_hostile_responses_bodies(edge: Edge, body: bytes) -> None:
    reply = edge.post("/v1/responses", body)
    STATUSES.append(reply.status)
    if reply.status != 200:
        check_openai(reply)
    elif reply.content_type == "text/event-stream":
        check_responses_stream(reply.body)
    else:
        assert reply.json()["object"] == "response", str(reply)


@FUZZ
@given(body=completion_body())
def test_hostile_completion_bodies(edge: Edge, body: bytes) -> None:
    reply = edge.post("/v1/completions", body)
    if reply.status == 200 and reply.content_type == "application/json":
        assert reply.json()["object"] == "text_completion", str(reply)
        return
    check_openai(reply)


@FUZZ
@given(body=embedding_body())
def test_hostile_embedding_bodies(edge: Edge, body: bytes) -> None:
    check_openai(edge.post("/v1/embeddings", body))


def test_the_gateway_survived(edge: Edge) -> None:
    assert "Traceback" not in edge.gateway.text() and "unhandled error" not in edge.gateway.text()
    if STATUSES:  # (empty when this test runs alone)
        assert STATUSES.count(200) >= 10 and STATUSES.count(400) >= 10, sorted(set(STATUSES))
