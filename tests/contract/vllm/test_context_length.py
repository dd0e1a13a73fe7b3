"""Context-length refusals against the real vLLM: it stops counting a prompt at
max-model-len + 1 ("at least 2049 input tokens"), and the gateway reports the prompt's real size
(vLLM's own /tokenize count) on every surface that words it, so a client that trims by the
difference trims enough. A prompt that fits with too large a `max_tokens` is not refused by
vLLM 0.32: it shortens the answer to the room left."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MAX_MODEL_LEN, MODEL, Fleet, VllmServer

LONG = [{"role": "user", "content": " ".join(f"word{i} and more" for i in range(900))}]


@pytest.fixture(scope="module")
def upstream(vllm_fleet: Fleet) -> VllmServer:
    return vllm_fleet["main"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: VllmServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-context"))
    try:
        yield procs.gateway(vllm_toml(upstream))
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def real_size(upstream: VllmServer) -> int:
    count: Any = upstream.post("/tokenize", {"model": MODEL, "messages": LONG})["count"]
    assert count > MAX_MODEL_LEN + 1000  # far over: vLLM's own refusal says only "at least 2049"
    refusal = upstream.post_status("/v1/chat/completions", {"model": MODEL, "messages": LONG, "max_tokens": 8})
    assert refusal[0] == 400 and f"at least {MAX_MODEL_LEN + 1} input tokens" in str(refusal[1])
    return int(count)


async def test_llm_says_the_prompts_real_size(gateway: Proc, real_size: int) -> None:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0) as claude:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await claude.messages.create(model=MODEL, max_tokens=8, messages=LONG)
        assert f"prompt is too long: {real_size} tokens > {MAX_MODEL_LEN} maximum" in str(refused.value)
        with pytest.raises(anthropic.BadRequestError) as streamed:
            async with claude.messages.stream(model=MODEL, max_tokens=8, messages=LONG) as stream:
                await stream.get_final_message()
        assert f"prompt is too long: {real_size} tokens > {MAX_MODEL_LEN} maximum" in str(streamed.value)


async def test_v1_says_the_prompts_real_size(gateway: Proc, real_size: int) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as oai:
        with pytest.raises(openai.BadRequestError) as refused:
            await oai.chat.completions.create(model=MODEL, max_tokens=8, messages=LONG)
        assert refused.value.code == "context_length_exceeded"
        assert f"{real_size} input tokens" in refused.value.message
        assert "at least" not in refused.value.message
        with pytest.raises(openai.BadRequestError) as responses:
            await oai.responses.create(model=MODEL, max_output_tokens=8, input=LONG)
        assert responses.value.code == "context_length_exceeded"
        assert str(real_size) in responses.value.message


def nearly_full(upstream: VllmServer, room: int) -> tuple[list[Any], int]:
    """A prompt leaving about `room` tokens of the context, and its size (found with /tokenize)."""
    low, high = 1, 900
    while low < high:  # the most repeats that still leave the room
        mid = (low + high + 1) // 2
        messages = [{"role": "user", "content": " ".join(f"word{i} and more" for i in range(mid))}]
        count: Any = upstream.post("/tokenize", {"model": MODEL, "messages": messages})["count"]
        low, high = (mid, high) if count <= MAX_MODEL_LEN - room else (low, mid - 1)
    messages = [{"role": "user", "content": " ".join(f"word{i} and more" for i in range(low))}]
    return messages, int(upstream.post("/tokenize", {"model": MODEL, "messages": messages})["count"])  # type: ignore[call-overload]


async def test_a_prompt_that_fits_with_too_large_max_tokens_is_shortened_not_refused(gateway: Proc,
                                                                                   upstream: VllmServer) -> None:
    messages, prompt = nearly_full(upstream, room=40)
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=120) as claude:  # fmt: skip
        answer = await claude.messages.create(model=MODEL, max_tokens=500, messages=messages)
    assert answer.stop_reason == "max_tokens"
    assert answer.usage.output_tokens == MAX_MODEL_LEN - prompt < 500  # vLLM shortened it to the room left
