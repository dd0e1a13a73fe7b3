"""Fair queueing on the Redis admission ledger: priority bands, weighted
fairness between consumers, max_queued_per_consumer, positions, several processes on
one schedule, and a differential test against the contract's arithmetic (`Reference`).
Needs the Redis at GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and FAILS
when it is unreachable.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from adapters.outbound.redis_gate import RedisAdmissionGate, scripts
from adapters.outbound.system_clock import SystemClock
from domain.admission.fair_order import SCALE, tag_step
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from domain.errors import QueueFull

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MakeGate = Callable[..., Awaitable[Any]]


def policy(fairness: str = "fair", cap: int = 1, depth: int = 64,
           limit: int | None = None) -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=60.0,
                           fairness=fairness, max_queued_per_consumer=limit)


def who(name: str, priority: int = 0, weight: int = 1) -> Consumer:
    return Consumer(name=name, priority=priority, weight=weight)


class Reference:
    """The fair queue's contract in plain Python: slots, depth, per-consumer limit, and keys
    `(seq,)` (fifo) or `(-priority, finish_tag, seq)` (fair, tags in units of 1/SCALE)."""

    def __init__(self, pol: AdmissionPolicy) -> None:
        self.pol, self.fair = pol, pol.fairness == "fair"
        self.held: set[str] = set()
        self.waiting: dict[str, tuple[int, ...]] = {}
        self.owner: dict[str, str] = {}
        self.virtual: dict[int, int] = {}
        self.last: dict[tuple[int, str], int] = {}
        self.seq = 0

    def enter(self, rid: str, c: Consumer) -> str:
        if len(self.held) < self.pol.max_in_flight and not self.waiting:
            self.held.add(rid)
            return "admitted"
        limit = self.pol.max_queued_per_consumer
        mine = sum(1 for r in self.waiting if self.owner[r] == c.name)
        if len(self.waiting) >= self.pol.queue_depth or (limit is not None and mine >= limit):
            return "rejected"
        self.seq += 1
        if self.fair:
            band = (c.priority, c.name)
            start = max(self.virtual.get(c.priority, 0), self.last.get(band, 0))
            finish = self.last[band] = start + SCALE // min(c.weight, 16)
            self.waiting[rid] = (-c.priority, finish, self.seq)
        else:
            self.waiting[rid] = (self.seq,)
        self.owner[rid] = c.name
        return "queued"

    def position(self, rid: str) -> int:
        key = self.waiting[rid]
        return 1 + sum(1 for k in self.waiting.values() if k < key)

    def release(self, rid: str) -> list[str]:
        self.held.remove(rid)
        return self._promote()

    def cancel(self, rid: str) -> None:
        del self.waiting[rid]

    def _promote(self) -> list[str]:
        granted = []
        while self.waiting and len(self.held) < self.pol.max_in_flight:
            rid = min(self.waiting, key=self.waiting.__getitem__)
            key = self.waiting.pop(rid)
            if self.fair:
                self.virtual[-key[0]] = key[1]
            self.held.add(rid)
            granted.append(rid)
        return granted


@pytest.fixture
async def make_gate() -> AsyncIterator[MakeGate]:
    """`await make_gate(policies)`: a started gate on this test's own key prefix."""
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1,
                            decode_responses=True)
    try:
        await client.ping()
    except Exception as error:
        await client.aclose()
        pytest.fail(f"Redis at {REDIS_URL} is unreachable ({error}); run scripts/ensure-redis")
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    made: list[RedisAdmissionGate] = []

    async def make(policies: dict[str, AdmissionPolicy | None], **kw: Any) -> RedisAdmissionGate:
        kw.setdefault("lease_seconds", 5.0)
        gate = RedisAdmissionGate(policies, SystemClock(), REDIS_URL, key_prefix=prefix, **kw)
        made.append(gate)
        await gate.start()
        return gate

    make.prefix = prefix  # type: ignore[attr-defined]
    make.redis = client  # type: ignore[attr-defined]
    yield make
    for gate in made:
        await gate.close()
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def granted_among(tickets: dict[str, Any]) -> dict[str, Any]:
    """Which of these waiting tickets hold a slot now (one poll each); removes them."""
    out = {}
    for rid, ticket in list(tickets.items()):
        lease = await ticket.wait(0)
        if lease is not None:
            out[rid] = lease
            del tickets[rid]
    return out


async def dispatch_order(first: Any, tickets: dict[str, Any]) -> list[str]:
    """With cap 1: release the slot again and again; the order the tickets got it."""
    order, lease = [], first
    while tickets:
        await lease.release()
        got = await granted_among(tickets)
        assert len(got) == 1, f"one grant per release, got {sorted(got)}"
        (rid, lease), = got.items()
        order.append(rid)
    await lease.release()
    return order


async def queue_up(gates: Sequence[Any], arrivals: list[tuple[str, Consumer]],
                   ref: Reference) -> dict[str, Any]:
    """Enter each (id, consumer) in turn, round robin over `gates`; all must queue."""
    tickets = {}
    for i, (rid, consumer) in enumerate(arrivals):
        entry = await gates[i % len(gates)].enter("up", consumer)
        assert entry.queued and ref.enter(rid, consumer) == "queued"
        tickets[rid] = entry
    return tickets


async def hold(gate: Any, ref: Reference) -> Any:
    lease = await gate.enter("up")
    assert not lease.queued and ref.enter("held", who("anonymous")) == "admitted"
    return lease


def expected_order(ref: Reference, first: str = "held") -> list[str]:
    order, current = [], first
    while ref.waiting:
        (current,) = ref.release(current)
        order.append(current)
    return order


async def test_equal_weights_alternate_and_each_consumer_keeps_its_arrival_order(
    make_gate: MakeGate,
) -> None:
    gate = await make_gate({"up": policy()})
    ref = Reference(policy())
    first = await hold(gate, ref)
    a, b = who("A"), who("B")
    tickets = await queue_up([gate], [(f"A{i}", a) for i in range(6)]
                             + [(f"B{i}", b) for i in range(3)], ref)
    assert [tickets[f"B{i}"].position() for i in range(3)] == [2, 4, 6]  # between A's
    order = await dispatch_order(first, tickets)
    assert order == ["A0", "B0", "A1", "B1", "A2", "B2", "A3", "A4", "A5"]
    assert order == expected_order(ref)


async def test_fifo_ignores_priorities_and_weights(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy("fifo")})
    ref = Reference(policy("fifo"))
    first = await hold(gate, ref)
    arrivals = [("A0", who("A")), ("A1", who("A")), ("B0", who("B", weight=5)),
                ("C0", who("C", priority=10)), ("A2", who("A"))]
    tickets = await queue_up([gate], arrivals, ref)
    assert [t.position() for t in tickets.values()] == [1, 2, 3, 4, 5]
    assert await dispatch_order(first, tickets) == [rid for rid, _ in arrivals]
    keys = {key.rsplit(":", 1)[1] async for key in make_gate.redis.scan_iter(  # type: ignore[attr-defined]
        match=f"{make_gate.prefix}:*")}  # type: ignore[attr-defined]
    assert keys == {"seq", "owners"}  # fifo wrote none of the fair-mode keys


async def test_weights_three_to_one_while_both_wait(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy()})
    ref = Reference(policy())
    first = await hold(gate, ref)
    tickets = await queue_up([gate], [(f"A{i}", who("A", weight=3)) for i in range(9)]
                             + [(f"B{i}", who("B")) for i in range(5)], ref)
    order = await dispatch_order(first, tickets)
    assert order == expected_order(ref)
    assert [rid[0] for rid in order[:12]].count("A") == 9  # 3:1 while both wait
    assert order[:4] == ["A0", "A1", "A2", "B0"]


async def test_a_higher_priority_goes_first_and_pushes_positions_up(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy()})
    ref = Reference(policy())
    first = await hold(gate, ref)
    tickets = await queue_up([gate], [("A0", who("A")), ("B0", who("B")), ("A1", who("A")),
                                      ("L0", who("L", priority=-5)), ("H0", who("H", priority=10)),
                                      ("H1", who("H", priority=10)), ("B1", who("B"))], ref)
    for ticket in tickets.values():
        assert await ticket.wait(0) is None
    positions = {rid: t.position() for rid, t in tickets.items()}
    assert positions == {rid: ref.position(rid) for rid in tickets}
    assert positions["H0"] == 1 and positions["A0"] == 3 and positions["L0"] == 7
    order = await dispatch_order(first, tickets)
    assert order == ["H0", "H1", "A0", "B0", "A1", "B1", "L0"] == expected_order(ref)


@pytest.mark.parametrize("fairness", ["fair", "fifo"])
async def test_max_queued_per_consumer_refuses_only_that_consumer(
    make_gate: MakeGate, fairness: str,
) -> None:
    gate = await make_gate({"up": policy(fairness, limit=2)})
    first = await gate.enter("up", who("A"))  # admitted at once: not queued, not counted
    a = [await gate.enter("up", who("A")) for _ in range(2)]
    assert all(t.queued for t in a)
    with pytest.raises(QueueFull):
        await gate.enter("up", who("A"))
    assert gate.counters("up")["rejected_full"] == 1
    b = [await gate.enter("up", who("B")) for _ in range(2)]
    assert all(t.queued for t in b)
    await first.release()
    lease = await a[0].wait(2.0)  # A has one waiting left: it may queue again
    assert lease is not None
    again = await gate.enter("up", who("A"))
    assert again.queued
    with pytest.raises(QueueFull):
        await gate.enter("up", who("A"))
    await a[1].cancel()  # a cancelled waiter no longer counts
    assert (await gate.enter("up", who("A"))).queued
    await lease.release()


async def test_a_cancelled_waiter_leaves_no_trace(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(limit=5)})
    redis, prefix = make_gate.redis, make_gate.prefix  # type: ignore[attr-defined]
    ref = Reference(policy(limit=5))
    first = await hold(gate, ref)
    tickets = await queue_up([gate], [("A0", who("A")), ("A1", who("A")), ("B0", who("B")),
                                      ("A2", who("A")), ("B1", who("B"))], ref)
    gone = [tickets.pop("A1"), tickets.pop("B0")]
    for ticket in gone:
        await ticket.cancel()
    ref.cancel("A1")
    ref.cancel("B0")
    base = f"{prefix}:{{up}}"
    entries = await redis.hgetall(f"{base}:entries")
    assert not {t.token for t in gone} & set(entries)
    assert await redis.hgetall(f"{base}:counts") == {"A": "2", "B": "1"}
    assert await redis.zcard(f"{base}:fair") == 3 == await redis.zcard(f"{base}:queue")
    members = await redis.zrange(f"{base}:fair", 0, -1)
    assert not any(m.endswith(f":{t.token}") for t in gone for m in members)
    for ticket in tickets.values():
        assert await ticket.wait(0) is None
    assert {r: t.position() for r, t in tickets.items()} == {r: ref.position(r) for r in tickets}
    assert await dispatch_order(first, tickets) == expected_order(ref)
    # drained: the tags are shifted to 0 and vanish, nothing per consumer is left
    keys = {key.rsplit(":", 1)[1] async for key in redis.scan_iter(match=f"{prefix}:*")}
    assert keys == {"seq", "owners"}


async def test_an_unserved_tag_outlives_the_queue_with_the_same_effect(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy()})
    redis, prefix = make_gate.redis, make_gate.prefix  # type: ignore[attr-defined]
    ref = Reference(policy())
    first = await hold(gate, ref)
    tickets = await queue_up([gate], [("A0", who("A")), ("A1", who("A")), ("A2", who("A")),
                                      ("B0", who("B"))], ref)
    await tickets.pop("A2").cancel()  # A's last tag (3) stays: tags are never rolled back
    ref.cancel("A2")
    order = await dispatch_order(first, tickets)
    assert order == expected_order(ref) == ["A0", "B0", "A1"]
    # V = 2 (A1's tag) was subtracted: A still owes one request's worth of virtual time
    tags = await redis.hgetall(f"{prefix}:{{up}}:tags")
    assert tags == {f"{scripts.band(0)}:A": str(SCALE)}
    assert 0 < await redis.pttl(f"{prefix}:{{up}}:tags") <= 120_000
    ref.held.discard("A1")
    first = await hold(gate, ref)
    tickets = await queue_up([gate], [("A3", who("A")), ("B1", who("B")), ("A4", who("A")),
                                      ("B2", who("B"))], ref)
    assert await dispatch_order(first, tickets) == expected_order(ref) == ["B1", "A3", "B2", "A4"]


async def test_three_gates_on_one_redis_make_the_order_of_one(make_gate: MakeGate) -> None:
    gates = [await make_gate({"up": policy()}) for _ in range(3)]
    rng = random.Random(16)
    consumers = [who("A"), who("B", weight=2), who("C"), who("P", priority=3)]
    arrivals = [(f"{c.name}{i}", c) for i, c in enumerate(rng.choice(consumers) for _ in range(24))]
    orders = []
    for used in (gates[:1], gates):  # one process, then three (round robin); state drained between
        ref = Reference(policy())
        first = await hold(used[-1], ref)
        tickets = await queue_up(used, arrivals, ref)
        for ticket in tickets.values():
            assert await ticket.wait(0) is None
        assert {r: t.position() for r, t in tickets.items()} == {r: ref.position(r) for r in tickets}
        orders.append(await dispatch_order(first, tickets))
        assert orders[-1] == expected_order(ref)
    assert orders[0] == orders[1]
    assert orders[0] != [rid for rid, _ in arrivals]


async def test_expired_and_reclaimed_waiters_leave_no_trace(make_gate: MakeGate) -> None:
    redis, prefix = make_gate.redis, make_gate.prefix  # type: ignore[attr-defined]
    short = AdmissionPolicy(max_in_flight=1, queue_depth=8, queue_timeout_seconds=0.3,
                            fairness="fair", max_queued_per_consumer=3)
    a = await make_gate({"up": short}, lease_seconds=1.0)
    b = await make_gate({"up": short}, lease_seconds=5.0)
    held = await b.enter("up", who("B"))
    for name in ("A", "A", "C"):
        assert (await a.enter("up", who(name))).queued
    await a.close(give_back=False)  # "crash": its waiters expire on the server (b's refresher)
    await asyncio.sleep(0.9)
    base = f"{prefix}:{{up}}"
    for name in ("fair", "entries", "counts", "queue", "deadlines", "waiters"):
        assert not await redis.exists(f"{base}:{name}"), name
    assert await redis.hgetall(f"{base}:tags")  # the unserved tags of A and C (tags not rolled back)
    ticket = await b.enter("up", who("A"))
    assert ticket.queued  # A's count is back to 0
    await held.release()
    lease = await ticket.wait(2.0)
    assert lease is not None
    await lease.release()  # the dispatch moved V past every tag: the fair state is gone
    keys = {key.rsplit(":", 1)[1] async for key in redis.scan_iter(match=f"{prefix}:*")}
    assert keys == {"seq", "owners"}


@pytest.mark.parametrize(("seed", "fairness"), [(1, "fair"), (2, "fair"), (3, "fifo")])
async def test_random_operations_match_the_reference(
    make_gate: MakeGate, seed: int, fairness: str,
) -> None:
    pol = policy(fairness, cap=2, depth=10, limit=4)
    gates = [await make_gate({"up": pol}) for _ in range(2)]
    ref = Reference(pol)
    rng = random.Random(seed)
    consumers = [who("A"), who("B", weight=3), who("C", weight=2), who("H", priority=5),
                 who("L", priority=-1, weight=20)]
    leases: dict[str, Any] = {}
    tickets: dict[str, Any] = {}
    for step in range(90):  # bounded: ~2 script calls per waiter per step
        op = rng.random()
        if op < 0.55 or not (leases or tickets):
            rid, consumer = f"r{step}", rng.choice(consumers)
            expected = ref.enter(rid, consumer)
            try:
                entry = await rng.choice(gates).enter("up", consumer)
            except QueueFull:
                assert expected == "rejected", step
                continue
            assert expected == ("queued" if entry.queued else "admitted"), step
            (tickets if entry.queued else leases)[rid] = entry
        elif op < 0.75 and tickets:
            rid = rng.choice(sorted(tickets))
            await tickets.pop(rid).cancel()
            ref.cancel(rid)
        elif leases:
            rid = rng.choice(sorted(leases))
            await leases.pop(rid).release()
            expected_grants = ref.release(rid)
            got = await granted_among(tickets)
            assert sorted(got) == sorted(expected_grants), step
            leases.update(got)
        for rid, ticket in tickets.items():
            assert await ticket.wait(0) is None
            assert ticket.position() == ref.position(rid), (step, rid)
    for entry in [*tickets.values(), *leases.values()]:
        await (entry.cancel() if entry.queued else entry.release())


def test_bands_sort_like_descending_priorities() -> None:
    rng = random.Random(7)
    priorities = [0, 1, -1, 9, 10, -10, 99, -100, 10**20, -(10**20)] + [
        rng.randint(-10**6, 10**6) for _ in range(200)]
    assert sorted(priorities, key=scripts.band) == sorted(priorities, reverse=True)
    assert all(":" not in scripts.band(p) and " " not in scripts.band(p) for p in priorities)
    assert [tag_step(w) for w in (1, 3, 16, 17, 100)] == [720720, 240240, 45045, 45045, 45045]
