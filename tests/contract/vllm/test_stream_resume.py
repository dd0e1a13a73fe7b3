"""Two real vLLM replicas, one SIGKILLed mid-answer: every surface's answer goes on on the other
from the token where it broke, and the client gets the same text as an uninterrupted run.

The tiny model answers greedily (temperature 0), byte for byte alike on both replicas, and never
stops before `max_tokens`. With one `user` on every request and room for affinity, every request
goes where the first went (the victim): four answers run there at once (its slots) when it is
killed, with its engine, after each stream has had some of its answer; one round for the
streamed surfaces, one for the plain.
They are resumed on the survivor: whole text, one terminal event, whole usage; the access log
says `resumed`; the survivor never holds more than its slots and every slot comes back. The
fleet starts the victim again on its next use.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.real_vllm import MAX_NUM_SEQS, MODEL, Fleet, GaugeWatch, VllmServer
from tests.support.replicas import endpoints_toml

TOKENS = 1800  # long enough to be killed mid-answer even when the CPU is quiet (prompts are ~20 tokens of 2048)
PROMPT = "tell me a long story about the queue, the slot and the cache"
USER = "resume-test"  # one affinity key: every request prefers the replica of the first
SAMPLING = {"temperature": 0}


@pytest.fixture
def gateway(tmp_path: Path, vllm_fleet: Fleet) -> Iterator[tuple[Proc, VllmServer, VllmServer]]:
    """A fresh gateway over the fleet's `replica` and `main` (either started again if an earlier
    round killed it)."""
    victim, survivor = vllm_fleet["replica"], vllm_fleet["main"]
    procs = Processes(tmp_path)
    admission = {"sequence_slots": 2 * MAX_NUM_SEQS, "max_in_flight": 2 * MAX_NUM_SEQS - 1, "queue_depth": 16,
                 "queue_timeout_seconds": 120}  # fmt: skip
    toml = (upstream_toml("tiny", "http://127.0.0.1:9", [MODEL], admission)
            + endpoints_toml("tiny", urls=[victim.url, survivor.url], slots=MAX_NUM_SEQS, cap=MAX_NUM_SEQS)
            + "affinity_max_extra_in_flight = 8\nload_metrics = false\n")  # fmt: skip
    try:
        yield procs.gateway(toml), victim, survivor
    finally:
        procs.stop_all()


def access_log(gw: Proc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.text().splitlines() if line.startswith('{"request_id"')]


class Run:
    """One request in its own thread: `progress` counts the text pieces a stream has had."""

    def __init__(self, name: str, call: Callable[[Run], str]) -> None:
        self.name, self.progress, self.text, self.error = name, 0, "", None
        self._call = call
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.text = self._call(self)
        except Exception as exc:  # reported by the test
            self.error = exc


def calls(gw: Proc) -> dict[str, Callable[[Run], str]]:
    oai = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=300)
    claude = anthropic.Anthropic(base_url=gw.url + "/llm", api_key="x", max_retries=0, timeout=300)
    messages: Any = [{"role": "user", "content": PROMPT}]

    def chat(run: Run) -> str:
        parts = []
        for chunk in oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, stream=True,
                                                 user=USER, **SAMPLING):  # type: ignore[call-overload]
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                run.progress += 1
        return "".join(parts)

    def plain(run: Run) -> str:
        run.progress = 1 << 20  # nothing to wait for: the kill finds it generating
        answer = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, user=USER,
                                             **SAMPLING)  # type: ignore[call-overload]
        return answer.choices[0].message.content or ""

    def plain_llm(run: Run) -> str:
        run.progress = 1 << 20
        answer = claude.messages.create(model=MODEL, max_tokens=TOKENS, messages=messages, metadata={"user_id": USER},
                                        extra_body=SAMPLING)
        assert answer.usage.output_tokens == TOKENS
        return "".join(block.text for block in answer.content if block.type == "text")

    def plain_text(run: Run) -> str:
        run.progress = 1 << 20
        answer = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, user=USER,
                                        **SAMPLING)  # type: ignore[call-overload]
        return answer.choices[0].text

    def text(run: Run) -> str:
        parts = []
        for chunk in oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, stream=True, user=USER,
                                            **SAMPLING):  # type: ignore[call-overload]
            if chunk.choices and chunk.choices[0].text:
                parts.append(chunk.choices[0].text)
                run.progress += 1
        return "".join(parts)

    def responses(run: Run) -> str:
        parts, ends = [], []
        for event in oai.responses.create(model=MODEL, input=PROMPT, max_output_tokens=TOKENS, user=USER, stream=True,
                                          **SAMPLING):  # type: ignore[call-overload]
            if event.type == "response.output_text.delta":
                parts.append(event.delta)
                run.progress += 1
            elif event.type in ("response.completed", "response.incomplete", "response.failed"):
                ends.append(event)
        assert [e.type for e in ends] == ["response.incomplete"]  # cut at max_output_tokens, once
        assert ends[0].response.usage.output_tokens == TOKENS
        return "".join(parts)

    def llm(run: Run) -> str:
        parts = []
        with claude.messages.stream(model=MODEL, max_tokens=TOKENS, messages=messages, metadata={"user_id": USER},
                                    extra_body=SAMPLING) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    parts.append(event.delta.text)
                    run.progress += 1
            final = stream.get_final_message()
        assert final.usage.output_tokens == TOKENS and final.stop_reason == "max_tokens"
        return "".join(parts)

    return {"chat": chat, "plain": plain, "text": text, "responses": responses, "llm": llm, "plain_llm": plain_llm,
            "plain_text": plain_text}


# Each round fills the victim's 4 slots: the streamed surfaces, then the plain ones beside one
# stream (whose progress says when the plain answers are well under way too).
ROUNDS = {"streamed": ["chat", "text", "responses", "llm"], "plain": ["chat", "plain", "plain_llm", "plain_text"]}


@pytest.mark.parametrize("round_", list(ROUNDS))
def test_answers_broken_by_a_killed_replica_are_the_uninterrupted_ones(
    gateway: tuple[Proc, VllmServer, VllmServer], vllm_fleet: Fleet, round_: str
) -> None:
    gw, one, other = gateway
    requests = {name: call for name, call in calls(gw).items() if name in ROUNDS[round_]}
    # The uninterrupted answers, one at a time: all on one replica (the first pick, then affinity),
    # the victim.
    reference = {}
    for name, call in requests.items():
        run = Run(name, call)
        run.thread.start()
        run.thread.join(300)
        assert run.error is None, run.error
        reference[name] = run.text
    served = {e["endpoint"] for e in access_log(gw)}
    assert len(served) == 1, served
    victim, survivor = (one, other) if served == {one.url.removeprefix("http://")} else (other, one)
    assert all(len(text) > 200 for text in reference.values()), reference

    runs = [Run(name, call) for name, call in requests.items()]
    with GaugeWatch(survivor) as watch:
        for run in runs:
            run.thread.start()
        deadline = time.monotonic() + 120
        # Every stream well under way (a plain answer shows no progress of its own: it started
        # with them, and one the kill finds not yet sent is retried whole on the survivor).
        while min(run.progress for run in runs) < 20:
            assert time.monotonic() < deadline, {run.name: run.progress for run in runs}
            assert all(run.error is None for run in runs), [run.error for run in runs]
            time.sleep(0.01)
        vllm_fleet.kill(vllm_fleet.name_of(victim))
        for run in runs:
            run.thread.join(300)
    for run in runs:
        assert run.error is None, (run.name, run.error)
        assert run.text == reference[run.name], run.name
    assert watch.peak("running") + watch.peak("waiting") <= MAX_NUM_SEQS  # never over its slots

    entries = access_log(gw)[len(reference):]
    assert len(entries) == len(runs), entries
    streamed = [e for e in entries if e["stream"]]
    assert streamed and {e["resumed"] for e in streamed} == {1}, entries  # each stream was broken mid-answer
    assert {e["resumed"] for e in entries} <= {0, 1}, entries
    assert {e["endpoint"] for e in entries} == {survivor.url.removeprefix("http://")}
    page = samples(httpx.get(gw.ops_url + "/metrics", timeout=5).text)
    resumed = {labels["outcome"]: value for name, labels, value in page if name == "gateway_stream_resumes_total"}
    assert resumed == {"resumed": sum(e["resumed"] for e in entries), "not_resumable": 0, "failed": 0}
    held = [value for name, _, value in page if name in ("gateway_endpoint_in_flight", "gateway_upstream_slots_in_use")]
    assert held and not any(held)  # every slot came back
