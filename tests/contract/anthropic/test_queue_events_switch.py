"""Queue frames a strict client survives, through real stub and gateway processes.

A strict client (the Vercel AI SDK's Anthropic provider, for one) validates every event name
against Anthropic's list and fails the whole request on `event: queue`. With
`x-gateway-queue-events: off` (or `[server] queue_events = false`) a queued stream carries
its position in SSE comments instead, which every SSE parser ignores.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import anthropic
import httpx
import pytest
from tests.contract.admission.e2e_support import (
    admission,
    body,
    call,
    http_client,
    logged,
    starts,
    until,
    until_metric,
)
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

FAST_UPDATES = "queue_update_interval_seconds = 0.1\nping_interval_seconds = 0.2\n"
MESSAGES = "/llm/v1/messages"
HEADER = "x-gateway-queue-events"

# Every event name of Anthropic's Messages stream; a strict client accepts nothing else.
ANTHROPIC_EVENTS = frozenset({
    "message_start", "content_block_start", "content_block_delta", "content_block_stop",
    "message_delta", "message_stop", "ping", "error",
})


class UnknownEvent(Exception):
    pass


def strict_events(raw: bytes) -> list[str]:
    """Event names as a strict client parses them: comments skipped, an unknown name fails."""
    names = []
    for frame in raw.decode().split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
                if name not in ANTHROPIC_EVENTS:
                    raise UnknownEvent(name)
                names.append(name)
    return names


def _gateway(procs: Processes, log: Path, server_extra: str = "") -> Proc:
    stub = procs.stub("--hold", "0.6", "--tokens", "6", log=log)
    toml = upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 8))
    return procs.gateway(toml, server_extra=FAST_UPDATES + server_extra)


async def _queued_stream(
    c: httpx.AsyncClient, gw: Proc, log: Path, headers: dict[str, str] | None = None
) -> bytes:
    """The raw bytes of a `/llm` stream that had to wait behind one holding the only slot."""
    holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
    await until(logged(log, len(starts(log)) + 1), "the /v1 request holds the slot")
    chunks = []
    async with c.stream("POST", gw.url + MESSAGES, json=body("llm", "reasoning", True),
                        headers=headers or {}) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            chunks.append(chunk)
    assert (await holder).status == 200
    return b"".join(chunks)


def _before_message_start(raw: bytes) -> bytes:
    head, found, _ = raw.partition(b"event: message_start\n")
    assert found, raw[:200]
    return head


async def test_header_off_sends_comments_a_strict_parser_ignores(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log)
    async with http_client() as c:
        quiet = await _queued_stream(c, gw, log, {HEADER: "off"})
        loud = await _queued_stream(c, gw, log)
    waiting = _before_message_start(quiet)
    assert b"event:" not in waiting and b"data:" not in waiting, waiting  # only comments
    assert waiting.startswith(b": queued position=1"), waiting
    names = strict_events(quiet)  # the strict client completes normally
    assert names[0] == "message_start" and names[-1] == "message_stop"
    check_anthropic_stream(quiet)
    # Without the header the default stays the `event: queue` frame, which a strict client rejects.
    assert loud.startswith(b'event: queue\ndata: {"type":"queue","position":1'), loud[:120]
    with pytest.raises(UnknownEvent, match="queue"):
        strict_events(loud)
    check_anthropic_stream(loud, allow_queue=True)


async def test_server_switch_off_and_header_on(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log, server_extra="queue_events = false\n")
    async with http_client() as c:
        quiet = await _queued_stream(c, gw, log)
        loud = await _queued_stream(c, gw, log, {HEADER: "ON"})
    assert b"event:" not in _before_message_start(quiet)
    assert strict_events(quiet)[-1] == "message_stop"
    assert loud.startswith(b"event: queue\n")


async def test_official_sdk_with_queue_events_off(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log)
    async with anthropic.AsyncAnthropic(base_url=gw.url + "/llm", api_key="x", max_retries=0, timeout=30,
                                        default_headers={HEADER: "off"}) as sdk, http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
        await until(logged(log, 1), "the /v1 request holds the slot")
        async with sdk.messages.stream(model="reasoning", max_tokens=16,
                                       messages=[{"role": "user", "content": "hi"}]) as stream:
            await until_metric(c, gw, "admission.queued", 1)
            kinds = [str(event.type) async for event in stream]
            final = await stream.get_final_message()
        assert (await holder).status == 200
    assert "queue" not in kinds and kinds[0] == "message_start"
    assert final.content and final.content[0].type == "text" and final.content[0].text


async def test_a_bad_header_value_is_a_400_in_the_anthropic_shape(procs: Processes, tmp_path: Path) -> None:
    gw = _gateway(procs, tmp_path / "stub.log")
    async with http_client() as c:
        response = await c.post(gw.url + MESSAGES, json=body("llm", "reasoning", True), headers={HEADER: "maybe"})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert HEADER in error["error"]["message"]
