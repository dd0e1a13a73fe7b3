"""Real clients of the Responses API through a real gateway: OpenAI's Codex CLI (a request
it recorded, served plain and streamed, its namespaced tool call and the turn after it) and
the OpenAI Agents SDK (its default Responses model class, an agent with one function tool)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIProvider, OpenAIResponsesModel, RunConfig, Runner, function_tool
from tests.support.capture_upstream import CaptureServer
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.responses_grammar import check_responses_stream

CODEX = json.loads((Path(__file__).parent / "fixtures" / "codex-0.169-responses-request.json").read_text())
CODEX_HEADERS = {"x-codex-beta-features": "", "x-codex-window-id": "w", "session_id": "s", "thread_id": "t",
                 "turn_id": "u", "x-codex-turn-metadata": "{}", "x-codex-installation-id": "i"}
NAMESPACED = "multi_agent_v1__close_agent"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, capture: CaptureServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("responses-clients"))
    try:
        stub = procs.stub("--reasoning", "--tokens", "6")
        yield procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"])
                            + upstream_toml("capture", capture.url, ["capture"]))
    finally:
        procs.stop_all()


def codex(model: str = "reasoning", *, stream: bool = True, say: str | None = None,
          more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = copy.deepcopy(CODEX)
    body["model"], body["stream"] = model, stream
    if say is not None:
        body["input"].append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": say}]})
    body["input"] += more or []
    return body


def post(gateway: Proc, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(f"{gateway.url}/v1/responses", json=body, headers=CODEX_HEADERS, timeout=20)
    assert response.status_code == 200, response.text
    return response


def items_done(stream: bytes) -> list[dict[str, Any]]:
    """What Codex keeps of a stream: the `response.output_item.done` items, then `response.completed`."""
    events = check_responses_stream(stream)
    assert events[-1]["type"] == "response.completed"
    usage = events[-1]["response"]["usage"]
    assert {"cached_tokens"} <= usage["input_tokens_details"].keys()
    assert {"reasoning_tokens"} <= usage["output_tokens_details"].keys()
    return [e["item"] for e in events if e["type"] == "response.output_item.done"]


def test_the_recorded_codex_request_is_served_streamed_and_plain(gateway: Proc) -> None:
    items = items_done(post(gateway, codex()).content)
    assert [item["type"] for item in items] == ["reasoning", "message"]
    assert items[1]["content"][0]["text"].startswith("alpha")
    plain = post(gateway, codex(stream=False)).json()
    assert plain["status"] == "completed" and [i["type"] for i in plain["output"]] == ["reasoning", "message"]
    assert plain["tools"] == CODEX["tools"] and plain["prompt_cache_key"] == CODEX["prompt_cache_key"]


def test_what_the_model_is_offered(gateway: Proc, capture: CaptureServer) -> None:
    capture.bodies.clear()
    post(gateway, codex("capture"))
    body = capture.bodies[-1]
    names = [tool["function"]["name"] for tool in body["tools"]]
    namespace = next(t for t in CODEX["tools"] if t["type"] == "namespace")
    inner = namespace["name"]
    expected = [t["name"] for t in CODEX["tools"] if t["type"] == "function"]
    expected[4:4] = [f"{inner}__{t['name']}" for t in namespace["tools"]]  # the namespace's place
    assert names == expected and "web_search" not in json.dumps(body["tools"])
    assert [m["role"] for m in body["messages"]] == ["system", "system", "user", "user"]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert set(body) == {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream",
                         "stream_options"}  # nothing of client_metadata, include, store, prompt_cache_key


@pytest.mark.parametrize("stream", [True, False])
def test_a_namespaced_call_comes_back_as_codex_expects(gateway: Proc, stream: bool) -> None:
    reply = post(gateway, codex(stream=stream, say=f"use {NAMESPACED}"))
    items = items_done(reply.content) if stream else reply.json()["output"]
    call = items[-1]
    # Codex's ResponseItem::FunctionCall { name, namespace, arguments, call_id }: the split kept apart
    assert (call["type"], call["namespace"], call["name"]) == ("function_call", "multi_agent_v1", "close_agent")
    assert isinstance(call["arguments"], str) and json.loads(call["arguments"]).keys() == {"target"}
    assert call["call_id"] and call["status"] == "completed"


def test_the_turn_after_a_namespaced_call(gateway: Proc, capture: CaptureServer) -> None:
    reply = post(gateway, codex(say=f"use {NAMESPACED}"))
    call = items_done(reply.content)[-1]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"}
    reasoning = items_done(reply.content)[0]
    history = [reasoning, {k: call[k] for k in ("type", "name", "namespace", "arguments", "call_id")}, output]
    answer = items_done(post(gateway, codex(more=history)).content)
    assert answer[-1]["type"] == "message"  # after a tool result the model answers in text
    capture.bodies.clear()
    post(gateway, codex("capture", more=history))
    assistant, tool = capture.bodies[-1]["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == NAMESPACED
    assert assistant["reasoning"] == reasoning["content"][0]["text"]
    assert tool == {"role": "tool", "tool_call_id": call["call_id"], "content": "closed"}


# --- the OpenAI Agents SDK ----------------------------------------------------------------


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_agent_with_a_function_tool_reaches_a_final_answer(gateway: Proc, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20)
    provider = OpenAIProvider(openai_client=client)
    assert isinstance(provider.get_model("reasoning"), OpenAIResponsesModel)  # the default model class
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather], model="reasoning")
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    if stream:
        result: Any = Runner.run_streamed(agent, "use get_weather", run_config=config)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds
    else:
        result = await Runner.run(agent, "use get_weather", run_config=config)
    calls = [item for item in result.new_items if item.type == "tool_call_item"]
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert len(calls) == 1 and calls[0].raw_item.name == "get_weather"
    assert len(outputs) == 1 and outputs[0].output.startswith("sunny in")
    assert isinstance(result.final_output, str) and result.final_output.startswith("alpha")
