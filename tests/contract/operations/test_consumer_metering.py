"""Who used the GPUs, end to end: a real gateway with two consumers in its keys file, the stub
(`--tokens`, `--hold 0.2`, `--prefix-cache`), requests from both through `/v1` and `/llm`,
streamed and not; then `/metrics` counts each consumer's tokens (input, output, cached) and
slot-seconds per upstream as the stub reported and held them, and `/status.json` shows their
shares of each upstream and Jain's fairness index (also the gauge). A client that leaves
mid-stream and an upstream error count the slot time they held. With two workers, every
worker's requests are on one scrape.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.contract.operations.test_ops_listener import _connection, _workers
from tests.support.metrics import gauge, samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

KEYS = {"alpha": new_key(), "beta": new_key()}
HOLD = 0.2  # the stub holds every answer this long: each request holds its slot at least this
PROMPT = " ".join(f"word{i}" for i in range(40))  # 40 stub tokens: 2 whole blocks of 16 cached on a repeat
TOKENS = 5  # the stub's answer length


def _keys(path: Path) -> Path:
    path.write_text(f'[consumers.alpha]\nkeys = ["{key_digest(KEYS["alpha"])}"]\n'
                    f'[consumers.beta]\nkeys = ["{key_digest(KEYS["beta"])}"]\nweight = 2\n')
    return path


def _auth(keys: Path) -> str:
    return f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n'


def _use(page: list[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str, str], float]:
    """(consumer, upstream, kind) -> count, `kind` a token kind or "slot_seconds"."""
    out = {}
    for name, labels, value in page:
        if name == "gateway_consumer_tokens_total":
            out[labels["consumer"], labels["upstream"], labels["kind"]] = value
        elif name == "gateway_consumer_slot_seconds_total":
            out[labels["consumer"], labels["upstream"], "slot_seconds"] = value
    return out


class Used:
    """What the stub reported to each consumer, per upstream (the answers' usage)."""

    def __init__(self) -> None:
        self.tokens: dict[tuple[str, str, str], float] = {}
        self.requests: dict[tuple[str, str], int] = {}

    def add(self, consumer: str, upstream: str, prompt: int, output: int, cached: int) -> None:
        for kind, value in (("input", prompt), ("output", output), ("cached", cached)):
            key = (consumer, upstream, kind)
            self.tokens[key] = self.tokens.get(key, 0) + value
        self.requests[consumer, upstream] = self.requests.get((consumer, upstream), 0) + 1


async def _v1(c: httpx.AsyncClient, gw: Proc, used: Used, consumer: str, model: str, *, stream: bool) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    answer = await c.post(gw.url + "/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {KEYS[consumer]}"})
    assert answer.status_code == 200, answer.text
    if stream:
        frames = [json.loads(line[6:]) for line in answer.text.splitlines()
                  if line.startswith("data: {")]
        usage = frames[-1]["usage"]
    else:
        usage = answer.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    used.add(consumer, model, usage["prompt_tokens"], usage["completion_tokens"], cached)


async def _llm(c: httpx.AsyncClient, gw: Proc, used: Used, consumer: str, model: str) -> None:
    answer = await c.post(gw.url + "/llm/v1/messages", headers={"x-api-key": KEYS[consumer]}, json={
        "model": model, "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]})
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    cached = usage.get("cache_read_input_tokens") or 0
    used.add(consumer, model, usage["input_tokens"] + cached, usage["output_tokens"], cached)  # /llm: uncached rest


async def test_tokens_and_slot_seconds_per_consumer_shares_and_the_fairness_index(
    procs: Processes, tmp_path: Path
) -> None:
    stub = procs.stub("--tokens", str(TOKENS), "--hold", str(HOLD), "--prefix-cache")
    capped = {"sequence_slots": 2, "max_in_flight": 1, "queue_depth": 8, "queue_timeout_seconds": 30}
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], capped, )
                       + "output_token_weight = 3\n"
                       + upstream_toml("plain", procs.stub("--tokens", "2", "--hold", str(HOLD)).url, ["plain"])
                       + _auth(_keys(tmp_path / "keys.toml")))
    used = Used()
    async with httpx.AsyncClient(timeout=30) as c:
        await _v1(c, gw, used, "alpha", "reasoning", stream=False)  # the prompt's blocks are cached from here on
        await asyncio.gather(  # alpha and beta wait for reasoning's one slot in turn
            *(_v1(c, gw, used, "alpha", "reasoning", stream=n % 2 == 0) for n in range(3)),
            *(_v1(c, gw, used, "beta", "reasoning", stream=n % 2 == 1) for n in range(2)),
            _llm(c, gw, used, "beta", "reasoning"),
            _v1(c, gw, used, "beta", "plain", stream=True),
        )
        anonymous = await c.post(gw.url + "/v1/chat/completions", json={"model": "plain", "messages": []})
        assert anonymous.status_code == 401  # nothing counted for a refused key
        await asyncio.sleep(1.2)  # the board's next reading (once a second) for the gauge
        page = samples((await c.get(gw.ops_url + "/metrics")).text)
        status = (await c.get(gw.ops_url + "/status.json")).json()
    counted = _use(page)
    assert {k: v for k, v in counted.items() if k[2] != "slot_seconds"} == used.tokens
    assert used.tokens["alpha", "reasoning", "cached"] >= 3 * 32  # the repeats were served from the cache
    assert used.tokens["beta", "plain", "cached"] == 0  # not reported by that stub: 0, a series all the same
    for (consumer, upstream), requests in used.requests.items():
        held = counted[consumer, upstream, "slot_seconds"]
        assert HOLD * requests <= held < (HOLD + 1.0) * requests, (consumer, upstream, held)  # never the queue wait
    reasoning, plain = status["upstreams"]
    alpha, beta = reasoning["consumers"]
    assert (alpha["name"], beta["name"]) == ("alpha", "beta") and [c["name"] for c in plain["consumers"]] == ["beta"]
    for share in (alpha, beta):
        name = share["name"]
        assert share["input_tokens"] == used.tokens[name, "reasoning", "input"]
        assert share["cached_tokens"] == used.tokens[name, "reasoning", "cached"]
        assert share["weighted_tokens"] == share["input_tokens"] + 3 * share["output_tokens"]  # output_token_weight
        assert math.isclose(share["slot_seconds"], counted[name, "reasoning", "slot_seconds"], abs_tol=1e-3)
    assert math.isclose(beta["service"], beta["weighted_tokens"] / 2, abs_tol=1e-3)  # weight 2
    assert math.isclose(alpha["token_share"] + beta["token_share"], 1.0, abs_tol=1e-3)
    assert math.isclose(alpha["slot_share"] + beta["slot_share"], 1.0, abs_tol=1e-3)
    assert alpha["token_share"] > beta["token_share"]  # 4 answers of 5 tokens against 3
    x = (alpha["service"], beta["service"])
    assert math.isclose(reasoning["fairness_index"], sum(x) ** 2 / (2 * (x[0] ** 2 + x[1] ** 2)), abs_tol=1e-3)
    assert reasoning["fairness_index"] < 1.0 and plain["fairness_index"] == 1.0  # plain: one consumer
    assert math.isclose(gauge(page, "gateway_upstream_fairness_index", "reasoning") or 0,  # type: ignore[arg-type]
                        reasoning["fairness_index"], abs_tol=1e-3)
    assert gauge(page, "gateway_upstream_fairness_index", "plain") == 1.0
    lines = [json.loads(line) for line in gw.text().splitlines() if line.startswith("{")]
    served = [r for r in lines if r.get("status") == 200 and r.get("consumer")]
    assert len(served) == 8 and all(r["slot_seconds"] >= HOLD for r in served)  # the access log's fields
    assert sum(r["cached_tokens"] or 0 for r in served) == sum(v for k, v in used.tokens.items() if k[2] == "cached")
    assert [r["slot_seconds"] for r in lines if r.get("status") == 401] == [None]  # refused: never held a slot


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_two_workers_count_every_workers_use_on_one_scrape(
    procs: Processes, redis: RedisServer, tmp_path: Path
) -> None:
    stub = procs.stub("--tokens", str(TOKENS), "--hold", str(HOLD))
    gw = procs.gateway(f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
                       f'key_prefix = "metering-{uuid.uuid4().hex[:8]}"\n'
                       + upstream_toml("plain", stub.url, ["plain"]) + _auth(_keys(tmp_path / "keys.toml")),
                       server_extra="workers = 2")
    workers = _workers(gw.popen.pid)
    assert len(workers) == 2
    served = dict.fromkeys(workers, 0)
    prompts: dict[str, int] = {"alpha": 0, "beta": 0}
    for _ in range(200):  # new connections until each worker has served both consumers (bounded)
        conn, pid = _connection(gw.port, workers)
        for consumer in ("alpha", "beta"):
            body = json.dumps({"model": "plain", "messages": [{"role": "user", "content": "a b c"}]})
            conn.request("POST", "/v1/chat/completions", body,
                         {"content-type": "application/json", "authorization": f"Bearer {KEYS[consumer]}"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            prompts[consumer] += answer["usage"]["prompt_tokens"]
        served[pid] += 1
        conn.close()
        if min(served.values()) >= 2:
            break
    assert min(served.values()) >= 2, served
    rounds = sum(served.values())
    ops_port = int(gw.ops_url.rsplit(":", 1)[1])
    scraped: dict[int, dict[tuple[str, str, str], float]] = {}
    for _ in range(200):  # a scrape through each worker (bounded)
        conn, pid = _connection(ops_port, workers)
        conn.request("GET", "/metrics")
        scraped[pid] = _use(samples(conn.getresponse().read().decode()))
        conn.close()
        if len(scraped) == 2:
            break
    assert set(scraped) == set(workers)
    for counted in scraped.values():
        for consumer in ("alpha", "beta"):
            assert counted[consumer, "plain", "input"] == prompts[consumer]
            assert counted[consumer, "plain", "output"] == TOKENS * rounds
            assert HOLD * rounds <= counted[consumer, "plain", "slot_seconds"] < (HOLD + 1.0) * rounds
    deadline = time.monotonic() + 5
    while True:  # the worker answering reads every worker's counters (its board: once a second)
        plain = httpx.get(gw.ops_url + "/status.json").json()["upstreams"][0]
        names = [c["name"] for c in plain["consumers"]]
        if names == ["alpha", "beta"] and sum(c["input_tokens"] for c in plain["consumers"]) == sum(prompts.values()):
            break
        assert time.monotonic() < deadline, plain
        time.sleep(0.2)
    # the same answers for both, and beta has weight 2: services 2:1, (2 + 1)^2 / (2 x (4 + 1)) = 0.9
    assert math.isclose(plain["fairness_index"], 0.9, abs_tol=1e-3)


async def test_a_hang_up_and_an_upstream_error_count_the_slot_time_they_held(
    procs: Processes, tmp_path: Path
) -> None:
    """A stream the client leaves after its first frames counts the time its slot was held until
    the gateway aborted it (not the whole answer's); a 500 from the model server counts too."""
    slow = procs.stub("--tokens", "60", "--chunk-delay", "0.05")  # a 3 s answer
    failing = procs.stub("--error-rate", "1")
    gw = procs.gateway(upstream_toml("slow", slow.url, ["slow"]) + upstream_toml("failing", failing.url, ["failing"])
                       + _auth(_keys(tmp_path / "keys.toml")))
    headers = {"authorization": f"Bearer {KEYS['alpha']}"}
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(timeout=30) as c:
        async with c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as answer:
            lines = answer.aiter_lines()
            while not (await anext(lines)).startswith("data: {"):
                pass
            await asyncio.sleep(0.5)
        # left mid-answer: the connection is closed with the answer unread
        failed = await c.post(gw.url + "/v1/chat/completions", headers=headers,
                              json={"model": "failing", "messages": [{"role": "user", "content": "hi"}]})
        assert failed.status_code == 502
        deadline = time.monotonic() + 5
        while ("alpha", "slow", "slot_seconds") not in (counted := _use(samples(
                (await c.get(gw.ops_url + "/metrics")).text))):
            assert time.monotonic() < deadline, counted
            await asyncio.sleep(0.1)
    assert 0.5 <= counted["alpha", "slow", "slot_seconds"] < 2.0, counted  # aborted well before the answer's end
    assert 0 < counted["alpha", "failing", "slot_seconds"] < 1.0, counted
    assert counted["alpha", "failing", "input"] == 0  # the upstream produced nothing
