"""Concurrency accounting of the stub as a real subprocess: --log, --hold, disconnects."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from stub.launcher import running_stub

LINE = re.compile(r"in_flight=(\d+) max_concurrent=(\d+)")


async def post_chat(base: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = msgspec.json.encode({"model": "m", "messages": [], **fields})
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + "/v1/chat/completions", data=body) as resp,
    ):
        return resp.status, msgspec.json.decode(await resp.read())


def log_lines(path: Path) -> list[tuple[int, int]]:
    text = path.read_text() if path.exists() else ""
    return [(int(m[1]), int(m[2])) for m in LINE.finditer(text)]


async def wait_lines(path: Path, count: int) -> list[tuple[int, int]]:
    for _ in range(200):
        if len(lines := log_lines(path)) >= count:
            return lines
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {count} log lines, got {log_lines(path)}")


async def raw_chat(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a chat request on a fresh connection without reading the answer."""
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"reasoning","messages":[]}'
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 35\r\n\r\n" + body)
    return reader, writer


async def test_log_counts_concurrent_held_requests(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    log.write_text("old content in_flight=99 max_concurrent=99\n")
    with running_stub("--hold", "0.5", "--log", str(log)) as base:
        assert log_lines(log) == []  # truncated at start
        started = time.monotonic()
        results = await asyncio.gather(*(post_chat(base) for _ in range(5)))
        assert time.monotonic() - started >= 0.5
        assert [status for status, _ in results] == [200] * 5
        lines = await wait_lines(log, 5)
        assert sorted(n for n, _ in lines) == [1, 2, 3, 4, 5] and lines[-1][1] == 5
        await post_chat(base)
        assert (await wait_lines(log, 6))[-1] == (1, 5)  # max_concurrent is since start


async def test_disconnect_during_hold_stops_counting_at_once(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--hold", "30", "--log", str(log)) as base:
        first = await raw_chat(base)
        second = await raw_chat(base)
        assert await wait_lines(log, 2) == [(1, 1), (2, 2)]
        first[1].close()
        await first[1].wait_closed()
        await asyncio.sleep(0.2)
        third = await raw_chat(base)
        assert (await wait_lines(log, 3))[-1] == (2, 2)  # not in_flight=3
        for _, writer in (second, third):
            writer.close()


async def stream_response(session: aiohttp.ClientSession, base: str) -> aiohttp.ClientResponse:
    payload = {"model": "m", "messages": [], "stream": True}
    return await session.post(base + "/v1/chat/completions", json=payload)


async def test_disconnect_during_slow_stream_stops_counting(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--chunk-delay", "0.2", "--tokens", "50", "--log", str(log)) as base:
        async with aiohttp.ClientSession() as session:
            resp = await stream_response(session, base)
            assert b'"role":"assistant"' in await resp.content.readuntil(b"\n\n")
            resp.close()  # drops the connection mid-stream
        await asyncio.sleep(0.2)
        status, _ = await post_chat(base)
        assert status == 200 and (await wait_lines(log, 2))[-1] == (1, 1)


async def test_chunk_delay_spreads_frames_over_time() -> None:
    with running_stub("--chunk-delay", "0.1", "--tokens", "3") as base:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            resp = await stream_response(session, base)
            assert resp.headers["content-type"].startswith("text/event-stream")
            first = await resp.content.readuntil(b"\n\n")
            first_at = time.monotonic() - started
            rest = await resp.read()
            total = time.monotonic() - started
    assert b"role" in first and rest.endswith(b"data: [DONE]\n\n")
    assert first_at < 0.5 and total >= 0.2  # 3 tokens, 0.1 s apart (the pacing: test_stub_scheduler.py)
