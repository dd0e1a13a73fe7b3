"""Consumer limits end to end: real gateways, the stub, Redis, the official SDKs.

429 in each surface's shape with Retry-After and each dialect's rate-limit headers (also on
answers), one limit for three processes on one Redis, tokens charged from the upstream's
usage (or estimated when it sends none), `max_in_flight` across upstreams, and a 429 that
never takes a queue place.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

LIMITED_KEY, OTHER_KEY = new_key(), new_key()
USER = [{"role": "user", "content": "hi"}]


def _keys(path: Path, limited: str, other: str = "") -> Path:
    path.write_text(f'[consumers.limited]\nkeys = ["{key_digest(LIMITED_KEY)}"]\n{limited}\n'
                    f'[consumers.other]\nkeys = ["{key_digest(OTHER_KEY)}"]\n{other}\n')
    return path


def _auth(keys: Path) -> str:
    return f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n'


def _v1(key: str, stream: bool = False, model: str = "plain", max_tokens: int = 8) -> dict[str, object]:
    return {"model": model, "messages": USER, "stream": stream, "max_tokens": max_tokens}


async def _post(c: httpx.AsyncClient, gw: Proc, key: str, **body: object) -> httpx.Response:
    return await c.post(gw.url + "/v1/chat/completions", json=_v1(key, **body),  # type: ignore[arg-type]
                        headers={"authorization": f"Bearer {key}"})


async def _metrics(c: httpx.AsyncClient, gw: Proc) -> list[tuple[str, dict[str, str], float]]:
    return list(samples((await c.get(gw.ops_url + "/metrics")).text))


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_rpm_over_three_processes_on_one_redis(procs: Processes, redis: RedisServer, tmp_path: Path) -> None:
    stub = procs.stub("--tokens", "2")
    keys = _keys(tmp_path / "keys.toml", "requests_per_minute = 10")
    shared = f'\n[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    gateways = procs.together(partial(procs.gateway, upstream_toml("plain", stub.url, ["plain"]) + _auth(keys) + shared)
                              for _ in range(3))
    async with httpx.AsyncClient(timeout=20) as c:
        answers = await asyncio.gather(*(_post(c, gateways[n % 3], LIMITED_KEY) for n in range(30)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * 10 + [429] * 20
        for refused in (a for a in answers if a.status_code == 429):
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.headers["x-ratelimit-limit-requests"] == "10"
            assert refused.headers["x-ratelimit-remaining-requests"] == "0"
            error = refused.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and refused.json()["status"] == 429
        ok = next(a for a in answers if a.status_code == 200)
        assert ok.headers["x-ratelimit-limit-requests"] == "10"
        assert re.fullmatch(r"(\d+h)?(\d+m)?\d+(ms|s)", ok.headers["x-ratelimit-reset-requests"])
        # the other consumer has no limits: unaffected by the first one's 429s
        assert (await _post(c, gateways[0], OTHER_KEY)).status_code == 200
        counted = [v for gw in gateways for name, labels, v in await _metrics(c, gw)
                   if name == "gateway_rate_limited_total" and labels == {"consumer": "limited",
                                                                         "limit": "requests_per_minute"}]
        assert sum(counted) == 20


async def test_sdks_raise_rate_limit_error_with_each_dialects_headers(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--tokens", "2")
    keys = _keys(tmp_path / "keys.toml", "requests_per_minute = 2")
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth(keys))
    sdk = anthropic.Anthropic(base_url=gw.url + "/llm", api_key=LIMITED_KEY, max_retries=0, timeout=20)
    raw = sdk.messages.with_raw_response.create(model="plain", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", raw.headers["anthropic-ratelimit-requests-reset"])
    with sdk.messages.stream(model="plain", max_tokens=8, messages=USER) as stream:  # type: ignore[arg-type]
        assert stream.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        stream.get_final_message()
    with pytest.raises(anthropic.RateLimitError) as refused:
        sdk.messages.create(model="plain", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(refused.value.response.headers["retry-after"]) >= 1
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=LIMITED_KEY, max_retries=0, timeout=20)
    with pytest.raises(openai.RateLimitError) as too_many:
        client.chat.completions.create(model="plain", messages=USER)  # type: ignore[arg-type]
    assert too_many.value.code == "rate_limit_exceeded"


async def test_a_429_takes_no_queue_place_or_slot(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1", "--tokens", "2", log=log)
    keys = _keys(tmp_path / "keys.toml", "requests_per_minute = 1")
    admission = {"sequence_slots": 2, "max_in_flight": 1, "queue_depth": 1, "queue_timeout_seconds": 10}
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"], admission) + _auth(keys))
    async with httpx.AsyncClient(timeout=20) as c:
        first = asyncio.create_task(_post(c, gw, LIMITED_KEY))  # holds the only slot for 1 s
        await asyncio.sleep(0.3)
        refused = await asyncio.gather(*(_post(c, gw, LIMITED_KEY) for _ in range(5)))
        assert [r.status_code for r in refused] == [429] * 5  # not 503: the queue stayed free
        queued = asyncio.create_task(_post(c, gw, OTHER_KEY))  # takes the one queue place
        assert (await first).status_code == 200 and (await queued).status_code == 200
        admitted = {labels["outcome"]: v for name, labels, v in await _metrics(c, gw)
                    if name == "gateway_admission_total"}
    assert admitted["rejected_full"] == 0 and admitted["admitted"] == 2 and admitted["queued"] == 1


async def test_max_in_flight_holds_across_upstreams(procs: Processes, tmp_path: Path) -> None:
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a, b = procs.together(partial(procs.stub, "--hold", "0.4", "--tokens", "2", log=log) for log in (log_a, log_b))
    keys = _keys(tmp_path / "keys.toml", "max_in_flight = 2")
    gw = procs.gateway(upstream_toml("a", a.url, ["a"]) + upstream_toml("b", b.url, ["b"]) + _auth(keys))
    async with httpx.AsyncClient(timeout=30) as c:
        answers = await asyncio.gather(*(_post(c, gw, LIMITED_KEY, model="ab"[n % 2]) for n in range(10)))
    assert [r.status_code for r in answers] == [200] * 10  # they waited, none was refused
    in_flight = [int(m) for log in (log_a, log_b) for m in re.findall(r"in_flight=(\d+)", log.read_text())]
    assert len(in_flight) == 10
    # the two stubs together never saw more than 2 of this consumer's requests at once
    starts = sorted(float(line.split()[0]) for log in (log_a, log_b) for line in log.read_text().splitlines()
                    if " chat start " in line)
    assert all(later - earlier >= 0.3 for earlier, later in zip(starts, starts[2:], strict=False))


async def test_tokens_charged_from_usage_or_estimated_never_zero(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--tokens", "5", "--no-usage")
    keys = _keys(tmp_path / "keys.toml", "tokens_per_minute = 100000")
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth(keys))
    sdk = anthropic.Anthropic(base_url=gw.url + "/llm", api_key=LIMITED_KEY, max_retries=0, timeout=20)
    with sdk.messages.stream(model="plain", max_tokens=8, messages=USER) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0  # estimated: never 0
    async with httpx.AsyncClient(timeout=20) as c:
        charged = {(labels["upstream"], labels["kind"]): v for name, labels, v in await _metrics(c, gw)
                   if name == "gateway_consumer_tokens_total" and labels["consumer"] == "limited"}
        assert charged == {("plain", "input"): final.usage.input_tokens,
                           ("plain", "output"): final.usage.output_tokens, ("plain", "cached"): 0}
        ok = await _post(c, gw, LIMITED_KEY)
        remaining = int(ok.headers["x-ratelimit-remaining-tokens"])
        assert remaining < 100000  # the earlier stream was charged


async def test_tokens_per_minute_with_concurrent_streams(procs: Processes, tmp_path: Path) -> None:
    """20 concurrent streams against a budget of about 4 reservations: the total charged stays
    within the limit plus one reservation, and the rest are refused with 429."""
    stub = procs.stub("--tokens", "6", "--hold", "0.3")
    limit = 4 * (8 + 5)  # a reservation: max_tokens 8 + about 5 prompt tokens
    keys = _keys(tmp_path / "keys.toml", f"tokens_per_minute = {limit}")
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth(keys))
    async with httpx.AsyncClient(timeout=20) as c:
        answers = await asyncio.gather(*(_post(c, gw, LIMITED_KEY, stream=True) for _ in range(20)))
        ok = [a for a in answers if a.status_code == 200]
        assert ok and len(ok) < 20 and {a.status_code for a in answers} <= {200, 429}
        charged = sum(v for name, labels, v in await _metrics(c, gw)
                      if name == "gateway_consumer_tokens_total" and labels["consumer"] == "limited"
                      and labels["kind"] != "cached")  # a part of input
    assert 0 < charged <= limit + 8 + 5


async def test_redis_down_limited_consumers_fail_closed_unlimited_pass(
    procs: Processes, redis: RedisServer, tmp_path: Path
) -> None:
    stub = procs.stub("--tokens", "2")
    keys = _keys(tmp_path / "keys.toml", "requests_per_minute = 100")
    shared = f'\n[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth(keys) + shared)
    async with httpx.AsyncClient(timeout=20) as c:
        assert (await _post(c, gw, LIMITED_KEY)).status_code == 200
        redis.stop()
        refused = await _post(c, gw, LIMITED_KEY)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert (await _post(c, gw, OTHER_KEY)).status_code == 200  # no limits: no Redis needed
        redis.start()
        for _ in range(50):  # the connection comes back by itself
            if (await _post(c, gw, LIMITED_KEY)).status_code == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("limited consumer not served again after Redis returned")
