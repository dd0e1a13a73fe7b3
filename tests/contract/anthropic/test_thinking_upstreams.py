"""`thinking` (and the other surfaces' reasoning settings) against upstreams that do and do not
serve reasoning: a real `gateway serve`, real stub upstreams, the official SDKs.

A stub without `--reasoning` is vLLM 0.32 without `--reasoning-parser`: it refuses a request that
carries `thinking_token_budget` (a 400, or a stream whose first frame is that error). Each upstream
has its own stub with `--log-bodies`, so a test sees exactly what reached it; a refused request never
starts and has no line. `[upstreams.NAME] reasoning` (docs/operations.md): absent is `"auto"`.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

USER: Any = [{"role": "user", "content": "hi"}]
WORDS = "alpha bravo charlie delta"
ENABLED: Any = {"type": "enabled", "budget_tokens": 2048}
REFUSAL = "thinking_token_budget is set but reasoning_config is not configured"


def _stub(procs: Processes, workdir: Path, name: str, *flags: str) -> Proc:
    return procs.stub("--tokens", "4", "--log-bodies", *flags, log=workdir / f"{name}.log")


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Processes, dict[str, Proc]]]:
    workdir = tmp_path_factory.mktemp("thinking")
    procs = Processes(workdir)
    try:
        names = {"plain": (), "streamed": (), "chat": (), "off": (), "strict": (), "thinker": ("--reasoning",)}
        started = procs.together(partial(_stub, procs, workdir, name, *flags) for name, flags in names.items())
        yield procs, dict(zip(names, started, strict=True))
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def gateway(stubs: tuple[Processes, dict[str, Proc]]) -> Proc:
    """Upstreams with no `reasoning` key: the default."""
    procs, stub = stubs
    return procs.gateway("".join(upstream_toml(name, stub[name].url, [name])
                                 for name in ("plain", "streamed", "chat", "thinker")))  # fmt: skip


@pytest.fixture(scope="module")
def keyed(stubs: tuple[Processes, dict[str, Proc]]) -> Proc:
    """Upstreams with each explicit `reasoning` value."""
    procs, stub = stubs
    return procs.gateway(upstream_toml("off", stub["off"].url, ["off"], extra="reasoning = false\n")
                         + upstream_toml("strict", stub["strict"].url, ["strict"], extra="reasoning = true\n"))


def _sdk(gateway: Proc) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0, timeout=20)


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with _sdk(gateway) as sdk:
        yield sdk


@pytest.fixture
async def keyed_client(keyed: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with _sdk(keyed) as sdk:
        yield sdk


def started_bodies(stub: Proc) -> list[dict[str, Any]]:
    """The JSON body of every request the stub started (a refused one never starts)."""
    log: Path = stub.extra["log"]
    return [json.loads(line.partition(" body=")[2]) for line in log.read_text().splitlines() if " body=" in line]


def access_log(gateway: Proc, model: str, count: int) -> list[dict[str, Any]]:
    """The access-log lines of `model`'s requests, once there are `count` (a line is written when
    its request ends, which can be just after the client read the last byte): at most 5 s."""
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in gateway.text().splitlines() if line.startswith('{"request_id"')]
        lines = [line for line in lines if line["model"] == model]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def raw_stream(gateway: Proc, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(f"{gateway.url}/llm/v1/messages", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status == 200
        return response.read()


# --- an upstream without reasoning, default `reasoning` ("auto") ------------------------------


async def test_thinking_on_an_upstream_without_reasoning_is_answered_without_it(
    client: anthropic.AsyncAnthropic, gateway: Proc, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    """The first request with a budget meets vLLM's refusal and is sent again without the budget;
    the gateway remembers and sends later ones without it from the start. Each request starts
    upstream exactly once, answers normally, and has no thinking block."""
    first = await client.messages.create(model="plain", max_tokens=64, messages=USER, thinking=ENABLED)
    second = await client.messages.create(model="plain", max_tokens=64, messages=USER, thinking=ENABLED)
    async with client.messages.stream(model="plain", max_tokens=64, messages=USER, thinking=ENABLED) as stream:
        third = await stream.get_final_message()
    for message in (first, second, third):
        assert [b.type for b in message.content] == ["text"] and message.content[0].text == WORDS  # type: ignore[union-attr]
        assert message.stop_reason == "end_turn"
    bodies = started_bodies(stubs[1]["plain"])
    assert len(bodies) == 3 and not any("thinking_token_budget" in body for body in bodies)
    assert all(body["chat_template_kwargs"] == {"enable_thinking": True} for body in bodies)  # still asked
    logged = access_log(gateway, "plain", 3)
    assert [line["thinking_budget_dropped"] for line in logged] == [True, True, True]
    assert [line["status"] for line in logged] == [200, 200, 200]
    assert gateway.text().count("upstream plain does not serve reasoning") == 1


def test_a_stream_refused_in_its_first_frame_is_sent_again_without_the_budget(
    gateway: Proc, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    """vLLM refuses a streamed budget after its 200 (the error is the stream's first frame,
    nothing generated): the gateway sends it again without the budget, and the client sees
    one ordinary stream."""
    body = {"model": "streamed", "max_tokens": 64, "stream": True, "messages": USER, "thinking": ENABLED}
    events = check_anthropic_stream(raw_stream(gateway, body))
    assert [e.data["content_block"]["type"] for e in events if e.name == "content_block_start"] == ["text"]
    assert "".join(e.data["delta"]["text"] for e in events if e.name == "content_block_delta") == WORDS
    bodies = started_bodies(stubs[1]["streamed"])
    assert len(bodies) == 1 and "thinking_token_budget" not in bodies[0]
    assert [line["thinking_budget_dropped"] for line in access_log(gateway, "streamed", 1)] == [True]


async def test_adaptive_and_disabled_thinking_send_no_budget(
    keyed_client: anthropic.AsyncAnthropic, stubs: tuple[Processes, dict[str, Proc]], keyed: Proc
) -> None:
    for thinking in ({"type": "adaptive"}, {"type": "disabled"}):
        message = await keyed_client.messages.create(model="off", max_tokens=64, messages=USER,
                                               thinking=thinking)  # type: ignore[arg-type]  # fmt: skip
        assert [b.type for b in message.content] == ["text"]
    bodies = started_bodies(stubs[1]["off"])[-2:]
    assert [b["chat_template_kwargs"] for b in bodies] == [{"enable_thinking": True}, {"enable_thinking": False}]
    assert [line["thinking_budget_dropped"] for line in access_log(keyed, "off", 2)][-2:] == [False, False]


# --- `reasoning = false` and `reasoning = true` -----------------------------------------------


async def test_reasoning_false_never_sends_a_budget(
    keyed_client: anthropic.AsyncAnthropic, keyed: Proc, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    message = await keyed_client.messages.create(model="off", max_tokens=64, messages=USER, thinking=ENABLED)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == WORDS  # type: ignore[union-attr]
    assert "thinking_token_budget" not in started_bodies(stubs[1]["off"])[-1]
    assert access_log(keyed, "off", 3)[-1]["thinking_budget_dropped"] is True
    assert "upstream off does not serve reasoning" not in keyed.text()  # told, not learnt


async def test_reasoning_true_relays_the_upstreams_refusal(
    keyed_client: anthropic.AsyncAnthropic, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    """The operator said the upstream serves reasoning: its refusal is a misconfiguration to see."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        await keyed_client.messages.create(model="strict", max_tokens=64, messages=USER, thinking=ENABLED)
    assert REFUSAL in refused.value.message and refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as streamed:  # refused before anything was sent
        async with keyed_client.messages.stream(model="strict", max_tokens=64, messages=USER,
                                                thinking=ENABLED) as stream:  # fmt: skip
            await stream.get_final_message()
    assert REFUSAL in streamed.value.message
    assert started_bodies(stubs[1]["strict"]) == []


# --- an upstream that serves reasoning -----------------------------------------------------------


async def test_the_budget_reaches_an_upstream_that_serves_reasoning(
    client: anthropic.AsyncAnthropic, gateway: Proc, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    """vLLM ends the thinking after `thinking_token_budget` tokens (the stub: 2 of its 5)."""
    budget: Any = {"type": "enabled", "budget_tokens": 2}
    message = await client.messages.create(model="thinker", max_tokens=64, messages=USER, thinking=budget)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Let me"  # type: ignore[union-attr]
    async with client.messages.stream(model="thinker", max_tokens=64, messages=USER, thinking=budget) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == "Let me"  # type: ignore[union-attr]
    adaptive = await client.messages.create(model="thinker", max_tokens=64, messages=USER,
                                            thinking={"type": "adaptive"})  # fmt: skip
    assert adaptive.content[0].thinking == "Let me think about this."  # type: ignore[union-attr]
    assert [b.get("thinking_token_budget") for b in started_bodies(stubs[1]["thinker"])] == [2, 2, None]
    assert [line["thinking_budget_dropped"] for line in access_log(gateway, "thinker", 3)] == [False] * 3


# --- /v1: the same rule ---------------------------------------------------------------------------


def test_v1_reasoning_settings_on_an_upstream_without_reasoning(
    gateway: Proc, stubs: tuple[Processes, dict[str, Proc]]
) -> None:
    """/v1 chat's `thinking_token_budget` is dropped like /llm's budget; `reasoning_effort` and the
    Responses API's `reasoning.effort` are chat-template inputs vLLM takes without a parser: sent."""
    sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20)
    budgeted = sdk.chat.completions.create(model="chat", messages=USER, extra_body={"thinking_token_budget": 64})
    assert budgeted.choices[0].message.content == WORDS
    streamed = sdk.chat.completions.create(model="chat", messages=USER, stream=True,
                                           extra_body={"thinking_token_budget": 64})  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == WORDS
    effort = sdk.chat.completions.create(model="chat", messages=USER, reasoning_effort="high")
    assert effort.choices[0].message.content == WORDS
    response = sdk.responses.create(model="chat", input="hi", reasoning={"effort": "low"})
    assert response.output_text == WORDS
    bodies = started_bodies(stubs[1]["chat"])
    assert [b.get("thinking_token_budget") for b in bodies] == [None] * 4
    assert [b.get("reasoning_effort") for b in bodies] == [None, None, "high", "low"]
    assert [line["thinking_budget_dropped"] for line in access_log(gateway, "chat", 4)] == [True, True, False, False]
