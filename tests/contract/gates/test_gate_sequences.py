"""k sequence slots per request and per-replica counts on both admission backends (issues 19
and 20): one contract for the in-memory and the Redis gate (single server and cluster), a
differential test of the two on random operation sequences (hypothesis; with issue 23's
ejected and saturated replicas, affinity at arrival and the lease move too: their contract
is test_gate_health.py), and a killed process's per-replica counts reclaimed on Redis (a
real process, SIGKILLed).

The Redis variants need the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0) and FAIL when it is unreachable. Real time, short timeouts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from tests.contract.gates.test_gate_contract import REDIS_URL, delete_prefix, redis_target, require_redis
from tests.support.processes import _env

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.redis_gate import RedisAdmissionGate, scripts
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from domain.errors import QueueFull, QueueTimeout, TooManySequences
from domain.replicas import ReplicaState

A, B, C = "http://127.0.0.2:8080", "http://127.0.0.3:8080", "http://127.0.0.4:8080"
MakeGate = Callable[..., Awaitable[Any]]


def policy(cap: int = 4, depth: int = 8, timeout: float = 10.0, fairness: str = "fifo") -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout, fairness=fairness)


@pytest.fixture(params=["memory", "redis", "cluster"])
async def make_gate(request: pytest.FixtureRequest) -> AsyncIterator[MakeGate]:
    """`await make_gate(policies, replica_limits)`; on Redis every call is another "process"."""
    kind: str = request.param
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    made: list[RedisAdmissionGate] = []
    target, url = (REDIS_URL, REDIS_URL) if kind == "memory" else redis_target(kind, request)
    if kind != "memory":
        await require_redis(url)

    async def make(policies: Mapping[str, AdmissionPolicy | None], limits: Mapping[str, int] | None = None,
                   **kw: Any) -> Any:
        if kind == "memory":
            return InMemoryAdmissionGate(policies, SystemClock(), replica_limits=limits)
        kw.setdefault("lease_seconds", 5)
        gate = RedisAdmissionGate(policies, SystemClock(), target, key_prefix=prefix, replica_limits=limits, **kw)
        made.append(gate)
        await gate.start()
        return gate

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for gate in made:
        await gate.close()
    if kind != "memory":
        await delete_prefix(prefix, url, cluster=kind == "cluster")


async def granted(entry: Any, timeout: float = 2.0) -> Any:
    lease = entry if not entry.queued else await entry.wait(timeout)
    assert lease is not None, "not granted in time"
    return lease


async def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def counts(gate: Any, upstream: str = "up") -> dict[str, int]:
    return {r.address: r.in_flight for r in gate.replicas(upstream)}


async def test_k_slots_at_once_in_their_place(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=4)})
    held = [await gate.enter("up") for _ in range(3)]
    big = await gate.enter("up", slots=3)
    small = await gate.enter("up")
    assert big.queued and small.queued and (big.position(), small.position()) == (1, 2)
    await held[0].release()
    assert await big.wait(0) is None and await small.wait(0) is None  # 2 free: the head waits, nobody passes
    await held[1].release()
    lease = await granted(big)
    assert (lease.slots, lease.replica) == (3, None)
    assert await small.wait(0) is None
    await eventually(lambda: gate.snapshot("up").in_use == 4)
    await lease.release()  # all 3 come back: the 1-request goes in
    one = await granted(small)
    await eventually(lambda: gate.snapshot("up").in_use == 2)
    for entry in (one, held[2]):
        await entry.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)


async def test_more_than_the_cap_or_a_replica_is_a_400_before_anything(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=6), "rep": policy(cap=6)}, {"rep": 4})
    with pytest.raises(TooManySequences) as caught:
        await gate.enter("up", slots=8)
    assert caught.value.status == 400 and caught.value.kind == "too_many_sequences"
    assert str(caught.value) == "this request needs 8 sequence slots, more than the 6 this upstream can ever grant"
    with pytest.raises(TooManySequences, match="needs 5 sequence slots, more than the 4"):
        await gate.enter("rep", slots=5)
    assert gate.counters("up")["admitted"] == 0 and gate.snapshot("up").queued == 0


async def test_a_cancelled_k_head_lets_the_next_in_and_gives_nothing_away(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2)})
    held = await gate.enter("up")
    big = await gate.enter("up", slots=2)
    small = await gate.enter("up")
    waiter = asyncio.create_task(small.wait(3.0))
    await asyncio.sleep(0.05)
    await big.cancel()
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None
    await lease.release()
    await held.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)
    both = await gate.enter("up", slots=2)  # nothing leaked: 2 free again
    assert not both.queued
    await both.release()


async def test_replicas_wait_for_discovery_then_spread_round_robin_under_the_live_cap(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=6, depth=8)}, {"up": 4})
    first = await gate.enter("up")
    assert first.queued and gate.replicas("up") == []  # nothing ready: requests queue
    waiter = asyncio.create_task(first.wait(3.0))
    await asyncio.sleep(0.05)
    gate.set_replicas("up", [B, A])
    started = time.monotonic()
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None and lease.replica == A and time.monotonic() - started < 1.0
    leases = [lease] + [await gate.enter("up") for _ in range(5)]
    assert [one.replica for one in leases] == [A, B, A, B, A, B]
    seventh = await gate.enter("up")
    assert seventh.queued  # the cap of 6: 3 + 3 is the seed's cap, though each replica has 1 free
    await eventually(lambda: counts(gate) == {A: 3, B: 3})
    await seventh.cancel()
    for one in leases:
        await one.release()
    await eventually(lambda: counts(gate) == {A: 0, B: 0})


async def test_k_on_one_replica_and_draining(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=8, depth=8)}, {"up": 4})
    gate.set_replicas("up", [A, B])
    await asyncio.sleep(0.05)
    ones = [await granted(await gate.enter("up")) for _ in range(6)]  # A 3, B 3
    big = await gate.enter("up", slots=2)
    assert big.queued  # 6 + 2 <= 8, but no replica has 2 free
    await ones[0].release()  # A: 2 free
    lease = await granted(big)
    assert (lease.slots, lease.replica) == (2, A)
    await eventually(lambda: counts(gate) == {A: 4, B: 3})
    gate.set_replicas("up", [B])  # A drains: its 4 finish, it gets nothing new
    await asyncio.sleep(0.05)
    extra = await gate.enter("up")
    assert extra.queued  # live cap = B's 4, and 7 are in flight
    await eventually(lambda: {r.address: r.state for r in gate.replicas("up")}
                     == {A: ReplicaState.DRAINING, B: ReplicaState.READY})
    await extra.cancel()
    for one in [*[o for o in ones[1:] if o.replica == A], lease]:
        await one.release()
    await eventually(lambda: [r.address for r in gate.replicas("up")] == [B])  # forgotten at 0
    for one in [o for o in ones if o.replica == B]:
        await one.release()


async def test_two_processes_share_the_per_replica_counts(make_gate: MakeGate) -> None:
    if make_gate.kind == "memory":  # type: ignore[attr-defined]
        return  # one process by design: covered above
    a = await make_gate({"up": policy(cap=6, depth=16)}, {"up": 4})
    b = await make_gate({"up": policy(cap=6, depth=16)}, {"up": 4})
    for gate in (a, b):
        gate.set_replicas("up", [A, B])
    await asyncio.sleep(0.05)
    leases = [await granted(await (a if i % 2 else b).enter("up")) for i in range(6)]
    assert sorted(one.replica for one in leases) == [A, A, A, B, B, B]
    waiting = await a.enter("up", slots=2)
    assert waiting.queued
    for one in [o for o in leases if o.replica == B][:2]:
        await one.release()  # b's or a's release frees B's 2: the queued 2-request goes there
    lease = await granted(waiting)
    assert (lease.slots, lease.replica) == (2, B)
    await eventually(lambda: counts(a) == {A: 3, B: 3} and counts(b) == {A: 3, B: 3})
    for one in [*[o for o in leases if o.replica == A], lease, *[o for o in leases if o.replica == B][2:]]:
        await one.release()


@pytest.mark.parametrize("fairness", ["fifo", "fair"])
async def test_the_snapshot_counts_waiters_per_consumer_priority(make_gate: MakeGate, fairness: str) -> None:
    """Issue 24 (c): both backends report the queue depth per consumer priority."""
    gate = await make_gate({"up": policy(cap=1, depth=8, fairness=fairness)})
    held = await gate.enter("up")
    assert gate.snapshot("up").queued_by_priority is None  # nobody waits
    tickets = [await gate.enter("up", Consumer(name=name, priority=p))
               for name, p in [("a", 0), ("b", 5), ("c", -3), ("d", 5), ("e", 0)]]
    assert all(t.queued for t in tickets)
    assert gate.snapshot("up").queued_by_priority == {0: 2, 5: 2, -3: 1}
    await tickets[1].cancel()
    await tickets[2].cancel()
    await eventually(lambda: gate.snapshot("up").queued_by_priority == {0: 2, 5: 1})
    await held.release()  # fifo: "a" (0) goes in; fair: "d" (5) does
    lease = await granted(tickets[0] if fairness == "fifo" else tickets[3])
    await eventually(lambda: gate.snapshot("up").queued_by_priority
                     == ({0: 1, 5: 1} if fairness == "fifo" else {0: 2}))
    for ticket in tickets:
        await ticket.cancel()
    await lease.release()
    await eventually(lambda: gate.snapshot("up").queued_by_priority is None and gate.snapshot("up").in_use == 0)


# -- differential: the memory gate and two Redis "processes" on one operation sequence -----

_ENTER = st.tuples(st.just("enter"), st.sampled_from([1, 1, 1, 2, 3]), st.sampled_from(["a", "b", "hi"]))
# issue 23: enter with affinity (prefer, best first; max_extra), ejected / saturated sets
# (a mask over A, B, C, like discover) and the one safe retry's move of a held lease
_PREFER = st.tuples(st.just("prefer"), st.sampled_from([1, 1, 2]), st.sampled_from(["a", "b", "hi"]),
                    st.lists(st.sampled_from([A, B, C]), min_size=1, max_size=3, unique=True), st.integers(0, 2))
OPS = st.lists(
    st.one_of(
        _ENTER, _ENTER, _PREFER,
        st.tuples(st.just("release"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("release"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("cancel"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("discover"), st.integers(0, 7), st.just("")),
        st.tuples(st.just("eject"), st.sampled_from([0, 0, 1, 2, 4, 3]), st.just("")),
        st.tuples(st.just("saturate"), st.sampled_from([0, 0, 1, 2, 4, 6]), st.just("")),
        st.tuples(st.just("move"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("move"), st.integers(0, 50), st.just("")),
    ),
    min_size=1, max_size=40,
)
CONSUMERS = {"a": Consumer(name="a"), "b": Consumer(name="b", weight=3), "hi": Consumer(name="hi", priority=5)}


def _ready(mask: int) -> list[str]:
    return [address for bit, address in enumerate((A, B, C)) if mask & (1 << bit)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 8), limit=st.integers(1, 4), fairness=st.sampled_from(["fifo", "fair"]),
       replicated=st.booleans(), first=st.integers(1, 7), ops=OPS)
@example(cap=4, limit=2, fairness="fifo", replicated=True, first=3,  # ties rotate after a release
         ops=[("enter", 1, "a"), ("release", 0, ""), ("enter", 1, "a")])
@example(cap=8, limit=3, fairness="fifo", replicated=True, first=3,  # k on one replica, head-of-line
         ops=[("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 3, "b"),
              ("enter", 1, "a"), ("release", 0, ""), ("release", 0, ""), ("discover", 1, ""), ("release", 0, ""),
              ("discover", 7, "")])
@example(cap=4, limit=4, fairness="fair", replicated=False, first=1,  # k under the fair order
         ops=[("enter", 3, "a"), ("enter", 2, "b"), ("enter", 1, "hi"), ("enter", 1, "a"), ("release", 0, ""),
              ("cancel", 0, ""), ("release", 0, "")])
@example(cap=6, limit=2, fairness="fifo", replicated=True, first=7,  # ejected leave the cap, come back
         ops=[("eject", 2, ""), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "a"),
              ("enter", 1, "a"), ("saturate", 1, ""), ("eject", 0, ""), ("move", 0, ""), ("saturate", 0, ""),
              ("move", 1, "")])
@example(cap=6, limit=2, fairness="fifo", replicated=True, first=7,  # the room a move leaves admits a 2-request
         ops=[("prefer", 1, "a", [A], 1), ("prefer", 1, "a", [B], 1), ("prefer", 1, "a", [C], 1),
              ("prefer", 1, "a", [A], 1), ("enter", 2, "b"), ("move", 1, "")])
@example(cap=8, limit=4, fairness="fifo", replicated=True, first=7,  # a move is the round robin's last pick
         ops=[("prefer", 1, "a", [A], 2), ("prefer", 1, "a", [A], 2), ("prefer", 1, "a", [B], 0), ("move", 0, ""),
              ("enter", 1, "a")])
@example(cap=4, limit=2, fairness="fair", replicated=True, first=3,  # a fair newcomer placed first keeps its affinity
         ops=[("enter", 1, "a"), ("enter", 1, "a"), ("enter", 2, "b"), ("prefer", 1, "hi", [B], 0)])
async def test_memory_and_redis_decide_alike(
    cap: int, limit: int, fairness: str, replicated: bool, first: int, ops: list[tuple[Any, ...]],
) -> None:
    ops = [("discover", first, ""), *ops]  # replicas ready from the start (most of the time)
    note(f"cap={cap} limit={limit} fairness={fairness} replicated={replicated} ops={ops}")
    await require_redis()
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    pol = {"up": policy(cap=cap, depth=5, timeout=60.0, fairness=fairness)}
    limits = {"up": limit} if replicated else None
    memory = InMemoryAdmissionGate(pol, SystemClock(), replica_limits=limits)
    # No refresher round during the example: a call in flight carries the view it was sent
    # with, and a refresh sent just before a view change would promote under the old view
    # (harmless in production, where views change asynchronously anyway; not comparable here).
    redis = [RedisAdmissionGate(pol, SystemClock(), REDIS_URL, lease_seconds=10, key_prefix=prefix,
                                replica_limits=limits, recheck_seconds=30, refresh_seconds=3600)
             for _ in range(2)]
    for gate in redis:
        await gate.start()
    held: list[tuple[Any, Any]] = []  # (memory lease, redis lease), in grant order
    waiting: list[tuple[Any, Any]] = []  # (memory ticket, redis ticket), in arrival order
    try:
        for step, (op, n, who, *more) in enumerate(ops):
            if op in ("enter", "prefer"):
                gate = redis[step % 2]
                prefer, max_extra = more if more else ((), 0)
                outcomes = []
                for g in (memory, gate):
                    try:
                        outcomes.append(await g.enter("up", CONSUMERS[who], slots=n, prefer=prefer,
                                                      max_extra=max_extra))
                    except (TooManySequences, QueueFull) as error:
                        outcomes.append(type(error))
                m, r = outcomes
                assert (m if isinstance(m, type) else m.queued) == (r if isinstance(r, type) else r.queued), step
                if not isinstance(m, type):
                    if m.queued:
                        waiting.append((m, r))
                    else:
                        assert (m.slots, m.replica) == (r.slots, r.replica), step
                        held.append((m, r))
            elif op == "release" and held:
                m, r = held.pop(n % len(held))
                await m.release()
                await r.release()
            elif op == "cancel" and waiting:
                m, r = waiting.pop(n % len(waiting))
                await m.cancel()
                await r.cancel()
            elif op == "move" and held:
                m, r = held[n % len(held)]
                moved = await m.move(), await r.move()
                assert moved[0] == moved[1] and m.replica == r.replica, (step, moved)
            elif op in ("discover", "eject", "saturate") and replicated:
                for g in (memory, *redis):
                    setter = {"discover": g.set_replicas, "eject": g.set_ejected, "saturate": g.set_saturated}[op]
                    setter("up", _ready(n))
                for gate in redis:  # the wake-up each schedules, done before the next step
                    if gate._tasks:
                        await asyncio.wait(list(gate._tasks))
            # every waiter polls once (the poll script repairs and promotes, as any call does)
            still = []
            for m, r in waiting:
                got_m = await m.wait(0)
                got_r = await r.wait(0)
                assert (got_m is None) == (got_r is None), (step, "granted on one backend only")
                if got_m is None:
                    assert m.position() == r.position(), step
                    still.append((m, r))
                else:
                    assert (got_m.slots, got_m.replica) == (got_r.slots, got_r.replica), step
                    held.append((got_m, got_r))
            waiting = still
            await redis[0]._call(redis[0]._ups["up"], "maintain", redis[0]._owner)  # fresh shared counts
            assert memory.snapshot("up").in_use == redis[0].snapshot("up").in_use, step
            assert memory.snapshot("up").queued == redis[0].snapshot("up").queued, step
            assert memory.snapshot("up").queued_by_priority == redis[0].snapshot("up").queued_by_priority, step
            assert [(x.address, x.state, x.in_flight, x.saturated) for x in memory.replicas("up")] == \
                   [(x.address, x.state, x.in_flight, x.saturated) for x in redis[0].replicas("up")], step
        for m, r in waiting:
            await m.cancel()
            await r.cancel()
        for m, r in held:
            await m.release()
            await r.release()
        await redis[0]._call(redis[0]._ups["up"], "maintain", redis[0]._owner)
        assert redis[0].snapshot("up").in_use == 0 and redis[0].snapshot("up").queued == 0
        assert all(x.in_flight == 0 for x in redis[0].replicas("up"))
    finally:
        for gate in redis:
            await gate.close()
        await delete_prefix(prefix)


# -- a killed process's per-replica counts are reclaimed ------------------------------------

_VICTIM = textwrap.dedent("""
    import asyncio, json, sys
    from adapters.outbound.redis_gate import RedisAdmissionGate
    from adapters.outbound.system_clock import SystemClock
    from domain.admission.policy import AdmissionPolicy

    async def main() -> None:
        url, prefix = sys.argv[1], sys.argv[2]
        pol = AdmissionPolicy(max_in_flight=6, queue_depth=8, queue_timeout_seconds=30)
        gate = RedisAdmissionGate({"up": pol}, SystemClock(), url, lease_seconds=1.0, key_prefix=prefix,
                                  replica_limits={"up": 4})
        await gate.start()
        gate.set_replicas("up", sys.argv[3:])
        leases = [await gate.enter("up", slots=k) for k in (2, 2, 1)]
        print(json.dumps([[lease.queued, lease.slots, lease.replica] for lease in leases]), flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
""")


async def test_a_killed_process_gives_back_its_per_replica_counts(tmp_path: Path) -> None:
    await require_redis()
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "victim.py"
    script.write_text(_VICTIM)
    victim = await asyncio.create_subprocess_exec(
        sys.executable, str(script), REDIS_URL, prefix, A, B, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    survivor = RedisAdmissionGate({"up": policy(cap=6, depth=8, timeout=10)}, SystemClock(), REDIS_URL,
                                  lease_seconds=5, key_prefix=prefix, replica_limits={"up": 4})
    try:
        assert victim.stdout is not None
        line = await asyncio.wait_for(victim.stdout.readline(), 15)
        if not line:
            assert victim.stderr is not None
            pytest.fail(f"the victim process failed: {(await victim.stderr.read()).decode()[-2000:]}")
        assert json.loads(line) == [[False, 2, A], [False, 2, B], [False, 1, A]]
        keys, _ = scripts.upstream_keys(prefix, "up")
        replicas_key = next(k for k in keys if k.endswith(":replicas"))
        assert await client.hgetall(replicas_key) == {A: "3", B: "2"}
        await survivor.start()
        survivor.set_replicas("up", [A, B])
        mine = await survivor.enter("up")  # 5 + 1 = 6: the live cap of 6 is reached
        assert not mine.queued and mine.replica == B
        big = await survivor.enter("up", slots=4)  # needs 4 on one replica: waits for the dead one's
        assert big.queued
        victim.send_signal(signal.SIGKILL)
        await asyncio.wait_for(victim.wait(), 5)
        killed = time.monotonic()
        lease = await big.wait(5.0)  # reclaimed within the lease (1 s) plus a refresh
        assert lease is not None and time.monotonic() - killed < 3.0
        assert (lease.slots, lease.replica) == (4, A)
        assert await client.hgetall(replicas_key) == {A: "4", B: "1"}  # only the survivor's
        await eventually(lambda: survivor.counters("up")["reclaimed"] == 3)  # its 3 leases, per replica
        await eventually(lambda: survivor.snapshot("up").in_use == 5)
        for one in (lease, mine):
            await one.release()
        assert await client.hgetall(replicas_key) == {}
        for name in ("bound", "extra", "want"):
            assert not await client.exists(next(k for k in keys if k.endswith(f":{name}"))), name
    finally:
        if victim.returncode is None:
            victim.kill()
            await asyncio.wait_for(victim.wait(), 5)
        await survivor.close()
        await client.aclose()
        await delete_prefix(prefix)


async def test_a_k_head_that_times_out_lets_the_next_in(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2, depth=4, timeout=0.5)}, {"up": 2})
    gate.set_replicas("up", [A])
    await asyncio.sleep(0.05)
    held = await granted(await gate.enter("up"))
    big = await gate.enter("up", slots=2)
    await asyncio.sleep(0.25)
    small = await gate.enter("up")
    waiter = asyncio.create_task(small.wait(3.0))
    with pytest.raises(QueueTimeout):
        await big.wait(3.0)
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None and lease.replica == A
    for one in (lease, held):
        await one.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)


async def test_a_fenced_process_k_slots_on_a_replica_go_back(make_gate: MakeGate) -> None:
    """A lost lease (the process paused past its heartbeat lease) frees its k and its replica's k."""
    if make_gate.kind == "memory":  # type: ignore[attr-defined]
        return  # one process holds every slot it counts: never lost
    a = await make_gate({"up": policy(cap=4, depth=4)}, {"up": 4}, lease_seconds=1.0)
    b = await make_gate({"up": policy(cap=4, depth=4)}, {"up": 4}, lease_seconds=30.0)
    for gate in (a, b):
        gate.set_replicas("up", [A])
    await asyncio.sleep(0.05)
    paused = await granted(await a.enter("up", slots=3))
    assert (paused.slots, paused.replica) == (3, A)
    waiting = await b.enter("up", slots=2)
    assert waiting.queued
    time.sleep(1.3)  # noqa: ASYNC251 -- a stop-the-world pause longer than the lease
    await asyncio.wait_for(paused.lost.wait(), 3.0)
    lease = await granted(waiting, 3.0)  # the 3 slots on A came back to the pool
    assert (lease.slots, lease.replica) == (2, A)
    await paused.release()  # late release of reclaimed slots: no effect
    await eventually(lambda: counts(b) == {A: 2} and b.snapshot("up").in_use == 2)
    await lease.release()
    await eventually(lambda: counts(b) == {A: 0} and b.snapshot("up").in_use == 0)


async def test_a_graceful_close_gives_back_k_slots_per_replica(make_gate: MakeGate) -> None:
    """`close()` purges what the process still holds: its k slots and its replicas' counts."""
    if make_gate.kind == "memory":  # type: ignore[attr-defined]
        return  # nothing shared to give back
    a = await make_gate({"up": policy(cap=8, depth=4)}, {"up": 4})
    b = await make_gate({"up": policy(cap=8, depth=4)}, {"up": 4})
    for gate in (a, b):
        gate.set_replicas("up", [A, B])
    await asyncio.sleep(0.05)
    mine = [await granted(await a.enter("up", slots=k)) for k in (3, 2)]
    assert [(one.slots, one.replica) for one in mine] == [(3, A), (2, B)]
    queued = await a.enter("up", slots=4)  # no replica has 4 free: a queue entry of a's
    assert queued.queued
    await a.close()  # leases and queue entry given back at once, no lease expiry needed
    entry = await b.enter("up", slots=4)
    assert not entry.queued and entry.replica == A
    await eventually(lambda: counts(b) == {A: 4, B: 0} and b.snapshot("up").queued == 0)
    await entry.release()
