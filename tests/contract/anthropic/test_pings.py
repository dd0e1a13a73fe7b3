"""Pings while tokens are slow, through real stub and gateway processes and the official SDK.

A quiet upstream (a long prefill, a slow decode) must not look like a dead connection to the
client's or a proxy's idle timeout: `/llm` sends `event: ping` inside the message after
`ping_interval_seconds` without a token (Anthropic's own keep-alive), `/v1/responses` a
comment. The wait is interrupted for the ping and resumed: no token is lost and the
answer's usage is still the upstream's.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from tests.contract.admission.e2e_support import body, http_client
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Processes, upstream_toml

PINGS = "ping_interval_seconds = 0.1\n"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway over a slow stub (0.35 s between tokens), pinging every 0.1 s: the tests only stream through it."""
    procs = Processes(tmp_path_factory.mktemp("pings"))
    try:
        stub = procs.stub("--chunk-delay", "0.35", "--tokens", "3")
        yield procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"]), server_extra=PINGS).url
    finally:
        procs.stop_all()


async def test_a_slow_llm_stream_pings_inside_the_message_and_loses_no_token(url: str) -> None:
    async with http_client() as c:
        fast = await c.post(url + "/llm/v1/messages", json=body("llm", "reasoning", True))
        async with c.stream("POST", url + "/llm/v1/messages", json=body("llm", "reasoning", True)) as response:
            assert response.status_code == 200
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
    events = check_anthropic_stream(raw)  # the grammar (pings left out of what it returns)
    names = [frame.split(b"\n", 1)[0] for frame in raw.split(b"\n\n") if frame.startswith(b"event: ")]
    start, stop = names.index(b"event: message_start"), names.index(b"event: message_stop")
    assert names.count(b"event: ping") >= 4  # 3 tokens 0.35 s apart, a ping every 0.1 s of quiet between
    assert all(start < i < stop for i, name in enumerate(names) if name == b"event: ping")
    text = "".join(e.data["delta"].get("text", "") for e in events if e.name == "content_block_delta")
    usage = next(e.data["usage"] for e in events if e.name == "message_delta")
    assert usage["output_tokens"] == 3
    fast_events = check_anthropic_stream(fast.content)
    assert text == "".join(e.data["delta"].get("text", "") for e in fast_events if e.name == "content_block_delta")


async def test_the_anthropic_sdk_reads_a_stream_with_pings(url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=url + "/llm", api_key="unused", max_retries=0)
    async with client.messages.stream(
        model="reasoning", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:  # the SDK skips `ping` events itself
        message = await stream.get_final_message()
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 3
    assert message.content[0].type == "text" and message.content[0].text
    await client.close()


async def test_a_slow_responses_stream_sends_keep_alive_comments(url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        payload = {"model": "reasoning", "input": "hi", "stream": True}
        async with c.stream("POST", url + "/v1/responses", json=payload) as response:
            assert response.status_code == 200
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert raw.count(b": keep-alive\n\n") >= 4
    assert b"response.completed" in raw
