"""The core promise against the real vLLM: its own scheduler gauges never show a request
waiting inside it, nor more running than the gateway's cap, with both surfaces loading it at
once; the overflow waits in the gateway. Measured beside the same load sent straight to vLLM,
which queues inside (so the sampler would see a broken promise)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anthropic
import openai
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Processes
from tests.support.real_vllm import MAX_NUM_SEQS, MODEL, GaugeWatch, VllmServer

CAP = 3
STREAMS = 12
TOKENS = 60  # the model never stops early: every answer is exactly this long (at ~45 tokens/s)


Job = Callable[[], Awaitable[int]]


async def load(jobs: list[Job], server: VllmServer) -> tuple[list[int], GaugeWatch]:
    with GaugeWatch(server) as watch:
        counts = await asyncio.wait_for(asyncio.gather(*(job() for job in jobs)), 180)
    return counts, watch


def openai_stream(sdk: openai.AsyncOpenAI, i: int) -> Job:
    async def run() -> int:
        stream = await sdk.chat.completions.create(
            model=MODEL, max_tokens=TOKENS, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": f"openai stream {i}"}])  # fmt: skip
        usage = [chunk.usage async for chunk in stream if chunk.usage is not None]
        return usage[-1].completion_tokens
    return run


def anthropic_stream(sdk: anthropic.AsyncAnthropic, i: int) -> Job:
    async def run() -> int:
        async with sdk.messages.stream(model=MODEL, max_tokens=TOKENS,
                                       messages=[{"role": "user", "content": f"anthropic stream {i}"}]) as stream:
            final = await stream.get_final_message()
        return final.usage.output_tokens
    return run


async def test_vllm_never_queues_inside_behind_the_gateway(procs: Processes, vllm: VllmServer) -> None:
    gateway = procs.gateway(vllm_toml(vllm, cap=CAP))
    async with (
        openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=120) as oai,
        anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0, timeout=120) as claude,
    ):
        jobs = [openai_stream(oai, i) if i % 2 else anthropic_stream(claude, i) for i in range(STREAMS)]
        counts, watch = await load(jobs, vllm)
    assert counts == [TOKENS] * STREAMS  # every answer whole, usage as vLLM counted it
    assert watch.peak("running") == CAP  # the cap was reached and never passed
    assert watch.peak("waiting") == 0  # nothing ever queued inside vLLM


async def test_the_same_load_straight_to_vllm_queues_inside(vllm: VllmServer) -> None:
    async with openai.AsyncOpenAI(base_url=f"{vllm.url}/v1", api_key="x", max_retries=0, timeout=120) as direct:
        jobs = [openai_stream(direct, i) for i in range(STREAMS)]
        counts, watch = await load(jobs, vllm)
    assert counts == [TOKENS] * STREAMS
    assert watch.peak("running") == MAX_NUM_SEQS
    assert watch.peak("waiting") > 0  # what the gateway exists to prevent
