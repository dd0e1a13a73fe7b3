"""Stream resume end to end: a real gateway over two stub replicas that die mid-answer.

Both stubs answer 12 words and reset every stream after 5 token chunks (`--fault die-mid-stream
--fault-after-tokens 5`, text completions too), so an answer breaks on one replica, goes on on
the other from the next token, breaks again after 5 more, and is finished by the first (the
default `max_resumes = 2`). Every surface, streamed or not, must give the client exactly the
answer an unbroken replica gives, with one terminal event and whole usage; the access log says
`resumed` and `resumed_tokens`, `gateway_stream_resumes_total` counts, and every slot comes back.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import pytest
from tests.contract.admission.e2e_support import until
from tests.contract.replicas.test_replica_health_e2e import access_log, health_toml
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima"]  # fmt: skip
ANSWER = " ".join(WORDS)  # the stub's 12-token answer
PROMPT = "please answer at length"  # 4 prompt tokens for the stub (one per word)
MESSAGES = [{"role": "user", "content": PROMPT}]
# Sent again: the prompt and the 5 tokens of the first break, then the prompt and 10.
RESENT = (4 + 5) + (4 + 10)
SEEN: set[str] = set()  # the access-log lines already read (requests run one at a time here)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("resume"))
    try:
        dying = ("--tokens", "12", "--max-num-seqs", "4", "--fault", "die-mid-stream", "--fault-after-tokens", "5")
        stubs = procs.together([partial(procs.stub, *dying), partial(procs.stub, *dying)])
        yield procs.gateway(health_toml([s.url for s in stubs], load_metrics=False))
    finally:
        procs.stop_all()


def last_entry(gw: Proc) -> dict[str, Any]:
    """The access-log line of the request just answered: written once its response has ended,
    which the client may see first."""
    deadline = time.monotonic() + 5
    while True:
        entries = access_log(gw)
        if entries and entries[-1]["request_id"] not in SEEN:
            SEEN.add(entries[-1]["request_id"])
            return entries[-1]
        assert time.monotonic() < deadline, "no new access-log line"
        time.sleep(0.01)


def assert_resumed_twice(gw: Proc) -> None:
    entry = last_entry(gw)
    assert entry["status"] == 200, entry
    assert (entry["resumed"], entry["resumed_tokens"]) == (2, RESENT), entry


def sse_events(gw: Proc, path: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(event name, data) of every SSE event of a raw streamed answer."""
    events: list[tuple[str | None, str]] = []
    with httpx.Client(timeout=30) as client, client.stream("POST", gw.url + path, json=body) as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, line[6:]))
                name = None
    return events


def test_a_v1_chat_stream_is_whole_after_two_broken_replicas(gateway: Proc) -> None:
    events = sse_events(gateway, "/v1/chat/completions", {
        "model": "reasoning", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}})
    data = [d for _, d in events]
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("token_ids" not in json.dumps(c) for c in chunks)  # the gateway's own business
    assert not any("error" in c for c in chunks), chunks
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == ANSWER
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["stop"]
    assert len({c["id"] for c in chunks}) == 1  # one answer
    usage = chunks[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (4, 12)
    assert_resumed_twice(gateway)


def test_a_plain_v1_chat_answer_is_whole(gateway: Proc) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="reasoning", messages=MESSAGES)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == ANSWER
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 12)
    assert_resumed_twice(gateway)


def test_an_llm_stream_is_whole_with_one_message_start_and_stop(gateway: Proc) -> None:
    events = sse_events(gateway, "/llm/v1/messages", {
        "model": "reasoning", "max_tokens": 64, "messages": MESSAGES, "stream": True})
    names = [name for name, _ in events]
    assert names.count("message_start") == 1 and names.count("message_stop") == 1 and "error" not in names
    claude = anthropic.Anthropic(base_url=gateway.url + "/llm", api_key="x", max_retries=0, timeout=30)
    with claude.messages.stream(model="reasoning", max_tokens=64, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert [b.text for b in message.content if b.type == "text"] == [ANSWER]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 12)
    assert_resumed_twice(gateway)


def test_a_plain_llm_answer_is_whole(gateway: Proc) -> None:
    claude = anthropic.Anthropic(base_url=gateway.url + "/llm", api_key="x", max_retries=0, timeout=30)
    message = claude.messages.create(model="reasoning", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
    assert [b.text for b in message.content if b.type == "text"] == [ANSWER]
    assert_resumed_twice(gateway)


def test_a_responses_stream_is_whole(gateway: Proc) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with client.responses.stream(model="reasoning", input=PROMPT) as stream:
        final = stream.get_final_response()
    assert final.output_text == ANSWER
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (4, 12)
    assert_resumed_twice(gateway)


@pytest.mark.parametrize("stream", [True, False])
def test_a_text_completion_is_whole(gateway: Proc, stream: bool) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)
    if stream:
        parts = client.completions.create(model="reasoning", prompt=PROMPT, max_tokens=32, stream=True)
        text = "".join(part.choices[0].text for part in parts if part.choices)
    else:
        answer = client.completions.create(model="reasoning", prompt=PROMPT, max_tokens=32)
        text = answer.choices[0].text
    assert text == ANSWER
    assert_resumed_twice(gateway)


def test_a_request_that_cannot_be_resumed_ends_with_its_error_and_every_break_is_counted(gateway: Proc) -> None:
    test_a_plain_v1_chat_answer_is_whole(gateway)  # resumed twice
    events = sse_events(gateway, "/v1/chat/completions", {
        "model": "reasoning", "messages": MESSAGES, "stream": True, "stop": ["zulu"]})
    data = [d for _, d in events]
    assert any("error" in json.loads(d) for d in data[:-1]), data  # the break, as before
    assert data[-1] == "[DONE]"
    entry = last_entry(gateway)
    assert entry["resumed"] == 0
    page = samples(httpx.get(gateway.ops_url + "/metrics", timeout=5).text)
    counts = {labels["outcome"]: value for name, labels, value in page
              if name == "gateway_stream_resumes_total" and labels.get("upstream") == "reasoning"}
    assert counts["not_resumable"] >= 1 and counts["resumed"] >= 2 and counts["failed"] == 0
    held = [value for name, _, value in page if name == "gateway_endpoint_in_flight"]
    assert held and not any(held)  # every slot came back


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Replicas that think first ("Let me think about this.", 5 tokens, then the end of thinking)
    and answer 4 words, each stream dying after 4 tokens: the first break is inside the thinking,
    the second right after its end."""
    procs = Processes(tmp_path_factory.mktemp("resume-thinking"))
    try:
        dying = ("--tokens", "4", "--reasoning", "--fault", "die-mid-stream", "--fault-after-tokens", "4")
        stubs = procs.together([partial(procs.stub, *dying), partial(procs.stub, *dying)])
        yield procs.gateway(health_toml([s.url for s in stubs], load_metrics=False))
    finally:
        procs.stop_all()


def test_a_break_inside_the_thinking_continues_the_thinking(thinking: Proc) -> None:
    events = sse_events(thinking, "/v1/chat/completions", {"model": "reasoning", "messages": MESSAGES, "stream": True})
    chunks = [json.loads(d) for _, d in events if d != "[DONE]"]
    assert not any("error" in c for c in chunks), chunks
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning") or d.get("reasoning_content") or "" for d in deltas) == "Let me think about this."
    assert "".join(d.get("content") or "" for d in deltas) == "alpha bravo charlie delta"
    assert last_entry(thinking)["resumed"] == 2


def test_a_plain_answer_keeps_its_thinking_apart(thinking: Proc) -> None:
    client = openai.OpenAI(base_url=thinking.url + "/v1", api_key="x", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="reasoning", messages=MESSAGES)  # type: ignore[arg-type]
    message = answer.choices[0].message
    assert message.content == "alpha bravo charlie delta"
    assert (getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)) == \
        "Let me think about this."
    assert last_entry(thinking)["resumed"] == 2


SLOW = ("--tokens", "40", "--chunk-delay", "0.05", "--max-num-seqs", "4", "--fault", "die-mid-stream",
        "--fault-after-tokens", "5")  # fmt: skip
NATO = [*WORDS, "mike", "november", "oscar", "papa"]
LONG_ANSWER = " ".join(NATO[i % 16] for i in range(40))  # the stub's 40-token answer


def slow_pair(procs: Processes, *more: str) -> tuple[Proc, list[Proc]]:
    stubs = procs.together([partial(procs.stub, *SLOW, *more), partial(procs.stub, *SLOW, *more)])
    return procs.gateway("drain_grace_seconds = 20\n" + health_toml([s.url for s in stubs], load_metrics=False)), stubs


async def read_deltas(response: aiohttp.ClientResponse, until: int | None = None) -> tuple[list[str], bool]:
    """The content deltas of a raw /v1 stream (up to `until` of them), and whether an error came."""
    texts: list[str] = []
    error = False
    async for line in response.content:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        data = json.loads(line[6:])
        error = error or "error" in data
        if data.get("choices") and data["choices"][0]["delta"].get("content"):
            texts.append(data["choices"][0]["delta"]["content"])
            if until is not None and len(texts) >= until:
                break
    return texts, error


def held(gw: Proc) -> list[float]:
    """What the gateway holds now: per replica, and of the upstream's cap."""
    page = samples(httpx.get(gw.ops_url + "/metrics", timeout=5).text)
    return [value for name, _, value in page if name in ("gateway_endpoint_in_flight", "gateway_upstream_slots_in_use")]


def running(stub: Proc) -> float:
    page = samples(httpx.get(stub.url + "/metrics", timeout=5).text)
    return sum(value for name, _, value in page if name == "vllm:num_requests_running")


async def test_a_client_that_hangs_up_during_a_resume_aborts_it_and_frees_its_slot(procs: Processes) -> None:
    gw, stubs = slow_pair(procs)
    body = {"model": "reasoning", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        response = await http.post(gw.url + "/v1/chat/completions", json=body)
        texts, error = await read_deltas(response, until=8)  # 5 from the first replica, 3 from its continuation
        assert not error and "".join(texts) == LONG_ANSWER[: len("".join(texts))]
        response.close()  # the client goes away mid-continuation
    entry = last_entry(gw)
    assert entry["client_gone"] and entry["resumed"] == 1, entry
    await until(lambda: not any(running(stub) for stub in stubs), "the continuation aborted upstream")
    assert not any(held(gw)), "every slot came back"


async def test_a_drain_lets_a_stream_resume_and_finish(procs: Processes) -> None:
    gw, _ = slow_pair(procs, "--fault-limit", "1")  # each replica breaks one stream: two resumes
    body = {"model": "reasoning", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        response = await http.post(gw.url + "/v1/chat/completions", json=body)
        first, _ = await read_deltas(response, until=2)
        gw.signal(signal.SIGTERM)  # the break (after 5 tokens) comes during the drain
        rest, error = await read_deltas(response)
    assert not error and "".join(first + rest) == LONG_ANSWER
    assert last_entry(gw)["resumed"] == 2
    assert await asyncio.to_thread(gw.popen.wait, 15) == 0, gw.text()
