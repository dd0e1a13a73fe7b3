"""KV-cache affinity end to end: three `--prefix-cache` stub replicas (vLLM's automatic
prefix caching, as timing and usage show it), a real gateway with `[endpoints] urls`, agents'
conversations on loopback (tests/support/conversations.py).

- 12 concurrent conversations, 5 turns each, every turn re-sending the whole conversation:
  with `affinity = "prefix"` (the default) at least 90% of turns 2-5 land on the replica of
  their conversation's last turn and find all of it cached there (at least 75% stay on its
  first turn's replica: a turn the gate moved for load takes the conversation with it); with
  `affinity = "off"` about a third do.
- The same over 3 gateway processes sharing one Redis (the gate and the affinity memory).
- `/v1`'s `prompt_cache_key` (openai SDK) and `/llm`'s `metadata.user_id` (anthropic SDK)
  keep requests together whatever their prompts; two consumers with the same key never share
  it (each consumer's cache salt starts its chain).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from functools import partial
from pathlib import Path

import anthropic
import openai
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.support.conversations import converse, placement
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.replicas import endpoints_toml

from adapters.outbound.keys_file import keys_entry, new_key

NOWHERE = "http://127.0.0.1:9"  # the upstream's identity only: nothing listens there
ADMISSION = {"sequence_slots": 25, "max_in_flight": 24, "queue_depth": 24, "queue_timeout_seconds": 30}
STUB = ("--prefix-cache", "--prefill-ms-per-1k-tokens", "50", "--tokens", "24")


def agents_toml(urls: list[str], affinity: str = "prefix") -> str:
    return (upstream_toml("agents", NOWHERE, ["agents"], ADMISSION)
            + endpoints_toml("agents", urls=urls, slots=8, cap=8) + f'affinity = "{affinity}"\n')  # fmt: skip


def replicas(procs: Processes, tmp_path: Path) -> tuple[list[Proc], list[Path]]:
    logs = [tmp_path / f"replica-{n}.log" for n in range(3)]
    return procs.together(partial(procs.stub, *STUB, log=log) for log in logs), logs


async def test_conversations_stay_on_their_replica_and_find_their_prefix_cached(
    procs: Processes, tmp_path: Path
) -> None:
    stubs, logs = replicas(procs, tmp_path)
    gw = procs.gateway(agents_toml([s.url for s in stubs]))
    turns = await converse([gw.url], "agents")
    assert len(turns) == 60 and {t.status for t in turns} == {200}
    where = placement(logs)
    assert len(where.where) == 60
    homes = sorted(where.home(c) for c in range(12))
    # The first turns spread over the replicas. They share the system prompt, so affinity rightly
    # prefers the replica that holds it until it has more than one request over the least loaded:
    # how many replicas they reach depends on how the twelve overlap in time (two or three).
    assert len(set(homes)) >= 2, where.summary()
    assert where.kept() >= 0.9, where.summary()  # on the replica of the conversation's last turn
    assert where.at_home() >= 0.75, where.summary()  # mostly on its first turn's
    assert where.warm() >= 0.9, where.summary()  # with the whole last turn cached there


async def test_without_affinity_about_a_third_of_the_turns_stay(procs: Processes, tmp_path: Path) -> None:
    stubs, logs = replicas(procs, tmp_path)
    gw = procs.gateway(agents_toml([s.url for s in stubs], affinity="off"))
    turns = await converse([gw.url], "agents")
    assert {t.status for t in turns} == {200}
    where = placement(logs)
    assert 0.1 <= where.kept() < 0.6, where.summary()
    assert where.at_home() < 0.6, where.summary()
    assert where.warm() < 0.6, where.summary()  # the others compute the conversation again


async def test_three_processes_on_one_redis_share_the_affinity_memory(procs: Processes, tmp_path: Path) -> None:
    """Every conversation's turns rotate over the 3 gateways: only a shared memory keeps them."""
    await require_redis()
    prefix = f"affinity-e2e-{uuid.uuid4().hex[:10]}"
    try:
        stubs, logs = replicas(procs, tmp_path)
        shared = f'[admission]\nbackend = "redis"\nredis_url = "{REDIS_URL}"\nkey_prefix = "{prefix}"\n'
        gateways = procs.together(partial(procs.gateway, shared + agents_toml([s.url for s in stubs]))
                                  for _ in range(3))
        turns = await converse([g.url for g in gateways], "agents")
        assert len(turns) == 60 and {t.status for t in turns} == {200}
        where = placement(logs)
        assert where.kept() >= 0.9, where.summary()
        assert where.at_home() >= 0.75, where.summary()
        assert where.warm() >= 0.9, where.summary()
    finally:
        await delete_prefix(prefix)


# -- the client's own key ----------------------------------------------------------------------

_SERVED = re.compile(r'user="(k\d+)')


def served_by(logs: list[Path]) -> dict[str, int]:
    """Request tag (the last user message's first word, `k3`) -> replica index."""
    out: dict[str, int] = {}
    for index, log in enumerate(logs):
        for line in log.read_text().splitlines() if log.exists() else ():
            match = _SERVED.search(line)
            if match:
                out[match.group(1)] = index
    return out


async def test_prompt_cache_key_and_metadata_user_id_keep_requests_together(
    procs: Processes, tmp_path: Path
) -> None:
    stubs, logs = replicas(procs, tmp_path)
    gw = procs.gateway(agents_toml([s.url for s in stubs]))
    v1 = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0, timeout=20)
    llm = anthropic.AsyncAnthropic(base_url=f"{gw.url}/llm", api_key="none", max_retries=0, timeout=20)
    try:
        # Short prompts (no block to match), one after the other: ties rotate, a key does not.
        for n in range(4):
            await v1.chat.completions.create(model="agents", messages=[{"role": "user", "content": f"k{n} hi"}],
                                             prompt_cache_key="session-1")  # fmt: skip
        for n in range(4, 8):
            await llm.messages.create(model="agents", max_tokens=8, messages=[{"role": "user", "content": f"k{n} hi"}],
                                      metadata={"user_id": "user-7"})  # fmt: skip
        for n in range(8, 11):
            await v1.chat.completions.create(model="agents", messages=[{"role": "user", "content": f"k{n} hi"}])
    finally:
        await v1.close()
        await llm.close()
    where = served_by(logs)
    assert len({where[f"k{n}"] for n in range(4)}) == 1, where  # prompt_cache_key: one replica
    assert len({where[f"k{n}"] for n in range(4, 8)}) == 1, where  # metadata.user_id: one replica
    assert len({where[f"k{n}"] for n in range(8, 11)}) == 3, where  # no key, no prefix: they rotate


async def test_two_consumers_with_the_same_key_never_share_it(procs: Processes, tmp_path: Path) -> None:
    """Requests one after the other, so every replica is idle at each pick: a shared memory
    would send bob where alice went (the preference always wins then); with the salts he goes
    where the rotation sends him, the next replica, and each keeps his own from then on."""
    stubs, logs = replicas(procs, tmp_path)
    alice, bob = new_key(), new_key()
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_entry("alice", alice) + keys_entry("bob", bob))
    auth = f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n'
    gw = procs.gateway(agents_toml([s.url for s in stubs]) + auth)
    clients = {name: openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=20)
               for name, key in (("alice", alice), ("bob", bob))}  # fmt: skip
    order = ["alice", "bob", "alice", "bob", "alice", "bob"]
    try:
        for n, name in enumerate(order):
            await clients[name].chat.completions.create(
                model="agents", messages=[{"role": "user", "content": f"k{n} hi"}], prompt_cache_key="same-key")
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()))
    where = served_by(logs)
    of_alice = {where[f"k{n}"] for n, name in enumerate(order) if name == "alice"}
    of_bob = {where[f"k{n}"] for n, name in enumerate(order) if name == "bob"}
    assert len(of_alice) == 1 and len(of_bob) == 1 and of_alice != of_bob, where
