"""Redis gate across "processes": several gate instances in one test, each with its own
connections and owner id, sharing one cap and one FIFO per upstream; crash safety
(heartbeat leases, fencing) and Redis outages. Needs the Redis at GATEWAY_TEST_REDIS_URL
(default redis://127.0.0.1:6379/0) and FAILS when it is unreachable. Outages are
simulated with a local TCP proxy or a closed port: the shared server is never stopped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from adapters.outbound.redis_gate import RedisAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy
from domain.errors import AdmissionUnavailable

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MakeGate = Callable[..., Awaitable[Any]]  # entries are unions: keep the tests terse


def policy(cap: int = 1, depth: int = 8, timeout: float = 10.0) -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout)


@pytest.fixture
async def make_gate() -> AsyncIterator[MakeGate]:
    """`await make_gate(policies, url=..., **kw)`: a started gate on a per-test key prefix."""
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        await client.ping()
    except Exception as error:
        await client.aclose()
        pytest.fail(f"Redis at {REDIS_URL} is unreachable ({error}); run scripts/ensure-redis")
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    made: list[RedisAdmissionGate] = []

    async def make(policies: dict[str, AdmissionPolicy | None], url: str = REDIS_URL,
                   **kw: Any) -> RedisAdmissionGate:
        kw.setdefault("lease_seconds", 5.0)
        gate = RedisAdmissionGate(policies, SystemClock(), url, key_prefix=prefix, **kw)
        made.append(gate)
        await gate.start()
        return gate

    yield make
    for gate in made:
        await gate.close()
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def lease_of(entry: Any, timeout: float = 5.0) -> Any:
    """The lease of an entry, waiting for it if it is a ticket."""
    if not entry.queued:
        return entry
    lease = await entry.wait(timeout)
    assert lease is not None, "not granted in time"
    return lease


async def eventually(condition: Callable[[], bool], timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class TcpProxy:
    """A loopback TCP proxy to Redis that can be cut (listener AND live connections)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        await asyncio.sleep(0.05)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


async def test_three_gates_share_one_cap_and_one_fifo(make_gate: MakeGate) -> None:
    # recheck 5 s: a grant seen within 0.5 s can only have come over pub/sub
    a, b, c = [await make_gate({"up": policy(cap=2)}, recheck_seconds=5.0) for _ in range(3)]
    held = [await a.enter("up"), await a.enter("up")]
    assert not any(lease.queued for lease in held)
    order = [(b, await b.enter("up")), (c, await c.enter("up")), (a, await a.enter("up")),
             (b, await b.enter("up"))]
    for _, ticket in order:
        assert ticket.queued and await ticket.wait(0) is None
    assert [t.position() for _, t in order] == [1, 2, 3, 4]
    for i, (gate, ticket) in enumerate(order):
        admitted = gate.counters("up")["admitted"]
        await held.pop(0).release()
        started = time.monotonic()
        lease = await ticket.wait(3.0)
        assert lease is not None and time.monotonic() - started < 0.5
        assert gate.counters("up")["admitted"] == admitted + 1  # granted in its own process
        held.append(lease)
        rest = [t for _, t in order[i + 1:]]
        for other in rest:
            assert await other.wait(0) is None
        assert [t.position() for t in rest] == list(range(1, len(rest) + 1))
    await asyncio.sleep(0.7)  # every gate's refresher has read the shared counts
    assert {g.snapshot("up").in_use for g in (a, b, c)} == {2}
    for lease in held:
        await lease.release()


async def test_load_from_three_gates_never_exceeds_the_shared_cap(make_gate: MakeGate) -> None:
    gates = [await make_gate({"up": policy(cap=3, depth=60)}) for _ in range(3)]
    current = peak = 0

    async def one(gate: RedisAdmissionGate) -> None:
        nonlocal current, peak
        lease = await lease_of(await gate.enter("up"), 10.0)
        current += 1
        peak = max(peak, current)
        await asyncio.sleep(0.01)
        current -= 1
        await lease.release()

    await asyncio.wait_for(asyncio.gather(*(one(gates[i % 3]) for i in range(45))), 30)
    assert peak == 3
    assert sum(g.counters("up")["admitted"] for g in gates) == 45


async def test_a_dead_process_loses_its_slots_within_the_lease(make_gate: MakeGate) -> None:
    a = await make_gate({"up": policy(cap=2)}, lease_seconds=1.0)
    b = await make_gate({"up": policy(cap=2)}, lease_seconds=1.0)
    for _ in range(2):
        assert not (await a.enter("up")).queued
    waiting = await b.enter("up")
    assert (await a.enter("up")).queued  # a queue entry of the dying process, behind b's
    await a.close(give_back=False)  # "crash": no heartbeat any more, nothing given back
    started = time.monotonic()
    lease = await waiting.wait(3.0)
    assert lease is not None, "the dead owner's slots were not reclaimed"
    assert time.monotonic() - started < 2.0  # lease (1 s) + refresher interval (0.5 s)
    # the promotion is published by the same script whose reply carries the count
    await eventually(lambda: b.counters("up")["reclaimed"] == 3)  # 2 slots + 1 queue entry
    second = await b.enter("up")  # the dead queue entry is gone: b is next, at once
    assert not second.queued
    assert b.snapshot("up").in_use == 2 and b.snapshot("up").queued == 0
    for mine in (lease, second):
        await mine.release()


async def test_a_paused_process_is_fenced_and_recovers(make_gate: MakeGate) -> None:
    a = await make_gate({"up": policy(cap=1)}, lease_seconds=1.0)
    b = await make_gate({"up": policy(cap=1)}, lease_seconds=30.0)
    fenced: list[tuple[str, int]] = []
    a.on_fenced = lambda reason, lost: fenced.append((reason, lost))
    lease = await a.enter("up")
    ticket = await a.enter("up")
    waiter = asyncio.create_task(ticket.wait(10.0))
    await asyncio.sleep(0.05)
    time.sleep(1.3)  # noqa: ASYNC251 -- a stop-the-world pause longer than the lease
    await asyncio.wait_for(lease.lost.wait(), 2.0)  # found out at its next renewal
    with pytest.raises(AdmissionUnavailable):
        await waiter
    assert a.fence_count == 1 and fenced == [(fenced[0][0], 2)]
    assert a.counters("up")["lost"] == 2
    taken = await lease_of(await b.enter("up"), 2.0)  # the slot went back to the pool
    await lease.release()  # late release of a reclaimed slot: no effect on b's
    assert b.snapshot("up").in_use == 1
    await taken.release()
    fresh = await a.enter("up")  # a re-registered under a new owner id and admits again
    assert not fresh.queued
    await fresh.release()
    assert a.fence_count == 1


async def test_a_hang_up_during_enter_leaves_nothing_behind(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1)})
    for _ in range(20):
        entering = asyncio.create_task(gate.enter("up"))
        await asyncio.sleep(0.0005)
        entering.cancel()
        try:
            entry = await entering
        except asyncio.CancelledError:
            continue
        await (entry.cancel() if entry.queued else entry.release())
    await asyncio.sleep(0.2)  # an enter cancelled last may still be on its way to Redis
    await eventually(lambda: gate.snapshot("up").in_use == 0 and gate.snapshot("up").queued == 0)
    fresh = await gate.enter("up")
    assert not fresh.queued
    await fresh.release()


async def test_unreachable_redis_fails_closed_for_capped_upstreams_only(make_gate: MakeGate) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    gate = await make_gate({"capped": policy(), "free": None}, url=f"redis://127.0.0.1:{port}/0")
    started = time.monotonic()
    with pytest.raises(AdmissionUnavailable) as caught:
        await gate.enter("capped")
    assert caught.value.retry_after == 1 and time.monotonic() - started < 1.5
    assert gate.counters("capped")["unavailable"] == 1
    leases = [await gate.enter("free") for _ in range(3)]
    assert not any(lease.queued for lease in leases)
    for lease in leases:
        await lease.release()


async def test_an_outage_fails_waiters_and_the_gate_recovers(make_gate: MakeGate) -> None:
    host, port = "127.0.0.1", int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy((host, port))
    await proxy.start()
    a = await make_gate({"up": policy(cap=1)}, url=proxy.url, lease_seconds=3.0,
                        recheck_seconds=5.0)
    b = await make_gate({"up": policy(cap=1)})
    held = await a.enter("up")
    b_ticket = await b.enter("up")
    a_ticket = await a.enter("up")
    await proxy.stop()  # Redis vanishes for `a` (but well within its lease)
    with pytest.raises(AdmissionUnavailable):
        await a_ticket.wait(0.1)
    with pytest.raises(AdmissionUnavailable):
        await a.enter("up")
    await held.release()  # must not raise: deferred until Redis is back
    await proxy.start()
    lease = await b_ticket.wait(4.0)  # the deferred release reached Redis: b admitted
    assert lease is not None
    await asyncio.sleep(1.2)  # a's heartbeat also removed its failed waiter
    assert b.snapshot("up").queued == 0 and a.fence_count == 0
    retry = await a.enter("up")
    assert retry.queued
    assert await retry.wait(0) is None
    await lease.release()
    started = time.monotonic()
    granted = await retry.wait(3.0)  # woken over the re-subscribed channel, not the poll
    assert granted is not None and time.monotonic() - started < 0.5
    await granted.release()
    await proxy.stop()
