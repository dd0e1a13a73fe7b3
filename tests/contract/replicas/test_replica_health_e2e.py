"""Replica health end to end: a real gateway over real stub replicas on loopback.

- A replica that starts failing (`--fault reset-before-headers --fault-after 10`) is ejected
  after `consecutive_failures`, every client still gets 200 (the one safe retry, the access log
  says `retried_from`), it returns after its ejection time and, still failing, is ejected again
  for twice as long.
- `max_ejection_percent`: of two failing replicas, the last eligible one is never ejected;
  a 4xx never ejects.
- A replica loaded directly (a client talking to the stub itself) to `waiting > 0` gets no
  request from the gateway within two scrape intervals; the others take the load; once its
  queue is empty it gets traffic again. A replica whose `/metrics` hangs or answers 500 is
  still used (fail static).

Short intervals and ejection times keep every test within seconds; every load loop is
bounded in count and time."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from tests.contract.admission.e2e_support import Reply, call, http_client, until
from tests.support.fake_chat import chat_answer
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.replicas import endpoints_toml

from domain.replicas import endpoint_of

NOWHERE = "http://127.0.0.1:9"  # the upstream's identity only: nothing listens there
ADMISSION = {"sequence_slots": 16, "max_in_flight": 12, "queue_depth": 16, "queue_timeout_seconds": 10}


def health_toml(urls: list[str], **keys: object) -> str:
    """The upstream over `urls`, with more `[endpoints]` keys (TOML values as Python literals)."""
    text = upstream_toml("reasoning", NOWHERE, ["reasoning"], ADMISSION) + endpoints_toml(
        "reasoning", urls=urls, slots=4, cap=4)
    for key, value in keys.items():
        text += f"{key} = {str(value).lower() if isinstance(value, bool) else value}\n"
    return text


def access_log(gw: Proc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.text().splitlines() if line.startswith('{"request_id"')]


def log_lines(gw: Proc, text: str) -> list[str]:
    return [line for line in gw.text().splitlines() if text in line]


async def endpoint_states(c: httpx.AsyncClient, gw: Proc) -> dict[str, float]:
    page = samples((await c.get(gw.ops_url + "/metrics")).text)
    return {labels["state"]: v for name, labels, v in page if name == "gateway_upstream_endpoints"}


async def ejections(c: httpx.AsyncClient, gw: Proc) -> dict[str, float]:
    page = samples((await c.get(gw.ops_url + "/metrics")).text)
    return {labels["endpoint"]: v for name, labels, v in page if name == "gateway_endpoint_ejections_total"}


class Driver:
    """Requests one after another (alternating /v1 and /llm, plain and streamed) until stopped,
    at most `limit` of them and `seconds` long."""

    def __init__(self, gw: Proc, limit: int = 3000, seconds: float = 15.0, pause: float = 0.0) -> None:
        self.gw, self.limit, self.seconds, self.pause = gw, limit, seconds, pause
        self.replies: list[Reply] = []
        self._stop = asyncio.Event()

    async def run(self, c: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + self.seconds
        for i in range(self.limit):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            self.replies.append(await call(c, self.gw, "v1" if i % 2 else "llm", "reasoning", stream=i % 4 >= 2))
            if self.pause:
                await asyncio.sleep(self.pause)

    def stop(self) -> None:
        self._stop.set()


async def test_a_failing_replica_is_ejected_retried_around_and_ejected_for_twice_as_long_when_back(
    procs: Processes, tmp_path: Path
) -> None:
    *good, bad = procs.together([
        *(partial(procs.stub, log=tmp_path / f"{n}.log") for n in "ab"),
        partial(procs.stub, "--fault", "reset-before-headers", "--fault-after", "10", log=tmp_path / "c.log")])
    gw = procs.gateway(health_toml([s.url for s in (*good, bad)], consecutive_failures=5,
                                   base_ejection_seconds=1.0, max_ejection_seconds=10, load_metrics=False))
    transitions: list[tuple[float, float]] = []  # (when, replicas ejected then), each change
    async with http_client() as c:
        # A pause between requests: the 5 failures after a return take a few hundred ms, so the
        # metric's poll sees the return before the next ejection.
        driver = Driver(gw, pause=0.02)
        driving = asyncio.create_task(driver.run(c))
        deadline = time.monotonic() + 12
        last = 0.0
        while time.monotonic() < deadline and len(transitions) < 4 and not driving.done():
            ejected = (await endpoint_states(c, gw)).get("ejected", 0.0)
            if ejected != last:
                transitions.append((time.monotonic(), ejected))
                last = ejected
            await asyncio.sleep(0.02)
        driver.stop()
        await driving
        counted = await ejections(c, gw)

    statuses = collections.Counter(r.status for r in driver.replies)
    assert set(statuses) == {200}, [r.text for r in driver.replies if r.status != 200][:3]
    assert [n for _, n in transitions] == [1.0, 0.0, 1.0, 0.0], transitions
    first, second = transitions[1][0] - transitions[0][0], transitions[3][0] - transitions[2][0]
    assert 0.8 <= first <= 1.6, first  # base_ejection_seconds
    assert 1.8 <= second <= 2.6, second  # ejected again at once: twice as long
    endpoint = endpoint_of(bad.url)
    # The driver stops once the second return is seen: a third ejection may have begun by then.
    ejected_lines = log_lines(gw, "ejected for")
    assert counted == {**dict.fromkeys((endpoint_of(s.url) for s in good), 0.0), endpoint: len(ejected_lines)}
    assert len(ejected_lines) in (2, 3) and all(endpoint in line for line in ejected_lines)
    assert "ejected for 1s" in ejected_lines[0] and "ejected for 2s" in ejected_lines[1]
    assert len(log_lines(gw, f"replica {endpoint} returns after its ejection")) == 2

    logged = access_log(gw)
    assert len(logged) == len(driver.replies)
    served_by_bad = [e for e in logged if e["endpoint"] == endpoint]
    assert len(served_by_bad) == 10 and all(e["retried_from"] is None for e in served_by_bad)  # --fault-after 10
    retried = [e for e in logged if e["retried_from"] is not None]
    assert len(retried) >= 10  # 5 failures before each ejection, each sent once more
    assert {e["retried_from"] for e in retried} == {endpoint}
    assert {e["endpoint"] for e in retried} <= {endpoint_of(s.url) for s in good}
    assert {e["status"] for e in retried} == {200} and {e["stream"] for e in retried} == {True, False}


async def test_of_two_failing_replicas_the_last_eligible_one_is_never_ejected(procs: Processes, tmp_path: Path) -> None:
    stubs = procs.together(partial(procs.stub, "--fault", "reset-before-headers", log=tmp_path / f"{n}.log")
                           for n in "ab")
    gw = procs.gateway(health_toml([s.url for s in stubs], consecutive_failures=3, base_ejection_seconds=30,
                                   max_ejection_percent=100, load_metrics=False))
    async with http_client() as c:
        replies = [await call(c, gw, "v1", "reasoning") for _ in range(20)]
        states = await endpoint_states(c, gw)
        counted = await ejections(c, gw)
    assert all(r.status >= 500 for r in replies)  # both fail: the error is the answer
    assert states == {"ready": 1.0, "ejected": 1.0, "draining": 0.0}
    assert sorted(counted.values()) == [0.0, 1.0]
    assert len(log_lines(gw, "ejected for")) == 1
    kept = endpoint_of(next(s.url for s in stubs if counted[endpoint_of(s.url)] == 0.0))
    assert sum(e["endpoint"] == kept for e in access_log(gw)[-10:]) == 10  # it still gets every request


async def test_a_4xx_from_a_replica_never_ejects_it(procs: Processes, tmp_path: Path) -> None:
    refusing, fine = procs.together([partial(procs.stub, "--fault", "http-4xx", log=tmp_path / "a.log"),
                                     partial(procs.stub, log=tmp_path / "b.log")])
    gw = procs.gateway(health_toml([refusing.url, fine.url], consecutive_failures=2, base_ejection_seconds=30,
                                   load_metrics=False))
    async with http_client() as c:
        replies = [await call(c, gw, "v1", "reasoning", stream=i % 2 == 1) for i in range(12)]
        states = await endpoint_states(c, gw)
    assert collections.Counter(r.status for r in replies) == {400: 6, 200: 6}  # rotating, never retried
    assert states["ejected"] == 0.0 and not log_lines(gw, "ejected for")
    assert all(e["retried_from"] is None for e in access_log(gw))


async def load_directly(base: str, count: int) -> asyncio.Task[list[int]]:
    """`count` chat requests straight to a stub (as another gateway or a batch job sends them)."""
    async def all_of_them() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as direct:
            body = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}
            replies = await asyncio.gather(*(direct.post(base + "/v1/chat/completions", json=body)
                                             for _ in range(count)))
            return [r.status_code for r in replies]

    task = asyncio.create_task(all_of_them())
    await asyncio.sleep(0.1)
    return task


async def reported(c: httpx.AsyncClient, url: str) -> tuple[int, int]:
    page = samples((await c.get(url + "/metrics")).text)
    values = {name: v for name, _, v in page if name.startswith("vllm:num_requests_")}
    return int(values["vllm:num_requests_running"]), int(values["vllm:num_requests_waiting"])


async def test_a_replica_loaded_from_outside_gets_nothing_until_its_queue_empties(
    procs: Processes, tmp_path: Path
) -> None:
    busy, *others = procs.together([
        partial(procs.stub, "--max-num-seqs", "1", "--hold", "1", log=tmp_path / "busy.log"),
        *(partial(procs.stub, "--max-num-seqs", "4", "--hold", "0.05", log=tmp_path / f"{n}.log") for n in "ab")])
    interval = 0.2
    gw = procs.gateway(health_toml([busy.url, *(s.url for s in others)], load_metrics_interval_seconds=interval))
    endpoint = endpoint_of(busy.url)
    async with http_client() as c:
        async def all_reported() -> bool:
            page = samples((await c.get(gw.ops_url + "/metrics")).text)
            return len({labels["endpoint"] for name, labels, _ in page if name == "gateway_endpoint_reported"}) == 3

        await until(all_reported, "every replica's load is read")
        outside = await load_directly(busy.url, 3)  # 1 running, 2 waiting: for about 2 s
        assert await reported(c, busy.url) == (1, 2)
        await asyncio.sleep(2 * interval)
        window = time.monotonic()
        replies = await asyncio.gather(*(call(c, gw, "v1", "reasoning") for _ in range(6)))
        replies += [await call(c, gw, "llm", "reasoning", stream=True) for _ in range(6)]
        assert time.monotonic() - window < 1.5, "the window ended before the replica's queue did"
        assert (await reported(c, busy.url))[1] > 0
        first = access_log(gw)
        assert len(first) == 12 and all(e["endpoint"] != endpoint for e in first)
        assert {e["endpoint"] for e in first} == {endpoint_of(s.url) for s in others}
        page = samples((await c.get(gw.ops_url + "/metrics")).text)
        waiting = {labels["endpoint"]: v for name, labels, v in page
                   if name == "gateway_endpoint_reported" and labels["kind"] == "waiting"}
        assert waiting[endpoint] > 0

        assert await outside == [200, 200, 200]  # its queue is empty now
        await asyncio.sleep(2 * interval)
        replies += [await call(c, gw, "v1", "reasoning") for _ in range(6)]
    assert {r.status for r in replies} == {200}
    assert any(e["endpoint"] == endpoint for e in access_log(gw)[12:]), "it gets traffic again"


@contextlib.asynccontextmanager
async def fake_replica(metrics: str) -> AsyncIterator[tuple[str, list[float]]]:
    """A loopback replica answering chat at once, whose `/metrics` hangs (`"hang"`) or answers 500."""
    chats: list[float] = []
    released = asyncio.Event()

    async def chat(request: web.Request) -> web.Response:
        chats.append(time.monotonic())
        return await chat_answer(request)

    async def page(_: web.Request) -> web.Response:
        if metrics == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 5)
        return web.Response(status=500, text="no")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", chats
    finally:
        released.set()
        await runner.cleanup()


async def test_a_replica_whose_metrics_hang_or_fail_is_still_used(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--max-num-seqs", "4", log=tmp_path / "a.log")
    async with fake_replica("hang") as (hanging, hung_chats), fake_replica("500") as (failing, failed_chats):
        gw = procs.gateway(health_toml([stub.url, hanging, failing], load_metrics_interval_seconds=0.2))
        async with http_client() as c:
            await until(lambda: len(log_lines(gw, "reading its load failed")) == 2, "both reads fail")
            await asyncio.sleep(0.6)  # three intervals more (past the 2 a report would count)
            replies = [await call(c, gw, "v1", "reasoning") for _ in range(12)]
    assert {r.status for r in replies} == {200}
    assert len(hung_chats) >= 3 and len(failed_chats) >= 3
