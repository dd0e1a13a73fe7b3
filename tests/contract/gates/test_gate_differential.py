"""The in-memory gate and two Redis "processes" decide alike on random operation sequences
(hypothesis): entries of k slots with and without affinity, releases, cancels, replica
discovery, ejected and saturated sets, the one safe retry's lease move and, under `fairness
= "tokens"`, charges (sent at once, or carried by the charging lease's own release as a
request's meter settles before it) and consumers whose queue empties while their requests
still hold slots (not idle: not lifted), compared step by step (outcome, slots, replica,
positions, counts, replica views).

Needs the Redis at GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and FAILS
when it is unreachable.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.contract.gates.replica_gate_support import A, B, C, policy

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.redis_gate import RedisAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.consumers import Consumer
from domain.errors import QueueFull, TooManySequences

_ENTER = st.tuples(st.just("enter"), st.sampled_from([1, 1, 1, 2, 3]), st.sampled_from(["a", "b", "hi"]))
# enter with affinity (prefer, best first; max_extra), ejected / saturated sets (a mask
# over A, B, C, like discover) and the one safe retry's move of a held lease
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
        # charge a consumer (tokens n x 6 in, n x 3 out: whole numbers after any weight here)
        st.tuples(st.just("charge"), st.integers(1, 20), st.sampled_from(["a", "b", "hi"])),
        # a held lease's own gate charges its consumer, then releases it (no call between)
        st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 20)),
    ),
    min_size=1, max_size=40,
)
CONSUMERS = {"a": Consumer(name="a"), "b": Consumer(name="b", weight=3), "hi": Consumer(name="hi", priority=5)}


def _ready(mask: int) -> list[str]:
    return [address for bit, address in enumerate((A, B, C)) if mask & (1 << bit)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 8), limit=st.integers(1, 4), fairness=st.sampled_from(["fifo", "fair", "tokens"]),
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
@example(cap=1, limit=1, fairness="tokens", replicated=False, first=1,  # charges between releases, an idle return
         ops=[("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "b"), ("enter", 1, "a"), ("settle", 0, 10),
              ("charge", 5, "b"), ("settle", 0, 1), ("enter", 1, "hi"), ("enter", 1, "b"), ("settle", 0, 20),
              ("enter", 1, "a"), ("settle", 0, 0), ("charge", 20, "hi"), ("enter", 2, "a"), ("settle", 0, 3)])
@example(cap=2, limit=2, fairness="tokens", replicated=False, first=1,  # queues empty while requests run: no lift
         ops=[("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "b"), ("charge", 20, "a"), ("release", 0, ""),
              ("enter", 1, "b"), ("enter", 1, "a"), ("settle", 0, 5), ("settle", 0, 5), ("enter", 1, "b"),
              ("enter", 1, "a"), ("settle", 1, 0), ("settle", 0, 20), ("enter", 1, "a"), ("enter", 1, "b")])
@example(cap=3, limit=2, fairness="tokens", replicated=True, first=3,  # k slots held, moved, then the last release
         ops=[("enter", 2, "b"), ("enter", 1, "a"), ("charge", 10, "a"), ("move", 0, ""), ("enter", 1, "b"),
              ("enter", 1, "a"), ("settle", 1, 4), ("enter", 1, "b"), ("settle", 0, 0), ("settle", 0, 0),
              ("settle", 0, 0), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "a"), ("enter", 1, "b")])
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
    held: list[tuple[Any, Any, str]] = []  # (memory lease, redis lease, consumer), in grant order
    waiting: list[tuple[Any, Any, str]] = []  # (memory ticket, redis ticket, consumer), in arrival order
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
                        waiting.append((m, r, who))
                    else:
                        assert (m.slots, m.replica) == (r.slots, r.replica), step
                        held.append((m, r, who))
            elif op == "release" and held:
                m, r, _ = held.pop(n % len(held))
                await m.release()
                await r.release()
            elif op == "cancel" and waiting:
                m, r, _ = waiting.pop(n % len(waiting))
                await m.cancel()
                await r.cancel()
            elif op == "charge":
                gate = redis[step % 2]
                for g in (memory, gate):
                    g.charge("up", CONSUMERS[who], n * 6, n * 3)
                await gate._call(gate._ups["up"], "maintain", gate._owner)  # what the refresher does within 0.5 s
            elif op == "settle" and held:
                m, r, owner = held.pop(n % len(held))
                for g in (memory, r._gate):
                    g.charge("up", CONSUMERS[owner], who * 6, who * 3)
                await m.release()
                await r.release()  # carries the charge, applied before its dispatch
            elif op == "move" and held:
                m, r, _ = held[n % len(held)]
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
            for m, r, owner in waiting:
                got_m = await m.wait(0)
                got_r = await r.wait(0)
                assert (got_m is None) == (got_r is None), (step, "granted on one backend only")
                if got_m is None:
                    assert m.position() == r.position(), step
                    still.append((m, r, owner))
                else:
                    assert (got_m.slots, got_m.replica) == (got_r.slots, got_r.replica), step
                    held.append((got_m, got_r, owner))
            waiting = still
            await redis[0]._call(redis[0]._ups["up"], "maintain", redis[0]._owner)  # fresh shared counts
            assert memory.snapshot("up").in_use == redis[0].snapshot("up").in_use, step
            assert memory.snapshot("up").queued == redis[0].snapshot("up").queued, step
            assert memory.snapshot("up").queued_by_priority == redis[0].snapshot("up").queued_by_priority, step
            assert [(x.address, x.state, x.in_flight, x.saturated) for x in memory.replicas("up")] == \
                   [(x.address, x.state, x.in_flight, x.saturated) for x in redis[0].replicas("up")], step
        for m, r, _ in waiting:
            await m.cancel()
            await r.cancel()
        for m, r, _ in held:
            await m.release()
            await r.release()
        await redis[0]._call(redis[0]._ups["up"], "maintain", redis[0]._owner)
        assert redis[0].snapshot("up").in_use == 0 and redis[0].snapshot("up").queued == 0
        assert all(x.in_flight == 0 for x in redis[0].replicas("up"))
    finally:
        for gate in redis:
            await gate.close()
        await delete_prefix(prefix)
