"""KV-cache affinity: the prefix hash chain (a conversation's next turn shares every earlier
block), the key that overrides it, the bounded memory of what went where, and the pick that
prefers the replica holding the longest prefix within `affinity_max_extra_in_flight`."""

from __future__ import annotations

import heapq
import itertools
import random
import tracemalloc

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.affinity import (
    BLOCK_BYTES,
    CHECKPOINTS,
    DEFAULT_CAPACITY,
    MAX_BLOCKS,
    TAIL_MESSAGES,
    AffinityMemory,
    affinity_chain,
    checkpoints,
    prefix_hashes,
    prompt_bytes,
    prompt_parts,
)
from domain.canonical import ChatRequest, Message, TextPart, ToolResultPart, ToolSpec, ToolUsePart
from domain.replicas import Replica, ReplicaSet, ReplicaState, pick

A, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"
SYSTEM = Message(role="system", content=[TextPart(text="You are a careful agent. " * 40)])


def turn(role: str, text: str) -> Message:
    return Message(role=role, content=[TextPart(text=text)])  # type: ignore[arg-type]


def chat(messages: list[Message], **fields: object) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, **fields)  # type: ignore[arg-type]


def agent_turns(tag: str, turns: int) -> list[ChatRequest]:
    """An agent's requests: each re-sends the whole conversation plus the last answer and a new ask."""
    history = [SYSTEM, turn("user", f"{tag}: start the task")]
    out = [chat(list(history))]
    for n in range(1, turns):
        history += [
            Message(role="assistant", content=[TextPart(text=f"step {n} " * 30),
                                               ToolUsePart(id=f"t{n}", name="run", arguments=f'{{"n": {n}}}')]),
            Message(role="user", content=[ToolResultPart(tool_use_id=f"t{n}", content=[TextPart(text="done " * 20)])]),
        ]  # fmt: skip
        out.append(chat(list(history)))
    return out


# -- the chain -------------------------------------------------------------------------


def test_each_turn_of_a_conversation_shares_every_checkpoint_of_the_last() -> None:
    requests = agent_turns("conv-1", 6)
    chains = [affinity_chain(r) for r in requests]
    for (short, before), (_, after) in itertools.pairwise(zip(requests, chains, strict=True)):
        assert before and before[0] in after  # the whole last turn, at one of this one's message ends
        assert set(prefix_hashes(prompt_bytes(short))) <= set(after)  # and every block checkpoint
        assert after[0] not in before  # it grew
    other = affinity_chain(agent_turns("conv-2", 3)[2])
    assert set(other) & set(chains[2])  # the shared system prompt...
    assert other[0] not in chains[2] and chains[2][0] not in other  # ...but not their own turns


messages = st.lists(
    st.builds(turn, st.sampled_from(["system", "user", "assistant"]), st.text(max_size=600)), min_size=1, max_size=8,
)  # fmt: skip


@given(messages, messages)
@settings(max_examples=150, deadline=None)
def test_a_prompt_encodes_as_a_prefix_of_any_prompt_that_extends_it(first: list[Message], more: list[Message]) -> None:
    short, long = chat(first), chat(first + more)
    assert prompt_bytes(long).startswith(prompt_bytes(short))
    lead, data, ends = prompt_parts(long)
    assert lead == b"" and data == msgspec.json.encode(long.messages)[:-1] and ends[-1] == len(data)
    whole = prompt_bytes(long)
    assert all(whole[end - 1 : end + 1] in (b"},", b"}") for end in ends)  # each a message's end
    assert len(ends) == min(len(first + more), TAIL_MESSAGES)
    assert set(prefix_hashes(prompt_bytes(short))) <= set(affinity_chain(long))
    before = affinity_chain(short)
    if before and len(more) < TAIL_MESSAGES:  # the next turn holds the whole last one
        assert before[0] in affinity_chain(long)


@pytest.mark.parametrize("system_bytes", [3000, 5000, 6100, 12_345, 20_000, 50_000])
def test_each_turn_finds_its_own_last_turn_past_a_long_shared_system_prompt(system_bytes: int) -> None:
    """Turns that differ by less than `SPARSE_EVERY` blocks past a system prompt every
    conversation shares: the block checkpoints alone find only the shared prompt (any
    conversation's replica); the message ends find the conversation's own last turn."""
    system = turn("system", ("You are a coding agent with tools. " * 2000)[:system_bytes])
    memory = AffinityMemory()
    history = {c: [system, turn("user", f"conversation {c}: the task " + "x" * 200)] for c in range(6)}
    for n in range(5):
        for c, messages in history.items():
            chain = affinity_chain(chat(messages))
            if n:
                assert memory.lookup(chain, n)[0] == f"replica-{c}"
            memory.record(chain, f"replica-{c}", n)
            messages += [turn("assistant", f"answer {c}.{n} " + "y" * 300), turn("user", f"next {n} " + "z" * 200)]


def test_short_prompts_have_no_chain_and_long_ones_stop_at_max_blocks() -> None:
    assert affinity_chain(chat([turn("user", "hi")])) == []
    huge = chat([turn("user", "x" * (BLOCK_BYTES * (MAX_BLOCKS + 500)))])
    chain = affinity_chain(huge)
    assert len(chain) == CHECKPOINTS == len(set(chain))
    assert list(checkpoints(40)) == [*range(1, 9), 24, 40]
    assert prefix_hashes(b"a" * BLOCK_BYTES * 3) == list(reversed(
        [prefix_hashes(b"a" * BLOCK_BYTES * n)[0] for n in (1, 2, 3)]))  # fmt: skip


def test_the_key_replaces_the_prefix_and_a_salt_keeps_chains_apart() -> None:
    request = agent_turns("conv-1", 2)[1]
    keyed = chat(request.messages, affinity_key="conv-1")
    assert affinity_chain(keyed) == affinity_chain(chat([turn("user", "other")], affinity_key="conv-1"))
    assert len(affinity_chain(keyed)) == 1 and affinity_chain(keyed)[0] not in affinity_chain(request)
    assert not set(affinity_chain(request, salt="tenant-a")) & set(affinity_chain(request, salt="tenant-b"))
    assert affinity_chain(request, salt="") == affinity_chain(request)


def test_tools_lead_the_prompt() -> None:
    base = agent_turns("conv-1", 2)[1]
    tool = ToolSpec(name="run", description="runs " * 100, parameters={"type": "object"})
    with_tools = chat(base.messages, tools=[tool])
    assert not set(affinity_chain(base)) & set(affinity_chain(with_tools))  # another rendered prefix
    whole = prompt_bytes(with_tools)
    assert whole == msgspec.json.encode([tool]) + msgspec.json.encode(base.messages)[:-1]
    _, _, ends = prompt_parts(with_tools)
    assert affinity_chain(with_tools) == prefix_hashes(whole, None, ends)  # hashed in place = joined


# -- the memory ------------------------------------------------------------------------


def test_lookup_names_the_replicas_of_the_longest_recorded_prefixes_first() -> None:
    memory = AffinityMemory()
    first, second, third = (affinity_chain(r) for r in agent_turns("conv-1", 3))
    memory.record(first, A, 0.0)
    memory.record(second, B, 1.0)  # the second turn went elsewhere: its prefixes now point there
    assert memory.lookup(third, 2.0) == [B]
    memory.record(third[:1], C, 2.0)
    assert memory.lookup(third, 3.0) == [C, B]  # longest first, each once
    assert memory.lookup([], 3.0) == [] and memory.lookup([12345], 3.0) == []


def test_the_memory_is_bounded_least_recently_recorded_first_and_forgets_after_its_ttl() -> None:
    memory = AffinityMemory(capacity=4, ttl_seconds=10)
    memory.record([1, 2], A, 0.0)
    memory.record([3, 4], B, 1.0)
    memory.record([1], A, 2.0)  # recorded again: most recent
    memory.record([5], C, 3.0)
    assert len(memory) == 4 and memory.lookup([2], 3.0) == [] and memory.lookup([1, 3, 5], 3.0) == [A, B, C]
    assert memory.lookup([3], 11.5) == []  # ten seconds after it was recorded
    memory.record([6], A, 12.5)  # a record sweeps the expired
    assert len(memory) == 2 and memory.lookup([1, 5, 6], 12.5) == [C, A]
    with pytest.raises(ValueError):
        AffinityMemory(capacity=0)


def test_the_default_memory_stays_under_three_megabytes() -> None:
    rng = random.Random(7)
    tracemalloc.start()
    try:
        memory = AffinityMemory()
        for n in range(DEFAULT_CAPACITY // 20 + 100):
            memory.record([rng.getrandbits(64) for _ in range(20)], (A, B, C)[n % 3], n * 0.01)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(memory) == DEFAULT_CAPACITY and used < 3_000_000


# -- the pick --------------------------------------------------------------------------


def replica(address: str, in_flight: int, limit: int = 4, **fields: object) -> Replica:
    return Replica(address=address, state=fields.pop("state", ReplicaState.READY), in_flight=in_flight,  # type: ignore[arg-type]
                   limit=limit, **fields)  # type: ignore[arg-type]  # fmt: skip


def test_affinity_wins_within_the_extra_in_flight_else_the_least_loaded() -> None:
    pool = [replica(A, 1), replica(B, 2), replica(C, 3)]
    assert pick(pool, prefer=[B], max_extra=1).address == B  # type: ignore[union-attr]
    assert pick(pool, prefer=[C], max_extra=1).address == A  # type: ignore[union-attr]  # 3 > 1 + 1
    assert pick(pool, prefer=[C, B], max_extra=1).address == B  # type: ignore[union-attr]  # the next preference
    assert pick(pool, prefer=[C], max_extra=2).address == C  # type: ignore[union-attr]
    full = [replica(A, 0), replica(B, 4)]
    assert pick(full, prefer=[B], max_extra=10).address == A  # type: ignore[union-attr]  # no room: never
    ejected = [replica(A, 0), replica(B, 0, state=ReplicaState.EJECTED)]
    assert pick(ejected, prefer=[B], max_extra=1).address == A  # type: ignore[union-attr]
    saturated = [replica(A, 2), replica(B, 0, saturated=True)]
    assert pick(saturated, prefer=[B], max_extra=5).address == A  # type: ignore[union-attr]
    assert pick(saturated).address == A  # type: ignore[union-attr]  # vLLM says B queues: nothing new
    assert pick([replica(A, 0, saturated=True)]) is None


replica_lists = st.lists(
    st.builds(lambda a, s, limit, used, sat: replica(a, min(used, limit), limit, state=s, saturated=sat),
              st.sampled_from([A, B, C]), st.sampled_from(ReplicaState), st.integers(1, 4), st.integers(0, 4),
              st.booleans()),
    max_size=3, unique_by=lambda r: r.address,
)  # fmt: skip


@given(replica_lists, st.integers(1, 3), st.lists(st.sampled_from([A, B, C]), max_size=3, unique=True),
       st.integers(0, 3), st.none() | st.sampled_from([A, B, C]))  # fmt: skip
def test_pick_with_affinity_against_a_reference(
    replicas: list[Replica], slots: int, prefer: list[str], max_extra: int, after: str | None
) -> None:
    fits = [r for r in replicas if r.state is ReplicaState.READY and not r.saturated and r.limit - r.in_flight >= slots]
    chosen = pick(replicas, slots, after, prefer, max_extra)
    if not fits:
        assert chosen is None
        return
    least = min(r.in_flight for r in fits)
    wanted = [r for a in prefer for r in fits if r.address == a and r.in_flight <= least + max_extra]
    expected = wanted[0] if wanted else pick(replicas, slots, after)
    assert chosen == expected
    assert chosen is not None and chosen.in_flight <= least + max_extra  # never far from the least loaded


def test_replica_set_takes_with_affinity_and_skips_saturated_replicas() -> None:
    replicas = ReplicaSet(4, [A, B, C])
    assert replicas.take(prefer=[C], max_extra=1) == C
    assert replicas.take(prefer=[C], max_extra=1) == C  # 1 <= 0 + 1
    assert replicas.take(prefer=[C], max_extra=1) == A  # 2 > 0 + 1: the least loaded
    replicas.set_saturated([B])
    assert replicas.take() == A and replicas.take() == C  # B says it queues
    assert replicas.capacity() == 12 and [r.saturated for r in replicas.replicas()] == [False, True, False]
    replicas.set_saturated([])
    assert replicas.take() == B


# -- the whole rule, simulated ---------------------------------------------------------


def simulate(seed: int, affinity: bool, took: tuple[float, float] = (1.0, 1.3), gap: tuple[float, float] = (0, 0.05),
             conversations: int = 12, turns: int = 5) -> float:  # fmt: skip
    """Agents over three replicas of 4 slots: each conversation sends its next turn (the whole
    history plus the last answer) `gap` seconds after the answer ends; a turn takes `took`
    seconds. Returns the share of turns 2.. that went to the replica of the previous turn."""
    rng = random.Random(seed)
    replicas, memory = ReplicaSet(4, [A, B, C]), AffinityMemory()
    history = {c: [SYSTEM, turn("user", f"conversation {c}: the task")] for c in range(conversations)}
    where: dict[int, list[str]] = {c: [] for c in range(conversations)}
    events = [(rng.uniform(0, 1), "start", c, 1) for c in range(conversations)]
    waiting: list[tuple[int, int]] = []
    heapq.heapify(events)

    def start(c: int, n: int, now: float) -> bool:
        chain = affinity_chain(chat(list(history[c])))
        address = replicas.take(prefer=memory.lookup(chain, now) if affinity else [], max_extra=1)
        if address is None:
            return False
        memory.record(chain, address, now)
        where[c].append(address)
        heapq.heappush(events, (now + rng.uniform(*took), "end", c, n))
        return True

    while events:
        now, kind, c, n = heapq.heappop(events)
        if kind == "start":
            if not start(c, n, now):
                waiting.append((c, n))  # the upstream's one queue
            continue
        replicas.release(where[c][-1])
        if n < turns:
            history[c] += [turn("assistant", f"answer {n} " * 40), turn("user", f"then {n}")]
            heapq.heappush(events, (now + rng.uniform(*gap), "start", c, n + 1))
        while waiting and start(*waiting[0], now):
            waiting.pop(0)
    kept = [a == b for trail in where.values() for a, b in itertools.pairwise(trail)]
    return sum(kept) / len(kept)


def test_agent_conversations_stay_on_their_replica() -> None:
    kept = [simulate(seed, affinity=True) for seed in range(12)]
    assert sum(kept) / len(kept) >= 0.9 and min(kept) >= 0.8
    # irregular turns: the least loaded alone (ties rotating) keeps about half; affinity far more
    irregular = {"took": (1.0, 2.0), "gap": (0.0, 0.5)}
    on = [simulate(seed, True, **irregular) for seed in range(12)]  # type: ignore[arg-type]
    off = [simulate(seed, False, **irregular) for seed in range(12)]  # type: ignore[arg-type]
    assert sum(on) / len(on) >= sum(off) / len(off) + 0.3
