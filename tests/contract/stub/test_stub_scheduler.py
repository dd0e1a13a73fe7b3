"""The stub as vLLM's scheduler and cache show it, as a real subprocess: `--max-num-seqs`
(waiting inside, `waiting=` on --log lines, `GET /metrics`), the pacing of `--chunk-delay`,
`--prefix-cache` and `--fault-after`."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from adapters.outbound.vllm_load import VllmGauges, parse_load
from stub.launcher import running_stub

WAITING = re.compile(r"in_flight=(\d+) max_concurrent=(\d+) .*waiting=(\d+)")


async def chat(session: aiohttp.ClientSession, base: str, **fields: Any) -> tuple[int, dict[str, Any], float]:
    """Status, body and the time it took."""
    started = time.monotonic()
    body = msgspec.json.encode({"model": "m", "messages": [], **fields})
    async with session.post(base + "/v1/chat/completions", data=body) as resp:
        return resp.status, msgspec.json.decode(await resp.read()), time.monotonic() - started


async def page(session: aiohttp.ClientSession, base: str) -> list[tuple[str, dict[str, str], float]]:
    async with session.get(base + "/metrics") as resp:
        assert resp.status == 200 and resp.content_type == "text/plain"
        text = await resp.text()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


async def gauges(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """`vllm:num_requests_running{MODEL}` and `vllm:num_requests_waiting{MODEL}`."""
    return {f"{name}{{{labels['model_name']}}}": value for name, labels, value in await page(session, base)
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting")}  # fmt: skip


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_max_num_seqs_holds_the_rest_inside_in_arrival_order(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--max-num-seqs", "2", "--hold", "0.4", "--log", str(log), "--models", "reasoning") as base:
        async with aiohttp.ClientSession() as session:
            assert await gauges(session, base) == {
                "vllm:num_requests_running{reasoning}": 0, "vllm:num_requests_waiting{reasoning}": 0,
            }
            tasks = []
            for n in range(5):  # one at a time, so arrival order is known
                tasks.append(asyncio.create_task(chat(session, base, model="reasoning", messages=user(f"r{n}"))))
                await asyncio.sleep(0.03)
            assert await gauges(session, base) == {
                "vllm:num_requests_running{reasoning}": 2, "vllm:num_requests_waiting{reasoning}": 3,
            }
            results = await asyncio.gather(*tasks)
            assert await gauges(session, base) == {
                "vllm:num_requests_running{reasoning}": 0, "vllm:num_requests_waiting{reasoning}": 0,
            }
    assert [status for status, _, _ in results] == [200] * 5
    took = [t for _, _, t in results]
    # two waves of 0.4 s and a third: the hold counts from the start of generation
    assert took[0] < 0.4 + 0.3 and 0.8 - 0.1 < took[2] < 0.8 + 0.3 and took[4] > 1.2 - 0.15
    lines = [tuple(int(g) for g in m.groups()) for m in WAITING.finditer(log.read_text())]
    assert [w for _, _, w in lines] == [0, 0, 1, 2, 3]
    assert [n for n, _, _ in lines] == [1, 2, 3, 4, 5] and lines[-1][1] == 5  # in_flight counts the waiting


async def test_metrics_are_the_families_vllm_0_32_exports_for_its_scheduler() -> None:
    """Labelled `engine` and `model_name` (sorted, as vLLM's page has them), waiting split by
    reason (the stub's waiters all wait for a slot), KV-cache usage; read by the gateway's parser."""
    with running_stub("--max-num-seqs", "2", "--hold", "0.5", "--models", "reasoning") as base:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(chat(session, base, model="reasoning")) for _ in range(3)]
            await asyncio.sleep(0.2)
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
            samples = await page(session, base)
            await asyncio.gather(*tasks)
    engine = {"engine": "0", "model_name": "reasoning"}
    assert samples == [
        ("vllm:num_requests_running", engine, 2.0),
        ("vllm:num_requests_waiting", engine, 1.0),
        ("vllm:num_requests_waiting_by_reason", {**engine, "reason": "capacity"}, 1.0),
        ("vllm:num_requests_waiting_by_reason", {**engine, "reason": "deferred"}, 0.0),
        ("vllm:kv_cache_usage_perc", engine, 1.0),
    ]
    assert 'vllm:num_requests_waiting_by_reason{engine="0",model_name="reasoning",reason="capacity"} 1.0' in text
    assert parse_load(text) == VllmGauges(running=2, waiting=1, deferred=0)


async def test_a_client_gone_while_waiting_inside_never_generates(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--max-num-seqs", "1", "--hold", "0.5", "--log", str(log)) as base:
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(chat(session, base))
            await asyncio.sleep(0.1)
            gone = asyncio.create_task(chat(session, base))
            await asyncio.sleep(0.1)
            assert (await gauges(session, base))["vllm:num_requests_waiting{stub}"] == 1
            gone.cancel()
            await asyncio.sleep(0.1)
            assert await gauges(session, base) == {
                "vllm:num_requests_running{stub}": 1, "vllm:num_requests_waiting{stub}": 0,
            }
            third = await chat(session, base)  # starts when the first ends, not after the one gone
            await first
    assert third[0] == 200 and third[2] < 0.3 + 0.5 + 0.3
    assert [m[3] for m in WAITING.finditer(log.read_text())] == ["0", "1", "1"]


async def test_without_max_num_seqs_nothing_changes(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--hold", "0.3", "--log", str(log)) as base:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(chat(session, base) for _ in range(4)))
            async with session.get(base + "/metrics") as resp:
                assert resp.status == 404
    assert all(took < 0.3 + 0.3 for _, _, took in results)
    assert "waiting=" not in log.read_text() and "cached_tokens=" not in log.read_text()


async def frame_times(base: str, **fields: Any) -> list[tuple[float, bytes]]:
    """Each SSE frame of a stream with its arrival time, from the request's start."""
    payload = {"model": "m", "messages": [], "stream": True, **fields}
    out: list[tuple[float, bytes]] = []
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(base + "/v1/chat/completions", json=payload) as resp:
            while frame := await resp.content.readuntil(b"\n\n"):
                out.append((time.monotonic() - started, frame))
    return out


async def test_chunk_delay_paces_tokens_and_the_frames_after_the_last_leave_at_once() -> None:
    delay = 0.15
    with running_stub("--chunk-delay", str(delay), "--tokens", "4") as base:
        frames = await frame_times(base, stream_options={"include_usage": True})
    kinds = [
        "role" if b'"role"' in f else "done" if b"[DONE]" in f else "usage" if b'"usage"' in f
        else "finish" if b'"finish_reason":"stop"' in f else "token"
        for _, f in frames
    ]  # fmt: skip
    assert kinds == ["role", "token", "token", "token", "token", "finish", "usage", "done"]
    at = [t for t, _ in frames]
    assert at[1] - at[0] < 0.05  # the role chunk goes with the first token
    gaps = [b - a for a, b in itertools.pairwise(at[1:5])]
    assert all(delay - 0.03 < gap < delay + 0.1 for gap in gaps), gaps  # between tokens: paced
    assert at[-1] - at[4] < 0.03  # finish, usage and [DONE] follow the last token at once
    assert 3 * delay - 0.03 < at[-1] < 3 * delay + 0.3


async def test_prefix_cache_reports_cached_tokens_and_skips_their_prefill(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    prompt = " ".join(f"w{i}" for i in range(200))  # 200 tokens: 12 full blocks of 16
    with running_stub("--prefix-cache", "--prefill-ms-per-1k-tokens", "2000", "--log", str(log)) as base:
        async with aiohttp.ClientSession() as session:
            cold = await chat(session, base, messages=user(prompt))
            warm = await chat(session, base, messages=user(prompt + " and more"))
            frames = await frame_times(base, messages=user(prompt), stream_options={"include_usage": True})
    assert cold[1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and cold[2] > 0.4 - 0.05
    assert warm[1]["usage"]["prompt_tokens"] == 202
    assert warm[1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}
    assert warm[2] < 0.4 - 0.15  # 10 uncached tokens: 20 ms of prefill
    usage = msgspec.json.decode(frames[-2][1].removeprefix(b"data: "))["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 192}
    assert re.findall(r"prompt_tokens=(\d+) cached_tokens=(\d+)", log.read_text()) == [
        ("200", "0"), ("202", "192"), ("200", "192"),
    ]


async def test_fault_after_answers_the_first_requests_then_fails() -> None:
    with running_stub("--fault", "http-5xx", "--fault-after", "2") as base:
        async with aiohttp.ClientSession() as session:
            statuses = [(await chat(session, base))[0] for _ in range(4)]
    assert statuses == [200, 200, 500, 500]
