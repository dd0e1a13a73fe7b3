"""Queue positions on `/llm` streams, through real stub and gateway processes.

cap 1 on `reasoning`, stub hold 0.6 s, position updates at most every 0.1 s and
keep-alives every 0.2 s: several streams wait behind each other and each sees its
place count down to 1 before its `message_start`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import anthropic
import httpx
from tests.contract.admission.e2e_support import (
    admission,
    body,
    call,
    http_client,
    logged,
    parse_frames,
    starts,
    until,
    until_metric,
)
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

FAST_UPDATES = "queue_update_interval_seconds = 0.1\nping_interval_seconds = 0.2\n"
MESSAGES = "/llm/v1/messages"


def _gateway(procs: Processes, log: Path, hold: str = "0.6") -> Proc:
    stub = procs.stub("--hold", hold, "--tokens", "6", log=log)
    toml = upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 8))
    return procs.gateway(toml, server_extra=FAST_UPDATES)


async def _record(c: httpx.AsyncClient, gw: Proc, stream: bool = True) -> tuple[bytes, list[float]]:
    """A `/llm` answer's raw bytes, with the arrival time of each received piece."""
    arrivals: list[float] = []
    chunks: list[bytes] = []
    async with c.stream("POST", gw.url + MESSAGES, json=body("llm", "reasoning", stream)) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            arrivals.append(time.monotonic())
            chunks.append(chunk)
    return b"".join(chunks), arrivals


def _positions(raw: bytes) -> list[int]:
    return [e.data["position"] for e in parse_frames(raw) if e.name == "queue"]


def _without_queue_frames(raw: bytes) -> bytes:
    frames = raw.split(b"\n\n")[:-1]
    return b"".join(f + b"\n\n" for f in frames if not f.startswith(b"event: queue\n"))


async def test_positions_count_down_to_one_before_message_start(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log)
    async with http_client() as c:
        holder = asyncio.create_task(_record(c, gw))
        await until(logged(log, 1), "the first stream holds the slot")
        kinds = [True, False, True, True]  # stream, non-stream, stream, stream: all queued
        waiting = []
        for n, stream in enumerate(kinds, start=1):
            waiting.append(asyncio.create_task(_record(c, gw, stream)))
            await until_metric(c, gw, "admission.queued", n)
        (first, _), *answers = await asyncio.gather(holder, *waiting)
    # admitted at once: no queue frame at all, a plain Anthropic stream
    assert first.startswith(b"event: message_start\n"), first[:80]
    check_anthropic_stream(first)
    # non-streaming: no frames, it simply waits, then answers
    plain = answers[1][0]
    assert b"queue" not in plain and json.loads(plain)["type"] == "message"
    for arrival, (raw, _) in zip((1, 3, 4), (answers[0], answers[2], answers[3]), strict=True):
        positions = _positions(raw)
        assert positions[0] == arrival and positions[-1] == 1, positions
        assert all(a > b for a, b in itertools.pairwise(positions)), positions
        events = parse_frames(raw)
        start = [e.name for e in events].index("message_start")
        assert {e.name for e in events[:start]} == {"queue"}  # nothing else before message_start
        assert all(e.name != "queue" for e in events[start:])  # and no queue frame after it
        check_anthropic_stream(raw, allow_queue=True)
        events = check_anthropic_stream(_without_queue_frames(raw))  # still a complete stream
        assert events[-1].name == "message_stop"
    assert [line.in_flight for line in starts(log)] == [1] * 5


async def test_queue_frames_are_flushed_and_long_waits_kept_alive(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log, hold="1.2")
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "llm", "reasoning", stream=True))
        await until(logged(log, 1), "the first stream holds the slot")
        sent = time.monotonic()
        raw, arrivals = await _record(c, gw)
        await holder
    # the first queue frame came at once, long before the first token
    assert raw.startswith(b'event: queue\ndata: {"type":"queue","position":1')
    assert arrivals[0] - sent < 0.5
    waiting = raw.split(b"event: message_start")[0]
    assert waiting.count(b": keep-alive\n\n") >= 2, waiting  # comments every 0.2 s while queued
    check_anthropic_stream(raw, allow_queue=True)


async def test_official_sdk_streams_through_queue_frames(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log)
    async with anthropic.AsyncAnthropic(base_url=gw.url + "/llm", api_key="x", max_retries=0,
                                        timeout=30) as sdk, http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))  # /v1 holds the shared slot
        await until(logged(log, 1), "the /v1 request holds the slot")

        async def consume() -> tuple[list[str], anthropic.types.Message]:
            async with sdk.messages.stream(model="reasoning", max_tokens=16,
                                           messages=[{"role": "user", "content": "hi"}]) as stream:
                kinds = [str(event.type) async for event in stream]
                return kinds, await stream.get_final_message()

        tasks = []
        for n in (1, 2):
            tasks.append(asyncio.create_task(consume()))
            await until_metric(c, gw, "admission.queued", n)
        results = await asyncio.gather(*tasks)
        assert (await holder).status == 200
    for kinds, final in results:
        assert kinds[0] == "queue" and kinds.index("message_start") > 0
        assert "queue" not in kinds[kinds.index("message_start"):]
        assert final.stop_reason in ("end_turn", "max_tokens")
        assert final.content and final.content[0].type == "text" and final.content[0].text
