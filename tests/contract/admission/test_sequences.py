"""Sequences, not requests: a request for k choices takes k slots of its upstream's cap.

A real stub with `--max-num-seqs 6` (vLLM's own bound, which counts sequences: a request for
n choices is n) behind a real gateway whose cap is 6 (`max_in_flight`) and whose
`max_choices` is 4. Concurrent `n = 4` requests must never put more than 6 sequences on the
stub at once: no stub log line may show a request waiting inside the model server
(`waiting=W` with W > 0) or more than 6 sequences generating. Counted as one slot per
request, as before, six such requests were admitted together: 24 sequences on 6 places.
The same holds with the Redis ledger shared by two gateway processes (one cap for both).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer

MODEL, WIDE = "reasoning", "wide"
USER = [{"role": "user", "content": "count"}]
CAP = {"sequence_slots": 7, "max_in_flight": 6, "queue_depth": 32, "queue_timeout_seconds": 30}
LINE = re.compile(r"in_flight=(\d+) .*waiting=(\d+) seqs=(\d+)")


@dataclass
class Edge:
    gateways: list[Proc]
    log: Path

    @property
    def gateway(self) -> Proc:
        return self.gateways[0]

    def lines(self) -> list[tuple[int, int, int]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [(int(m[1]), int(m[2]), int(m[3])) for m in map(LINE.search, text.splitlines()) if m]


@pytest.fixture(scope="module", params=["memory", "redis"])
def edge(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    workdir = tmp_path_factory.mktemp(f"sequences-{request.param}")
    procs = Processes(workdir)
    log = workdir / "stub.log"
    redis = RedisServer(workdir) if request.param == "redis" else None
    try:
        stub, wide = procs.together([
            partial(procs.stub, "--tokens", "4", "--hold", "0.25", "--max-num-seqs", "6", log=log),
            partial(procs.stub, "--tokens", "2")])
        toml = (upstream_toml(MODEL, stub.url, [MODEL], CAP, extra="max_choices = 4\n")
                + upstream_toml(WIDE, wide.url, [WIDE], CAP, extra="max_choices = 8\n"))
        if redis is None:
            yield Edge([procs.gateway(toml)], log)
            return
        redis.start()
        toml += f'\n[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
        yield Edge(procs.together(partial(procs.gateway, toml) for _ in range(2)), log)
    finally:
        procs.stop_all(wait=True)  # before their Redis
        if redis is not None:
            redis.stop()


async def test_concurrent_n4_requests_never_exceed_the_model_servers_sequences(edge: Edge) -> None:
    clients = [openai.AsyncOpenAI(base_url=f"{g.url}/v1", api_key="x", max_retries=0, timeout=60)
               for g in edge.gateways]
    turn = iter(range(1000))

    def pick() -> openai.AsyncOpenAI:  # round robin over the gateway processes
        return clients[next(turn) % len(clients)]

    before = len(edge.lines())

    async def plain() -> int:
        client = pick()
        answer = await client.chat.completions.create(model=MODEL, messages=USER, n=4)  # type: ignore[arg-type]
        return len(answer.choices)

    async def streamed() -> int:
        client = pick()
        stream = await client.chat.completions.create(model=MODEL, messages=USER, n=4,  # type: ignore[arg-type]
                                                      stream=True)
        indices = {choice.index async for chunk in stream for choice in chunk.choices}
        return len(indices)

    async def text() -> int:
        client = pick()
        answer = await client.completions.create(model=MODEL, prompt="x", n=2, best_of=4)
        return len(answer.choices)

    counts = await asyncio.wait_for(asyncio.gather(*(plain() for _ in range(3)), *(streamed() for _ in range(3)),
                                                   text()), 60)  # fmt: skip
    assert counts == [4] * 6 + [2]  # every answer has its n choices
    lines = edge.lines()[before:]
    assert len(lines) == 7
    assert all(waiting == 0 for _, waiting, _ in lines), lines  # nothing queued inside the model server
    assert max(seqs for _, _, seqs in lines) <= 6 and max(in_flight for in_flight, _, _ in lines) == 1, lines
    for client in clients:
        await client.close()


async def test_slots_come_back_after_k_sequence_requests(edge: Edge) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        for gateway in edge.gateways:
            await http.post(f"{gateway.url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "n": 3})
        for gateway in edge.gateways:
            for _ in range(50):  # the Redis gate's view of the shared counts refreshes on its own beat
                metrics = (await http.get(f"{gateway.ops_url}/metrics")).text
                in_use = re.search(r'gateway_upstream_slots_in_use\{upstream="reasoning"\} (\S+)', metrics)
                assert in_use is not None, metrics[-2000:]
                if float(in_use[1]) == 0.0:
                    break
                await asyncio.sleep(0.1)
            assert float(in_use[1]) == 0.0, metrics[-2000:]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": WIDE, "messages": USER, "n": 7}),
    ("/v1/chat/completions", {"model": WIDE, "messages": USER, "n": 2, "best_of": 8}),
    ("/v1/completions", {"model": WIDE, "prompt": ["a", "b"], "n": 4}),
    ("/v1/embeddings", {"model": WIDE, "input": ["a"] * 7}),
])  # fmt: skip
def test_more_sequences_than_the_cap_can_ever_grant_are_400(edge: Edge, path: str, body: dict[str, object]) -> None:
    answer = httpx.post(edge.gateway.url + path, json=body, timeout=20)
    assert answer.status_code == 400, answer.text
    problem = answer.json()
    assert problem["type"].endswith("too_many_sequences") and problem["error"]["type"] == "invalid_request_error"
    assert "6" in problem["error"]["message"]
