"""Reading vLLM's own load: real stub processes with `--max-num-seqs` loaded directly (a client
talking to the stub, not through the gateway), and loopback servers whose /metrics is vLLM
0.32's page (`tests/fixtures/vllm-0.32-metrics.txt`) served slowly, hangs, answers 500, is too
large, or does not exist. What the scraper reports, how long a report counts, what the pick
rule makes of it (`domain.load_reports`), and the gauges it exports."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import msgspec
import pytest
from aiohttp import web
from tests.support.vllm_page import Engine, fixture, vllm_page

from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from adapters.outbound.replica_metrics import ReplicaMetrics
from adapters.outbound.vllm_load import MAX_BODY, VllmLoadScraper
from domain.load_reports import LoadReport, saturated, saturated_replicas
from stub.launcher import running_stub

PAGE = 'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 3\n'


class FakeClock:
    """`ports.clock.Clock`, moved by hand."""

    def __init__(self, at: float = 100.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


class FakeGate:
    """The metrics adapter's gate, with nothing admitted: only the load families matter here."""

    def upstreams(self) -> list[str]:
        return []


@pytest.fixture
async def pool() -> AsyncIterator[ReplicaSessions]:
    sessions = ReplicaSessions()
    yield sessions
    await sessions.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def metrics_server() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[str, list[float]]]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> tuple[str, list[float]]:
        hits: list[float] = []

        async def counted(request: web.Request) -> web.StreamResponse:
            hits.append(time.monotonic())
            return await handler(request)

        app = web.Application()
        app.router.add_get("/metrics", counted)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        runners.append(runner)
        return f"http://127.0.0.1:{sock.getsockname()[1]}", hits

    yield start
    for runner in runners:
        await runner.cleanup()


async def load_directly(base: str, count: int) -> list[asyncio.Task[int]]:
    """`count` chat requests straight to a stub, as another gateway or a batch job would send them."""
    session = aiohttp.ClientSession()
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    async def one() -> int:
        async with session.post(base + "/v1/chat/completions", data=body) as resp:
            await resp.read()
            return resp.status

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    closing = asyncio.gather(*tasks, return_exceptions=True)
    closing.add_done_callback(lambda _: asyncio.ensure_future(session.close()))
    await asyncio.sleep(0.2)  # all of them reached the stub
    return tasks


async def test_a_replica_loaded_directly_reports_waiting_and_is_saturated_until_its_queue_empties(
    pool: ReplicaSessions,
) -> None:
    with running_stub("--max-num-seqs", "2", "--hold", "1") as busy, \
            running_stub("--max-num-seqs", "2", "--hold", "1") as idle:
        scraper = VllmLoadScraper("reasoning", pool, interval=0.2)
        scraper.follow([busy, idle])
        tasks = await load_directly(busy, 3)
        await scraper.read_round()
        reports = dict(scraper.reports())
        assert (reports[busy].running, reports[busy].waiting) == (2, 1)
        assert (reports[idle].running, reports[idle].waiting) == (0, 0)
        now = scraper.now()
        assert saturated_replicas(reports, now, 0.2, sequence_slots=4) == {busy}  # waiting > 0
        assert await asyncio.gather(*tasks) == [200, 200, 200]
        await scraper.read_round()
        assert scraper.reports()[busy] == LoadReport(running=0, waiting=0, at=scraper.reports()[busy].at)
        assert saturated_replicas(scraper.reports(), scraper.now(), 0.2, sequence_slots=4) == frozenset()
        full = await load_directly(idle, 2)  # running 2 of its 2 real slots, nothing waiting
        await scraper.read_round()
        assert saturated_replicas(scraper.reports(), scraper.now(), 0.2, sequence_slots=2) == {idle}
        assert saturated_replicas(scraper.reports(), scraper.now(), 0.2, sequence_slots=4) == frozenset()
        await asyncio.gather(*full)


async def test_the_background_rounds_follow_the_interval_and_tell_the_listener(pool: ReplicaSessions) -> None:
    with running_stub("--max-num-seqs", "4") as base:
        scraper = VllmLoadScraper("reasoning", pool, interval=0.2)
        scraper.follow([base])
        rounds: list[float] = []
        await scraper.start(lambda reports: rounds.append(reports[base].at) if base in reports else None)
        await asyncio.sleep(0.9)
        await scraper.close()
        assert 4 <= len(rounds) <= 6 and all(0.1 < b - a < 0.35 for a, b in itertools.pairwise(rounds))


async def test_a_metrics_page_that_hangs_or_fails_changes_nothing_and_the_last_good_report_expires(
    pool: ReplicaSessions, metrics_server: Callable[[Handler], Awaitable[tuple[str, list[float]]]],
) -> None:
    state = {"mode": "ok"}

    async def flaky(_: web.Request) -> web.StreamResponse:
        if state["mode"] == "hang":
            await asyncio.sleep(5)
        if state["mode"] == "500":
            return web.Response(status=500, text="boom")
        return web.Response(text=PAGE)

    async def hangs(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text="")

    flaky_url, _ = await metrics_server(flaky)
    hang_url, _ = await metrics_server(hangs)
    clock = FakeClock()
    scraper = VllmLoadScraper("reasoning", pool, interval=0.4, clock=clock)
    scraper.follow([flaky_url, hang_url])
    started = time.monotonic()
    await scraper.read_round()
    assert 0.35 < time.monotonic() - started < 1.0  # all at once, each bounded by min(interval, 2 s)
    assert set(scraper.reports()) == {flaky_url}  # the one that hangs is used on our own counts alone
    good = scraper.reports()[flaky_url]
    assert good.at == 100.0 and saturated(good, clock.now(), 0.4, 4)
    for mode in ("hang", "500"):
        state["mode"] = mode
        clock.at += 0.35
        await scraper.read_round()
        assert scraper.reports()[flaky_url] == good  # a failed read changes nothing...
    clock.at = 100.79
    assert scraper.reports()[flaky_url] == good
    clock.at = 100.81
    assert scraper.reports() == {}  # ...and the report is dropped once 2 intervals old
    assert scraper.read_at() == {flaky_url: 100.0}  # when it was last read well (the age gauge)


async def test_a_slow_page_of_vllms_size_is_still_read(
    pool: ReplicaSessions, metrics_server: Callable[[Handler], Awaitable[tuple[str, list[float]]]],
) -> None:
    """A busy vLLM serves its 55 KB page slowly: 0.8 s is within a 1 s interval's read."""
    async def slow(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.8)
        return web.Response(text=fixture(), content_type="text/plain")

    url, _ = await metrics_server(slow)
    scraper = VllmLoadScraper("reasoning", pool, interval=1.0)
    scraper.follow([url])
    for _ in range(3):  # one round is enough; three leave room for a machine busy with other tests
        await scraper.read_round()
        if url in scraper.reports():
            break
    report = scraper.reports()[url]
    assert (report.running, report.waiting, report.deferred, report.queued) == (2, 3, 1, 2)


async def test_a_page_over_one_mebibyte_is_not_read(
    pool: ReplicaSessions, metrics_server: Callable[[Handler], Awaitable[tuple[str, list[float]]]],
) -> None:
    huge = fixture() + "# padding\n" * (MAX_BODY // 10)
    assert MAX_BODY == 1024 * 1024 < len(huge)

    async def announced(_: web.Request) -> web.StreamResponse:
        return web.Response(text=huge)

    async def chunked(request: web.Request) -> web.StreamResponse:  # no length: counted as it comes
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(huge.encode())
        await resp.write_eof()
        return resp

    urls = [(await metrics_server(handler))[0] for handler in (announced, chunked)]
    scraper = VllmLoadScraper("reasoning", pool, interval=1.0)
    scraper.follow(urls)
    await scraper.read_round()
    assert scraper.reports() == {}


async def test_a_report_that_expires_between_rounds_frees_its_replica_at_once(
    pool: ReplicaSessions, metrics_server: Callable[[Handler], Awaitable[tuple[str, list[float]]]],
) -> None:
    """The last good read said "waiting": once it is 2 intervals old the listener (the gate) is
    told, between rounds, whatever the reads do meanwhile."""
    served: list[float] = []

    async def then_fails(_: web.Request) -> web.StreamResponse:
        if served:
            return web.Response(status=500)
        served.append(time.monotonic())
        return web.Response(text=vllm_page(Engine(running=1, capacity=16)))

    url, _ = await metrics_server(then_fails)
    told: list[tuple[float, frozenset[str]]] = []
    free = asyncio.Event()
    scraper = VllmLoadScraper("reasoning", pool, interval=0.5)

    def listener(reports: Mapping[str, LoadReport]) -> None:
        told.append((time.monotonic(), saturated_replicas(reports, scraper.now(), 0.5, 4)))
        if not told[-1][1]:
            free.set()

    scraper.follow([url])
    await scraper.start(listener)
    try:
        await asyncio.wait_for(free.wait(), 3)
    finally:
        await scraper.close()
    assert told[0][1] == {url}  # held back by its own account
    freed = told[-1][0] - served[0]
    assert 0.95 < freed < 1.45, f"freed {freed:.2f} s after the last good read, not 2 intervals (not 3)"

async def test_a_replica_without_metrics_is_never_asked_again(
    pool: ReplicaSessions, metrics_server: Callable[[Handler], Awaitable[tuple[str, list[float]]]],
) -> None:
    async def missing(_: web.Request) -> web.StreamResponse:
        return web.Response(status=404)

    url, hits = await metrics_server(missing)
    scraper = VllmLoadScraper("reasoning", pool, interval=0.2)
    scraper.follow([url])
    for _ in range(3):
        await scraper.read_round()
    assert len(hits) == 1 and scraper.reports() == {}


async def test_reports_of_replicas_that_left_are_dropped_and_the_gauges_show_the_rest(pool: ReplicaSessions) -> None:
    with running_stub("--max-num-seqs", "2", "--hold", "1") as first, running_stub("--max-num-seqs", "2") as second:
        scraper = VllmLoadScraper("reasoning", pool, interval=1.0)
        scraper.follow([first, second])
        tasks = await load_directly(first, 3)
        await scraper.read_round()
        metrics = PrometheusMetrics(FakeGate())  # type: ignore[arg-type]
        replicas = ReplicaMetrics(metrics.registry)
        replicas.watch_load("reasoning", scraper)
        text = metrics.render()[1].decode()
        endpoint = "127.0.0.1:" + first.rsplit(":", 1)[1]
        for kind, value in (("waiting", 1.0), ("running", 2.0), ("deferred", 0.0)):
            series = f'gateway_endpoint_reported{{endpoint="{endpoint}",kind="{kind}",upstream="reasoning"}}'
            assert f"{series} {value}" in text
        assert f'gateway_endpoint_report_age_seconds{{endpoint="{endpoint}",upstream="reasoning"}}' in text
        scraper.follow([second])
        assert set(scraper.reports()) == {second}
        replicas.endpoint_ejected("reasoning", first)
        assert f'gateway_endpoint_ejections_total{{endpoint="{endpoint}",upstream="reasoning"}} 1.0' in (
            metrics.render()[1].decode())
        await asyncio.gather(*tasks)
