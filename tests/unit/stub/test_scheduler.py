"""The stub's vLLM-like scheduler (`--max-num-seqs`) and prefix cache (`--prefix-cache`), no sockets."""

from __future__ import annotations

import asyncio

import pytest

from stub.prefix_cache import BLOCK_TOKENS, PrefixCache
from stub.scheduler import Scheduler


async def test_at_most_slots_run_and_the_rest_start_in_arrival_order() -> None:
    scheduler = Scheduler(2)
    started: list[int] = []

    async def request(n: int, release: asyncio.Event) -> None:
        turn = scheduler.enter()
        if turn is not None:
            await scheduler.wait(turn)
        started.append(n)
        try:
            await release.wait()
        finally:
            scheduler.leave()

    gates = [asyncio.Event() for _ in range(5)]
    tasks = [asyncio.create_task(request(n, gates[n])) for n in range(5)]
    await asyncio.sleep(0)
    assert started == [0, 1] and (scheduler.running, scheduler.waiting) == (2, 3)
    gates[1].set()
    await asyncio.sleep(0.01)
    assert started == [0, 1, 2] and (scheduler.running, scheduler.waiting) == (2, 2)
    tasks[3].cancel()  # a waiter that leaves is skipped, never started
    await asyncio.sleep(0.01)
    assert scheduler.waiting == 1
    gates[0].set()
    await asyncio.sleep(0.01)
    assert started == [0, 1, 2, 4] and (scheduler.running, scheduler.waiting) == (2, 0)
    assert not scheduler.free()
    gates[2].set()
    gates[4].set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert (scheduler.running, scheduler.waiting) == (0, 0) and scheduler.free()


async def test_a_place_granted_to_a_waiter_cancelled_in_the_same_instant_is_handed_on() -> None:
    scheduler = Scheduler(1)
    assert scheduler.enter() is None
    first, second = scheduler.enter(), scheduler.enter()
    assert first is not None and second is not None
    waiter = asyncio.create_task(scheduler.wait(first))
    await asyncio.sleep(0)
    scheduler.leave()  # grants `first` ...
    waiter.cancel()  # ... whose task is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert second.done() and (scheduler.running, scheduler.waiting) == (1, 0)
    scheduler.leave()
    assert (scheduler.running, scheduler.waiting) == (0, 0)


def test_prefix_cache_hits_whole_leading_blocks_of_a_growing_conversation() -> None:
    cache = PrefixCache()
    turn1 = list(range(40))  # 2 full blocks + 8 tokens
    assert cache.serve(turn1) == 0
    turn2 = [*turn1, *range(100, 130)]  # the next turn re-sends the whole prefix
    assert cache.serve(turn2) == 2 * BLOCK_TOKENS
    assert cache.serve(turn2) == 4 * BLOCK_TOKENS  # 70 tokens: 4 full blocks cached
    other = [7, *turn1[1:]]  # a different first token: every chained hash differs
    assert cache.serve(other) == 0


def test_prefix_cache_recomputes_the_last_token_and_evicts_least_recently_used() -> None:
    cache = PrefixCache(capacity=2)
    exact = list(range(2 * BLOCK_TOKENS))
    assert cache.serve(exact) == 0
    assert cache.serve(exact) == BLOCK_TOKENS  # fully cached: the last block is computed again
    cache.serve(list(range(1000, 1000 + 2 * BLOCK_TOKENS)))  # evicts both of `exact`'s blocks
    assert cache.serve(exact) == 0
    assert cache.serve([]) == 0 and cache.serve([1, 2, 3]) == 0


async def test_a_request_for_n_choices_takes_n_places_and_waits_in_its_place() -> None:
    scheduler = Scheduler(6)
    assert scheduler.enter(4) is None and scheduler.used == 4
    big, small = scheduler.enter(4), scheduler.enter(1)  # 1 would fit, but must not overtake
    assert big is not None and small is not None and scheduler.waiting == 2
    waiters = [asyncio.create_task(scheduler.wait(big)), asyncio.create_task(scheduler.wait(small))]
    await asyncio.sleep(0)
    assert not big.done() and not small.done()
    scheduler.leave(4)  # both fit now: granted in arrival order
    await asyncio.gather(*waiters)
    assert (scheduler.used, scheduler.running, scheduler.waiting) == (5, 2, 0)
    assert scheduler.places(64) == 6 and scheduler.enter(64) is not None  # never more than all places
