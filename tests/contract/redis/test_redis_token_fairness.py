"""Token fairness across processes: two `gateway serve` processes on one Redis (its own
redis-server), `fairness = "tokens"`, cap 2 shared, the stub pacing its tokens (3 ms a token),
a keys file with two consumers of equal weight. A floods 400-token answers, B 20-token ones,
through BOTH gateways, each keeping 4 requests in flight (2 through each, twice the cap: a
consumer whose queue empties for an instant while its requests hold slots is not idle and
keeps its deficit, `theld` in the ledger), all streamed. Over the
measured window, the two processes' `/metrics` together (`gateway_consumer_tokens_total`)
show their weighted tokens (input + 2 x output) within 20% of each other: the order both
processes dispatch by is one, fed by the charges of both (the one-process version is
tests/contract/admission/test_token_fairness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from tests.contract.admission.e2e_support import admission, until
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

KEYS = {"A": new_key(), "B": new_key()}
ANSWER = {"A": 400, "B": 20}  # max_tokens of each consumer's requests (the stub answers that many)
WORKERS = 2  # requests each consumer keeps in flight through each gateway (cap 2 for all)
CHUNK_DELAY = "0.003"  # the stub's seconds a token: a 400-token answer streams for 1.2 s
WARM_UP, WINDOW = 2.0, 10.0  # seconds: measured from the end of the warm-up, for the window


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def _gateways(procs: Processes, redis: RedisServer, tmp_path: Path) -> list[Proc]:
    stub = procs.stub("--tokens", "400", "--chunk-delay", CHUNK_DELAY)
    table = {**admission(2, 80, timeout=60), "fairness": '"tokens"'}
    keys = tmp_path / "keys.toml"
    keys.write_text("".join(f'[consumers.{who}]\nkeys = ["{key_digest(key)}"]\n' for who, key in KEYS.items()))
    toml = (f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
            + upstream_toml("m", stub.url, ["m"], table)  # type: ignore[arg-type]
            + f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n')
    return procs.together(partial(procs.gateway, toml) for _ in range(2))


async def _flood(c: httpx.AsyncClient, gw: Proc, who: str) -> None:
    body = {"model": "m", "stream": True, "max_tokens": ANSWER[who], "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{who} wants a story"}]}
    headers = {"authorization": f"Bearer {KEYS[who]}"}
    for _ in range(10_000):  # bounded; cancelled at the end of the window anyway
        async with c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            async for _chunk in r.aiter_bytes():
                pass


async def _weighted(c: httpx.AsyncClient, gateways: list[Proc]) -> dict[str, float]:
    """Each consumer's input + 2 x output tokens on the upstream so far, over both processes."""
    out = dict.fromkeys(KEYS, 0.0)
    for gw in gateways:
        for name, labels, value in samples((await c.get(gw.ops_url + "/metrics")).text):
            if name == "gateway_consumer_tokens_total" and labels["upstream"] == "m":
                out[labels["consumer"]] += {"input": 1.0, "output": 2.0}.get(labels["kind"], 0.0) * value
    return out


@pytest.mark.slow
async def test_two_processes_give_long_and_short_answers_the_same_service(
    procs: Processes, redis: RedisServer, tmp_path: Path,
) -> None:
    gateways = _gateways(procs, redis, tmp_path)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=httpx.Limits(max_connections=40)) as c:
        tasks = [asyncio.create_task(_flood(c, gw, who)) for gw in gateways for who in KEYS for _ in range(WORKERS)]
        try:
            async def both_served() -> bool:
                return all(v > 0 for v in (await _weighted(c, gateways)).values())

            await until(both_served, "both consumers served", timeout=10)
            await asyncio.sleep(WARM_UP)
            before = await _weighted(c, gateways)
            await asyncio.sleep(WINDOW)
            after = await _weighted(c, gateways)
            assert not [t for t in tasks if t.done()], [t.exception() for t in tasks if t.done()]
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    a, b = (after[who] - before[who] for who in ("A", "B"))
    assert a > 2 * (400 * 2) and b > 0, (a, b)  # several of A's answers ended in the window
    assert abs(a - b) <= 0.2 * max(a, b), (a, b)
