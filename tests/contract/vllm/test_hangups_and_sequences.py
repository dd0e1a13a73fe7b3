"""What a slot is, against the real vLLM: a client that hangs up mid-answer is aborted inside
vLLM at once (its running place there and the gateway's slot come back), and a request for n
sequences holds n of vLLM's running places, so the cap counts sequences, not requests."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Iterator

import anthropic
import openai
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.metrics import gauge, samples
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MODEL, Fleet, GaugeWatch, VllmServer

LONG = 2000  # tokens: about as many as the context leaves, far longer than the test waits


@pytest.fixture(scope="module")
def upstream(vllm_fleet: Fleet) -> VllmServer:
    return vllm_fleet["main"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: VllmServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-hangups"))
    try:
        yield procs.gateway(vllm_toml(upstream, cap=3, extra="max_choices = 3\n"))
    finally:
        procs.stop_all()


def slots_in_use(gateway: Proc) -> float | None:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        return gauge(samples(response.read().decode()), "gateway_upstream_slots_in_use", "tiny")


def aborted(upstream: VllmServer) -> int:
    return len(re.findall(r"Request \S+ aborted\.", upstream.text()))


async def settled(gateway: Proc, upstream: VllmServer, aborts: int) -> float:
    """Seconds until vLLM logged one more abort, runs nothing and the gateway holds no slot."""
    started = time.monotonic()
    for _ in range(100):
        running = upstream.gauges()["running"]  # on the loop: its default executor is the SDK's
        if aborted(upstream) > aborts and running == 0 and slots_in_use(gateway) == 0:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"not settled: aborts {aborted(upstream)}, running {running}, "
                         f"gateway slots {slots_in_use(gateway)}")  # fmt: skip


async def test_a_v1_client_hanging_up_mid_stream_is_aborted_inside_vllm(gateway: Proc, upstream: VllmServer) -> None:
    before = aborted(upstream)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=60) as oai:
        stream = await oai.chat.completions.create(model=MODEL, max_tokens=LONG, stream=True,
                                                   messages=[{"role": "user", "content": "hang up on v1"}])  # fmt: skip
        got = []
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 5:
                break
        assert upstream.gauges()["running"] == 1
        await stream.close()
    assert len(got) == 5
    assert await settled(gateway, upstream, before) < 3.0


async def test_an_llm_client_hanging_up_mid_stream_is_aborted_inside_vllm(gateway: Proc, upstream: VllmServer) -> None:
    before = aborted(upstream)
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=60) as claude:  # fmt: skip
        async with claude.messages.stream(model=MODEL, max_tokens=LONG,
                                          messages=[{"role": "user", "content": "hang up on llm"}]) as stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    break  # leaving the block closes the connection mid-answer
    assert await settled(gateway, upstream, before) < 3.0


async def test_n_sequences_take_n_of_vllms_running_places(gateway: Proc, upstream: VllmServer) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:

        async def three() -> int:
            answer = await oai.chat.completions.create(model=MODEL, n=3, max_tokens=60,
                                                       messages=[{"role": "user", "content": "three"}])  # fmt: skip
            assert len(answer.choices) == 3 and answer.usage is not None
            return answer.usage.completion_tokens

        async def one(i: int) -> int:
            answer = await oai.chat.completions.create(model=MODEL, max_tokens=60,
                                                       messages=[{"role": "user", "content": f"one {i}"}])  # fmt: skip
            assert answer.usage is not None
            return answer.usage.completion_tokens

        with GaugeWatch(upstream) as watch:
            tokens = await asyncio.wait_for(asyncio.gather(three(), *(one(i) for i in range(3)), three()), 180)
    assert tokens == [180, 60, 60, 60, 180]
    assert watch.peak("running") == 3  # n=3 filled the cap by itself: the single ones waited
    assert watch.peak("waiting") == 0
