"""What a gateway process that ends gives back on the shared ledger: its k slots and its
replicas' counts, whether it is killed (a real process, SIGKILLed: reclaimed once its
heartbeat lease lapses), fenced (paused past its lease) or closed gracefully. In memory
(one process holds every slot it counts) there is nothing to give back.

Needs the Redis at GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and FAILS
when it is unreachable. Real time, short timeouts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.contract.gates import replica_gate_support
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.contract.gates.replica_gate_support import A, B, MakeGate, counts, eventually, granted, policy
from tests.support.processes import _env

from adapters.outbound.redis_gate import RedisAdmissionGate, scripts
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer

make_gate = replica_gate_support.make_gate  # the fixture (memory, redis, cluster)

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


async def test_tokens_held_requests_are_counted_down_on_every_release_path() -> None:
    """Under `fairness = "tokens"` the ledger counts each consumer's requests holding slots
    (`theld`, the lift's idle test) and each held token's consumer (`tholder`): a release, the
    reclaim of a fenced owner and a graceful close's purge all count them down (`free`)."""
    await require_redis()
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    pol = AdmissionPolicy(max_in_flight=4, queue_depth=4, queue_timeout_seconds=10, fairness="tokens")
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    gates = [RedisAdmissionGate({"up": pol}, SystemClock(), REDIS_URL, lease_seconds=lease, key_prefix=prefix)
             for lease in (1.0, 30.0)]
    keys, _ = scripts.upstream_keys(prefix, "up")
    held, holder = (next(k for k in keys if k.endswith(f":{name}")) for name in ("theld", "tholder"))
    try:
        for gate in gates:
            await gate.start()
        paused, other = gates
        a, b = Consumer(name="a"), Consumer(name="b")
        mine: list[Any] = [await paused.enter("up", a) for _ in range(2)]
        theirs = await other.enter("up", b)
        assert not any(lease.queued for lease in (*mine, theirs))
        assert await client.hgetall(held) == {"a": "2", "b": "1"} and await client.hlen(holder) == 3
        await mine[0].release()
        assert await client.hgetall(held) == {"a": "1", "b": "1"}
        time.sleep(1.3)  # noqa: ASYNC251 -- a pause longer than the paused process's lease
        await other.enter("up", b)  # any call reclaims the lapsed owner's slots
        assert await client.hgetall(held) == {"b": "2"} and await client.hlen(holder) == 2
        await other.close()  # purge: everything it still holds
        assert not await client.exists(held) and not await client.exists(holder)
    finally:
        for gate in gates:
            await gate.close()
        await client.aclose()
        await delete_prefix(prefix)
