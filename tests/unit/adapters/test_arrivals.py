"""A burst of new requests starts `per_turn` per turn of the event loop, in arrival order,
through the real edge middleware, on both loops; one at a time, none waits; a cancelled
waiter takes no place; a turn left open by a stopped loop does not hold up the next loop."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

import bootstrap
from adapters.inbound._shared.arrivals import ArrivalPacer
from adapters.inbound._shared.call import note_hang_up
from adapters.inbound._shared.edge import EdgeMiddleware
from config import load_config_text

CONFIG = '[upstreams.local]\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'


def on_both_loops(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The gateway serves on uvloop; the tests run on both loops."""
    asyncio.run(test())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())


class Passes:
    """Counts the loop's passes over its ready callbacks: a callback that schedules itself
    runs once per pass."""

    def __init__(self) -> None:
        self.count = 0
        self._handle: asyncio.Handle | None = None

    def start(self) -> None:
        self._handle = asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        self._handle = asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


def edge(pacer: ArrivalPacer, passes: Passes, started: list[tuple[int, int]]) -> EdgeMiddleware:
    """The edge middleware around an app that notes (request number, pass) as it starts."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append((scope["number"], passes.count))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return EdgeMiddleware(app, pacer)


def scope_of(number: int) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "headers": [], "number": number}


async def request(middleware: EdgeMiddleware, number: int, scope: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What the middleware sent for request `number` (in `scope`, or a new one)."""
    scope = scope_of(number) if scope is None else scope
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    return sent


def test_a_burst_starts_per_turn_requests_per_pass_in_arrival_order() -> None:
    async def scenario() -> None:
        pacer, passes, started = ArrivalPacer(4), Passes(), []
        middleware = edge(pacer, passes, started)
        passes.start()
        tasks = [asyncio.create_task(request(middleware, n)) for n in range(22)]  # one burst, one pass
        answers = await asyncio.gather(*tasks)
        passes.stop()
        assert [n for n, _ in started] == list(range(22))  # nobody overtaken
        per_pass = Counter(p for _, p in started)
        assert max(per_pass.values()) == 4 and len(per_pass) == 6  # 4+4+4+4+4+2, each in its own pass
        # each one answered, through the middleware (which stamps the request id)
        assert all(a[0]["status"] == 200 and a[0]["headers"][-1][0] == b"x-request-id" for a in answers)
        assert pacer.waiting == 0

    on_both_loops(scenario)


def test_without_the_pacer_the_same_burst_starts_in_one_pass() -> None:
    """What the pacer changes: the edge alone starts every request of the burst in one pass
    (the stall the streams in flight saw)."""

    async def scenario() -> None:
        passes, started = Passes(), []
        middleware = edge(ArrivalPacer(4), passes, started)
        middleware.pacer = None
        passes.start()
        await asyncio.gather(*(request(middleware, n) for n in range(22)))
        passes.stop()
        assert len({p for _, p in started}) == 1

    on_both_loops(scenario)


def test_requests_one_at_a_time_never_wait() -> None:
    async def scenario() -> None:
        pacer, passes, started = ArrivalPacer(1), Passes(), []
        middleware = edge(pacer, passes, started)
        for _ in range(5):
            assert pacer.enter() is None  # the turn's only start
            await asyncio.sleep(0)  # the next turn
            await asyncio.sleep(0)
            assert pacer.waiting == 0
        passes.start()
        for n in range(5):
            await request(middleware, n)
            await asyncio.sleep(0)
        passes.stop()
        assert [n for n, _ in started] == list(range(5))

    on_both_loops(scenario)


def test_a_waiter_cancelled_before_its_turn_takes_no_place() -> None:
    async def scenario() -> None:
        pacer, passes, started = ArrivalPacer(2), Passes(), []
        middleware = edge(pacer, passes, started)
        passes.start()
        tasks = [asyncio.create_task(request(middleware, n)) for n in range(7)]
        await asyncio.sleep(0)  # all seven arrived: 0 and 1 started, 2..6 wait
        assert pacer.waiting == 5
        tasks[2].cancel()
        tasks[3].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        passes.stop()
        assert [n for n, _ in started] == [0, 1, 4, 5, 6]
        assert isinstance(done[2], asyncio.CancelledError) and isinstance(done[3], asyncio.CancelledError)
        per_pass = Counter(p for _, p in started)
        assert sorted(per_pass.values()) == [1, 2, 2]  # 4 and 5 take the places 2 and 3 left
        assert pacer.waiting == 0

    on_both_loops(scenario)


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_turn_left_open_by_a_stopped_loop_does_not_hold_up_the_next(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    pacer = ArrivalPacer(2)

    async def fill_the_turn() -> None:
        assert pacer.enter() is None and pacer.enter() is None  # the turn is full; its end is scheduled

    first = new_loop()
    first.run_until_complete(fill_the_turn())
    first.close()  # stopped before the pass that would have closed the turn

    async def burst() -> None:
        passes, started = Passes(), []
        middleware = edge(pacer, passes, started)
        passes.start()
        await asyncio.wait_for(asyncio.gather(*(request(middleware, n) for n in range(5))), 5)
        passes.stop()
        assert [n for n, _ in started] == list(range(5))

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(burst())


def test_the_container_gives_the_edge_a_pacer_of_the_configured_size() -> None:
    app = bootstrap.build_app(load_config_text(CONFIG))
    assert isinstance(app.pacer, ArrivalPacer) and app.pacer._per_turn == 8  # the default
    app = bootstrap.build_app(load_config_text("[server]\nstarts_per_loop_turn = 3\n" + CONFIG))
    assert isinstance(app.pacer, ArrivalPacer) and app.pacer._per_turn == 3
    assert bootstrap.build_app(load_config_text("[server]\nstarts_per_loop_turn = 0\n" + CONFIG)).pacer is None


def test_per_turn_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ArrivalPacer(0)


def test_a_request_whose_client_left_while_it_waited_never_starts() -> None:
    """The server reports the hang-up on the request's scope (`note_hang_up`) while it waits
    for its turn: it is dropped there, before routing, admission or an upstream call."""

    async def scenario() -> None:
        pacer, passes, started = ArrivalPacer(2), Passes(), []
        middleware = edge(pacer, passes, started)
        scopes = [scope_of(n) for n in range(5)]
        tasks = [asyncio.create_task(request(middleware, n, scope)) for n, scope in enumerate(scopes)]
        passes.start()
        await asyncio.sleep(0)  # 0 and 1 started, 2..4 wait
        note_hang_up(scopes[3])
        sent = await asyncio.gather(*tasks)
        passes.stop()
        assert [n for n, _ in started] == [0, 1, 2, 4]
        assert sent[3] == []  # nothing sent to the client that left
        assert "gateway.call" not in scopes[3]["state"]  # its Call let go of (no cycle left)

    on_both_loops(scenario)
