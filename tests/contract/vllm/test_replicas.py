"""Two vLLM processes as two replicas of one upstream: the gateway reads each one's real
`/metrics` page (vLLM 0.32's, about 55 KB), keeps new requests off a replica that queues inside
(load from elsewhere), and sends a conversation's next turn back to the replica that holds its
KV cache, where vLLM reports the cached prompt tokens."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.real_vllm import MAX_NUM_SEQS, MODEL, Fleet, VllmServer
from tests.support.replicas import endpoints_toml

NOWHERE = "http://127.0.0.1:9"  # the upstream's identity only: the replicas serve it
SYSTEM = " ".join(f"step {i}: check the {w} twice." for i, w in enumerate(["queue", "slot", "cache"] * 20))


@pytest.fixture(scope="module")
def pair(vllm_fleet: Fleet) -> tuple[VllmServer, VllmServer]:
    return vllm_fleet["main"], vllm_fleet["replica"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, pair: tuple[VllmServer, VllmServer]) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-replicas"))
    admission = {"sequence_slots": 2 * MAX_NUM_SEQS, "max_in_flight": 6, "queue_depth": 16,
                 "queue_timeout_seconds": 60}  # fmt: skip
    toml = (upstream_toml("tiny", NOWHERE, [MODEL], admission)
            + endpoints_toml("tiny", urls=[s.url for s in pair], slots=MAX_NUM_SEQS, cap=3)
            + "load_metrics_interval_seconds = 0.5\n")  # fmt: skip
    try:
        yield procs.gateway(toml)
    finally:
        procs.stop_all()


def endpoint(server: VllmServer) -> str:
    """A replica as the gateway names it (metrics labels, the access log): host:port."""
    return server.url.removeprefix("http://")


def reported(gateway: Proc) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        page = samples(response.read().decode())
    return {(labels["endpoint"], labels["kind"]): value for name, labels, value in page
            if name == "gateway_endpoint_reported" and labels.get("upstream") == "tiny"}  # fmt: skip


def endpoints_of(gateway: Proc, tag: str) -> list[str]:
    """The replica of every access-log line whose request carried `tag` in its id."""
    lines = [json.loads(line) for line in gateway.text().splitlines() if line.startswith('{"request_id"')]
    return [line["endpoint"] for line in lines if tag in line["request_id"]]


def test_the_real_metrics_page_is_read_for_both_replicas(gateway: Proc, pair: tuple[VllmServer, VllmServer]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen = reported(gateway)
        if all((endpoint(s), "running") in seen and (endpoint(s), "waiting") in seen for s in pair):
            return
        time.sleep(0.2)
    raise AssertionError(f"not read: {reported(gateway)}")


async def test_a_replica_queueing_inside_gets_no_new_request(gateway: Proc,
                                                              pair: tuple[VllmServer, VllmServer]) -> None:
    busy, free = pair
    async with (openai.AsyncOpenAI(base_url=f"{busy.url}/v1", api_key="x", max_retries=0, timeout=60) as direct,
                openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=60) as oai):

        async def elsewhere(i: int) -> None:  # traffic that bypasses the gateway: 8 on 4 places
            await direct.completions.create(model=MODEL, prompt=f"elsewhere {i}", max_tokens=150)

        bypass = [asyncio.create_task(elsewhere(i)) for i in range(2 * MAX_NUM_SEQS)]
        for _ in range(100):  # until the gateway has read the queue inside
            if reported(gateway).get((endpoint(busy), "waiting"), 0) > 0:
                break
            await asyncio.sleep(0.1)
        assert reported(gateway).get((endpoint(busy), "waiting"), 0) > 0

        async def through(i: int) -> None:
            await oai.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"{i}"}],
                                              extra_headers={"x-request-id": f"bypassed-{i}"})  # fmt: skip

        await asyncio.gather(*(through(i) for i in range(3)))
        await asyncio.gather(*bypass)
    assert endpoints_of(gateway, "bypassed-") == [endpoint(free)] * 3


def test_a_conversation_returns_to_the_replica_holding_its_cache(gateway: Proc) -> None:
    history: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first turn"}]
    cached: list[int] = []
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=60) as oai:
        for turn in range(3):
            answer = oai.chat.completions.create(model=MODEL, max_tokens=8, messages=history,
                                                 extra_headers={"x-request-id": f"conversation-{turn}"})  # fmt: skip
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
            history += [{"role": "assistant", "content": answer.choices[0].message.content},
                        {"role": "user", "content": f"turn {turn + 2}"}]  # fmt: skip
    assert len(set(endpoints_of(gateway, "conversation-"))) == 1  # every turn on one replica
    assert 0 < cached[1] <= cached[2]  # each turn found the one before it cached (whole blocks of it)
