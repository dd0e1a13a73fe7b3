"""The official `openai` SDK's Responses API against a real `gateway serve` and real upstreams.

Upstreams: `gateway stub` processes (plain, `--reasoning`, `--fault reset-mid-stream`,
`--fault http-4xx`) and a capturing upstream in this process that records the chat
bodies it receives, to show what reaches an upstream. Every raw stream is also checked
against the grammar (`tests/support/responses_grammar.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import openai
import pytest
from tests.support.capture_upstream import CaptureServer
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.responses_grammar import check_responses_stream

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}

@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, capture: CaptureServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("responses-sdk"))
    try:
        plain, thinking, reset, context = procs.together([
            procs.stub, partial(procs.stub, "--reasoning"),
            partial(procs.stub, "--fault", "reset-mid-stream"), partial(procs.stub, "--fault", "http-4xx")])
        toml = (upstream_toml("plain", plain.url, ["plain"])
                + upstream_toml("reasoning", thinking.url, ["reasoning"])
                + upstream_toml("reset", reset.url, ["reset"])
                + upstream_toml("context", context.url, ["context"])
                + upstream_toml("capture", capture.url, ["capture"]))  # fmt: skip
        yield procs.gateway(toml)
    finally:
        procs.stop_all()


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)


def raw_stream(gateway: Proc, body: dict[str, Any]) -> bytes:
    response = httpx.post(f"{gateway.url}/v1/responses", json={**body, "stream": True}, timeout=20)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response.content


# --- text, plain and streamed ----------------------------------------------------------------


def test_create_plain(client: openai.OpenAI) -> None:
    response = client.responses.create(model="plain", input="hi", instructions="Be brief.", metadata={"k": "v"})
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.model == "plain"
    assert response.output_text.startswith("alpha bravo")
    assert [item.type for item in response.output] == ["message"]
    assert response.instructions == "Be brief." and response.metadata == {"k": "v"}
    assert response.usage is not None and response.usage.output_tokens == 16
    assert response.usage.total_tokens == response.usage.input_tokens + 16


def test_create_streamed(client: openai.OpenAI, gateway: Proc) -> None:
    events = list(client.responses.create(model="plain", input="hi", stream=True))
    names = [event.type for event in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and text.startswith("alpha bravo")
    check_responses_stream(raw_stream(gateway, {"model": "plain", "input": "hi"}))


def test_stream_helper_reaches_completed_with_the_plain_text(client: openai.OpenAI) -> None:
    plain = client.responses.create(model="plain", input="hi")
    with client.responses.stream(model="plain", input="hi") as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert seen[-1] == "response.completed"
    assert final.output_text == plain.output_text and final.status == "completed"


def test_reasoning_plain_and_streamed(client: openai.OpenAI, gateway: Proc) -> None:
    response = client.responses.create(model="reasoning", input="hi", reasoning={"effort": "low"})
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text
    with client.responses.stream(model="reasoning", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == reasoning.content[0].text
    assert final.output_text == response.output_text
    check_responses_stream(raw_stream(gateway, {"model": "reasoning", "input": "hi"}))


# --- a function tool round trip ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(client: openai.OpenAI, stream: bool) -> None:
    history: list[Any] = [{"role": "user", "content": "use get_weather"}]
    if stream:
        with client.responses.stream(model="plain", input=history, tools=[WEATHER]) as events:
            first = events.get_final_response()
    else:
        first = client.responses.create(model="plain", input=history, tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments).keys() == {"city"} and call.call_id
    history += [call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    answer = client.responses.create(model="plain", input=history, tools=[WEATHER])
    assert answer.status == "completed" and answer.output[0].type == "message"
    assert answer.output_text.startswith("alpha")


# --- stateless, and the failures -----------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("previous_response_id", "resp_1"), ("conversation", "conv_1")])
def test_stateful_fields_are_a_bad_request(client: openai.OpenAI, field: str, value: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="plain", input="hi", **{field: value})  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == field
    assert "full history" in error["message"] and "input" in error["message"]


def test_store_and_unknown_include_are_ignored(client: openai.OpenAI) -> None:
    response = client.responses.create(model="plain", input="hi", store=True,
                                       include=["reasoning.encrypted_content", "web_search_call.action.sources"])
    assert response.status == "completed"


def test_a_reset_mid_stream_ends_with_response_failed(client: openai.OpenAI, gateway: Proc) -> None:
    events = list(client.responses.create(model="reset", input="hi", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed" and events[-1].response.error.code == "server_error"
    check_responses_stream(raw_stream(gateway, {"model": "reset", "input": "hi"}))


def test_context_length_exceeded_is_openais_code(client: openai.OpenAI, gateway: Proc) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="context", input="hi")
    assert caught.value.code == "context_length_exceeded"
    chat = httpx.post(f"{gateway.url}/v1/chat/completions",
                      json={"model": "context", "messages": [{"role": "user", "content": "hi"}]})
    assert caught.value.response.headers["content-type"] == chat.headers["content-type"]
    assert _without_instance(caught.value.response.json()) == _without_instance(chat.json())


def test_hosted_tools_are_left_out_and_the_rest_is_an_allowlist(client: openai.OpenAI,
                                                                capture: CaptureServer) -> None:
    capture.bodies.clear()
    client.responses.create(
        model="capture", input="hi", tools=[WEATHER, {"type": "web_search"}, {"type": "file_search",
                                                                             "vector_store_ids": ["vs_1"]}],
        reasoning={"effort": "high", "summary": "auto"}, prompt_cache_key="session-1", user="u1",
        text={"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}},
        extra_body={"client_metadata": {"x": "y"}, "nonsense": 1},
    )
    body = capture.bodies[-1]
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert body["reasoning_effort"] == "high" and body["user"] == "u1"
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer",
                                                                              "schema": {"type": "object"}}}
    assert set(body) == {"model", "messages", "tools", "user", "reasoning_effort", "response_format"}


def _without_instance(problem: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in problem.items() if k != "instance"}
