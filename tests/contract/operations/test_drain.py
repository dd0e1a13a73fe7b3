"""SIGTERM drains a real `gateway serve` process: admitted work finishes, the queue is refused."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
from tests.support.metrics import gauge, samples
from tests.support.processes import Processes, upstream_toml

STREAM_LLM = {"model": "reasoning", "max_tokens": 16, "stream": True,
              "messages": [{"role": "user", "content": "hi"}]}
PLAIN_V1 = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


async def _read_sse(response: aiohttp.ClientResponse) -> str:
    return (await response.read()).decode()


async def test_sigterm_mid_stream_drains(procs: Processes) -> None:
    stub = procs.stub("--hold", "1.5", "--chunk-delay", "0.05")
    gateway = procs.gateway(
        "drain_grace_seconds = 20\nqueue_update_interval_seconds = 0.1\n"
        + upstream_toml("reasoning", stub.url, ["reasoning"], {
            "sequence_slots": 2, "max_in_flight": 1, "queue_depth": 4, "queue_timeout_seconds": 30}))
    url = gateway.url
    async with aiohttp.ClientSession() as http:
        admitted = await http.post(f"{url}/llm/v1/messages", json=STREAM_LLM)
        assert admitted.status == 200
        admitted_body = asyncio.create_task(_read_sse(admitted))
        queued_plain = asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=PLAIN_V1))
        queued_stream = await http.post(f"{url}/llm/v1/messages", json=STREAM_LLM)
        assert queued_stream.status == 200  # its queue frames started the response
        first = await queued_stream.content.readuntil(b"\n\n")
        assert first.startswith(b"event: queue")
        await _wait_queue(http, gateway.ops_url, 2)

        gateway.signal(signal.SIGTERM)

        refused = await queued_plain
        assert refused.status == 503
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert int(refused.headers["retry-after"]) >= 1
        assert (await refused.json())["status"] == 503

        rest = (await queued_stream.read()).decode()
        assert "event: error" in rest and "overloaded_error" in rest and "message_start" not in rest

        ready = await http.get(f"{url}/readyz")
        assert ready.status == 503

        late = await http.post(f"{url}/v1/chat/completions", json=PLAIN_V1)
        assert late.status == 503 and "retry-after" in late.headers

        body = await admitted_body
        assert "event: message_stop" in body and "event: error" not in body

    assert await asyncio.to_thread(gateway.popen.wait, 15) == 0, gateway.text()


async def test_readyz_is_ready_before_drain(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]))
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{gateway.url}/readyz")).status == 200
        assert (await http.get(f"{gateway.url}/healthz")).status == 200
    gateway.signal(signal.SIGTERM)
    gateway.popen.wait(timeout=15)
    assert gateway.popen.returncode == 0


async def _wait_queue(http: aiohttp.ClientSession, url: str, depth: int) -> None:
    for _ in range(200):
        page = samples(await (await http.get(f"{url}/metrics")).text())
        if (gauge(page, "gateway_upstream_queue_depth", "reasoning") or 0) >= depth:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("queue did not fill")
