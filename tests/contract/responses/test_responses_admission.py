"""`/v1/responses` under admission and limits, end to end: a queued stream the SDK parses,
a queue timeout after `response.queued`, a queued hang-up, and the shared refusals (503 with
Retry-After, 429 with `x-ratelimit-*`, 401) rendered exactly as on `/v1/chat/completions`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
from tests.contract.admission.e2e_support import (
    admission,
    call,
    hang_up,
    http_client,
    logged,
    open_raw,
    scrape,
    starts,
    until,
    until_metric,
)
from tests.support.processes import Processes, upstream_toml
from tests.support.responses_grammar import check_responses_stream

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
BODIES = {RESPONSES: {"model": "reasoning", "input": "hi"},
          CHAT: {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}}


async def test_a_queued_stream_says_queued_and_the_sdk_parses_it(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1", "--tokens", "4", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 4)))
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=20)
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))  # the upstream is full
        await until(logged(log, 1), "the chat request reached the stub")
        async with client.responses.stream(model="reasoning", input="hi") as stream:  # the SDK's helper
            events = [event async for event in stream]
            final = await stream.get_final_response()
        assert (await holder).status == 200
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))  # full again, for a raw look
        await until(logged(log, 3), "the second chat request reached the stub")
        raw_reply = await c.post(gw.url + RESPONSES, json={**BODIES[RESPONSES], "stream": True})
        assert (await holder).status == 200
    names = [event.type for event in events]
    assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and events[1].response.status == "queued"
    assert names[-1] == "response.completed" and final.output_text == "alpha bravo charlie delta"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert check_responses_stream(raw_reply.content)[1]["type"] == "response.queued"


async def test_a_queue_timeout_after_queued_is_response_failed(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "3", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 4, timeout=1)))
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
        await until(logged(log, 1), "the chat request reached the stub")
        reply = await c.post(gw.url + RESPONSES, json={**BODIES[RESPONSES], "stream": True})
        await holder
    events = check_responses_stream(reply.content)
    assert [e["type"] for e in events] == ["response.created", "response.queued", "error", "response.failed"]
    error = events[-1]["response"]["error"]
    assert error == {"code": "server_error", "message": "Timed out waiting for an upstream slot"}
    assert len(starts(log)) == 1  # the timed-out request never reached the upstream


async def test_a_queued_hang_up_leaves_the_queue(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 4)))
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
        await until(logged(log, 1), "the chat request reached the stub")
        reader, writer = await open_raw(gw, "v1", "reasoning", True, path=RESPONSES,
                                        payload={**BODIES[RESPONSES], "stream": True})
        await until_metric(c, gw, "queue_depth", 1)
        head = await reader.read(4096)  # the 200 and the queued events arrived before the hang-up
        await hang_up(writer)
        await until_metric(c, gw, "queue_depth", 0, timeout=3)
        assert (await holder).status == 200
        await asyncio.sleep(0.3)
        metrics = await scrape(c, gw)
    assert b"200 OK" in head and b"event: response.queued" in head
    assert metrics["admission.abandoned"] == 1 and metrics["slots_in_use"] == 0
    assert len(starts(log)) == 1


def _same_refusal(responses: httpx.Response, chat: httpx.Response, headers: tuple[str, ...]) -> None:
    assert responses.status_code == chat.status_code
    assert responses.headers["content-type"] == chat.headers["content-type"] == "application/problem+json"
    for name in headers:
        assert responses.headers.get(name) == chat.headers.get(name), name

    def problem(reply: httpx.Response) -> dict[str, Any]:
        return {k: v for k, v in reply.json().items() if k != "instance"}

    assert problem(responses) == problem(chat)


async def test_a_full_queue_is_the_same_503(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "2", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 0)))
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
        await until(logged(log, 1), "the chat request reached the stub")
        refused = {path: await c.post(gw.url + path, json=body) for path, body in BODIES.items()}
        streamed = await c.post(gw.url + RESPONSES, json={**BODIES[RESPONSES], "stream": True})
        await holder
    _same_refusal(refused[RESPONSES], refused[CHAT], ("retry-after",))
    assert refused[RESPONSES].status_code == 503 and int(refused[RESPONSES].headers["retry-after"]) >= 1
    assert refused[RESPONSES].json()["error"]["code"] == "queue-full"
    _same_refusal(streamed, refused[CHAT], ("retry-after",))  # a refused stream never started


async def test_keys_and_limits_refuse_alike(procs: Processes, tmp_path: Path) -> None:
    key = new_key()
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[consumers.limited]\nkeys = ["{key_digest(key)}"]\nrequests_per_minute = 2\n')
    stub = procs.stub("--tokens", "2")
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"])
                       + f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n')
    bearer = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=20) as c:
        anonymous = {path: await c.post(gw.url + path, json=body) for path, body in BODIES.items()}
        ok = await c.post(gw.url + RESPONSES, json=BODIES[RESPONSES], headers=bearer)
        await c.post(gw.url + CHAT, json=BODIES[CHAT], headers=bearer)
        limited = {path: await c.post(gw.url + path, json=body, headers=bearer) for path, body in BODIES.items()}
    _same_refusal(anonymous[RESPONSES], anonymous[CHAT], ("www-authenticate",))
    assert anonymous[RESPONSES].status_code == 401
    assert anonymous[RESPONSES].json()["error"]["code"] == "invalid_api_key"
    assert ok.status_code == 200 and ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["x-ratelimit-remaining-requests"] == "1"
    refused, chat = limited[RESPONSES], limited[CHAT]
    assert refused.status_code == chat.status_code == 429
    assert refused.json()["error"] == chat.json()["error"]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    for name in ("retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"):
        assert refused.headers[name] == chat.headers[name], name
    assert "x-ratelimit-reset-requests" in refused.headers


async def test_unknown_v1_paths_and_methods_keep_the_problem_shape(procs: Processes) -> None:
    stub = procs.stub()
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"]))
    async with httpx.AsyncClient(timeout=20) as c:
        unknown = await c.post(gw.url + "/v1/responses/resp_1/cancel", json={})
        fetched = await c.get(gw.url + "/v1/responses/resp_1")
        wrong = await c.get(gw.url + RESPONSES)
        invalid = await c.post(gw.url + RESPONSES, json={"model": "reasoning", "input": [{"type": "nope"}]})
    for reply, status in ((unknown, 404), (fetched, 404), (wrong, 405), (invalid, 400)):
        assert reply.status_code == status
        assert reply.headers["content-type"] == "application/problem+json"
        assert reply.json()["status"] == status and reply.json()["error"]["message"]
    assert invalid.json()["error"]["param"] == "input[0].type"
