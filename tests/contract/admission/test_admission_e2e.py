"""Admission end to end: real stub and gateway processes, clients on loopback.

The stub logs one `chat start in_flight=N ... model="M"` line per request it starts,
so the log shows the order in which requests reached the upstream and how many were
in flight. Gauges and counters come from the gateway's own `/metrics`. Every wait is
a bounded poll; time bounds are generous next to the stub's hold.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

from tests.contract.admission.e2e_support import (
    admission,
    call,
    hang_up,
    http_client,
    logged,
    open_raw,
    parse_frames,
    scrape,
    starts,
    until,
    until_metric,
)
from tests.support.processes import Processes, upstream_toml

CAP_1 = admission(max_in_flight=1, queue_depth=8)


async def test_arrival_order_is_kept_across_both_surfaces(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "0.5", log=log)
    names = [f"fifo-{i}" for i in range(6)]  # several model names on ONE upstream
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning", *names], CAP_1))
    async with http_client() as c:
        tasks = [asyncio.create_task(call(c, gw, "v1", "reasoning"))]
        await until(logged(log, 1), "the first request holds the slot")
        for i, name in enumerate(names):  # alternate /llm and /v1, streaming and not
            surface = "llm" if i % 2 else "v1"
            tasks.append(asyncio.create_task(call(c, gw, surface, name, stream=i % 4 >= 2)))
            await until_metric(c, gw, "admission.queued", i + 1)
            await asyncio.sleep(0.05)
        replies = await asyncio.gather(*tasks)
    assert [r.status for r in replies] == [200] * 7, [r.text for r in replies]
    lines = starts(log)
    assert [line.model for line in lines] == ["reasoning", *names]  # strict arrival order
    assert {line.in_flight for line in lines} == {1}


async def test_queued_hang_ups_never_reach_the_upstream(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1.5", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], CAP_1))
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "v1", "reasoning"))
        await until(logged(log, 1), "the holder reached the stub")
        before = await scrape(c, gw)
        conns = [await open_raw(gw, surface, "reasoning", stream)
                 for surface in ("v1", "llm") for stream in (False, True)]
        await until_metric(c, gw, "queue_depth", 4)
        llm_stream_reader = conns[3][0]
        await asyncio.wait_for(llm_stream_reader.readuntil(b"event: queue"), 5)  # already answering 200
        for _, writer in conns:
            await hang_up(writer)
        await until_metric(c, gw, "queue_depth", 0, timeout=3)
        after = await scrape(c, gw)
        assert after["slots_in_use"] == 1  # still only the holder
        assert after["admission.abandoned"] - before.get("admission.abandoned", 0) == 4
        assert (await holder).status == 200
        await until_metric(c, gw, "slots_in_use", 0)
        await asyncio.sleep(0.3)
        assert len(starts(log)) == 1  # none of the four ever reached the stub
        # no ghost holds a slot: the next request is admitted at once, without queueing
        reply = await call(c, gw, "llm", "reasoning")
        final = await scrape(c, gw)
    assert reply.status == 200
    assert final["admission.queued"] == after["admission.queued"]
    assert (final["slots_in_use"], final["queue_depth"]) == (0, 0)
    assert [line.in_flight for line in starts(log)] == [1, 1]


async def test_mid_request_hang_up_frees_the_slot_at_once(procs: Processes, tmp_path: Path) -> None:
    logs = {"held": tmp_path / "held.log", "slow": tmp_path / "slow.log"}
    held, slow = procs.together([
        partial(procs.stub, "--hold", "5", log=logs["held"]),  # non-streaming answers wait 5 s
        partial(procs.stub, "--chunk-delay", "0.2", "--tokens", "60", log=logs["slow"])])  # 12 s streams
    gw = procs.gateway(upstream_toml("held", held.url, ["held"], CAP_1)
                       + upstream_toml("slow", slow.url, ["slow"], CAP_1))
    cases = [("v1", False, "held"), ("llm", False, "held"), ("llm", True, "slow"), ("v1", True, "slow")]
    async with http_client() as c:
        for surface, stream, upstream in cases:
            log = logs[upstream]
            seen = len(starts(log))
            reader, writer = await open_raw(gw, surface, upstream, stream)
            await until(logged(log, seen + 1), "request A reached the stub")
            if stream:
                await asyncio.wait_for(reader.readuntil(b"delta"), 5)  # tokens are flowing
            _, queued = await open_raw(gw, "llm" if surface == "v1" else "v1", upstream, stream)
            await until_metric(c, gw, "queue_depth", 1, upstream=upstream)
            hung_up_at = time.time()
            await hang_up(writer)
            await until(logged(log, seen + 2), "B admitted", timeout=3)
            line = starts(log)[-1]
            case = (surface, stream)
            assert line.in_flight == 1, case  # the stub dropped A: aborted upstream, as vLLM would
            assert line.at - hung_up_at < 1.0, case  # B got A's slot within a fraction of a second
            await hang_up(queued)
            await until_metric(c, gw, "slots_in_use", 0, upstream=upstream)
        final = {u: await scrape(c, gw, u) for u in logs}
    assert all((m["slots_in_use"], m["queue_depth"]) == (0, 0) for m in final.values()), final


async def test_failing_upstream_gives_fast_502s_without_queue_build_up(
    procs: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--error-rate", "1", "--hold", "3", log=log)  # 500 at once, before any hold
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 16)))
    started = time.monotonic()
    async with http_client() as c:
        sequential = [await call(c, gw, surface, "reasoning", stream)
                      for surface in ("v1", "llm") for stream in (False, True)]
        shapes = [("v1", False), ("llm", False), ("v1", True)] * 4
        concurrent = await asyncio.gather(*(call(c, gw, s, "reasoning", st) for s, st in shapes))
        elapsed = time.monotonic() - started
        metrics = await scrape(c, gw)
    replies = sequential + list(concurrent)
    assert [r.status for r in replies] == [502] * 16, [r.text for r in replies]
    assert elapsed < 2.5  # 16 requests at cap 1: none waited behind a hold or a queue
    assert max(r.elapsed for r in replies) < 1.5
    assert sequential[0].json()["type"].endswith("upstream-error")
    assert sequential[2].json()["error"]["type"] == "api_error"
    assert (metrics["slots_in_use"], metrics["queue_depth"]) == (0, 0)
    assert metrics["admission.timed_out"] == metrics["admission.rejected_full"] == 0
    assert starts(log) == []  # the stub refused before starting anything


async def test_queue_timeout_is_a_503_with_retry_after(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "3", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 8, timeout=1)))
    async with http_client() as c:
        holder = asyncio.create_task(call(c, gw, "llm", "reasoning"))
        await until(logged(log, 1), "the holder reached the stub")
        shapes = [("v1", False), ("llm", False), ("v1", True), ("llm", True)]
        v1, llm, v1_stream, llm_stream = await asyncio.gather(
            *(call(c, gw, s, "reasoning", stream) for s, stream in shapes))
        metrics = await scrape(c, gw)
        holder.cancel()
    for reply in (v1, llm, v1_stream):
        assert reply.status == 503, reply.text
        assert int(reply.headers["retry-after"]) >= 1
        assert 0.9 <= reply.elapsed < 2.5, reply.elapsed
    for reply in (v1, v1_stream):
        assert reply.headers["content-type"].startswith("application/problem+json")
        assert reply.json()["type"].endswith("queue-timeout")
    assert llm.json()["error"]["type"] == "overloaded_error"
    # a queued /llm stream has answered 200 with queue frames: the timeout is an in-stream error
    assert llm_stream.status == 200 and 0.9 <= llm_stream.elapsed < 2.5
    events = parse_frames(llm_stream.body)
    assert events[0].name == "queue" and {e.name for e in events[:-1]} == {"queue"}
    assert events[-1].name == "error" and events[-1].data["error"]["type"] == "overloaded_error"
    assert metrics["admission.timed_out"] == 4
    assert len(starts(log)) == 1


async def test_saturated_upstream_shares_one_cap_and_blocks_no_other(
    procs: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "stub.log"
    reasoning, qwen = procs.together([partial(procs.stub, "--hold", "1.5", log=log), procs.stub])
    gw = procs.gateway(
        upstream_toml("reasoning", reasoning.url, ["reasoning", "reasoning-b"], admission(2, 2))
        + upstream_toml("qwen", qwen.url, ["qwen2.5:3b-instruct"]))
    load = [("v1", "reasoning"), ("llm", "reasoning-b"), ("llm", "reasoning"), ("v1", "reasoning-b")]
    async with http_client() as c:
        tasks = [asyncio.create_task(call(c, gw, s, m)) for s, m in load]
        await until_metric(c, gw, "queue_depth", 2)
        busy = await scrape(c, gw)
        full = [await call(c, gw, s, m) for s, m in (("v1", "reasoning-b"), ("llm", "reasoning"))]
        other = [await call(c, gw, s, "qwen2.5:3b-instruct", stream) for s in ("v1", "llm")
                 for stream in (False, True)]
        busy_after = await scrape(c, gw)
        replies = await asyncio.gather(*tasks)
        idle = await scrape(c, gw)
        qwen_metrics = await scrape(c, gw, "qwen")
    assert busy["slots_in_use"] == busy["slots_limit"] == 2
    assert busy["queue_depth"] == busy["queue_limit"] == 2
    assert [r.status for r in full] == [503, 503]  # both names, both surfaces: one full queue
    assert all(int(r.headers["retry-after"]) >= 1 for r in full)
    assert [r.status for r in other] == [200] * 4
    assert max(r.elapsed for r in other) < 1.0  # well under the 1.5 s hold: not behind reasoning
    assert busy_after["slots_in_use"] == 2 and busy_after["queue_depth"] == 2  # still saturated
    assert [r.status for r in replies] == [200] * 4
    assert (idle["slots_in_use"], idle["queue_depth"]) == (0, 0)
    assert "slots_limit" not in qwen_metrics  # uncapped
    assert max(line.in_flight for line in starts(log)) == 2


async def test_metrics_name_every_admission_series(procs: Processes) -> None:
    stub = procs.stub()
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], CAP_1))
    async with http_client() as c:
        response = await c.get(gw.ops_url + "/metrics")
        metrics = await scrape(c, gw)
        public = await c.get(gw.url + "/metrics")
    assert public.status_code == 404 and public.json() == {"status_code": 404, "detail": "Not Found"}
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    outcomes = [f"admission.{o}" for o in ("admitted", "queued", "rejected_full", "timed_out", "abandoned")]
    for series in ("slots_in_use", "slots_limit", "queue_depth", "queue_limit", *outcomes):
        assert series in metrics, (series, response.text)
    assert metrics["slots_limit"] == 1 and metrics["queue_limit"] == 8
