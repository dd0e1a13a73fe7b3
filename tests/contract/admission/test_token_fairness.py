"""Token fairness end to end: a real gateway (`fairness = "tokens"`, cap 2), the stub pacing
its tokens like a GPU (`--chunk-delay`, 3 ms a token), a keys file with two consumers of equal
weight. A floods 400-token answers, B 20-token ones, each keeping 4 requests in flight (twice
the cap, as a real client would), all streamed. Over the measured window, `/metrics`
(`gateway_consumer_tokens_total`) shows their weighted tokens (input + 2 x output) within 20%
of each other: B's requests were dispatched about twenty times as often. Under `fair` (by
requests) A would get about twenty times B's tokens.

With twice the cap in flight B often has nothing queued for an instant (its two running
requests end, its two queued ones are dispatched, the next two arrive a moment later) while
it still holds both slots: it is not idle, so it keeps the deficit it is catching up on. Were
it lifted to A's service each time, A would get about twice B's tokens (measured 1.6 to 2.2x
here, in every run).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
import pytest
from tests.contract.admission.e2e_support import admission, until
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

KEYS = {"A": new_key(), "B": new_key()}
ANSWER = {"A": 400, "B": 20}  # max_tokens of each consumer's requests (the stub answers that many)
WORKERS = 4  # requests each consumer keeps in flight (twice the cap: both usually have some waiting)
CHUNK_DELAY = "0.003"  # the stub's seconds a token: a 400-token answer streams for 1.2 s
WARM_UP, WINDOW = 2.0, 10.0  # seconds: measured from the end of the warm-up, for the window


def _gateway(procs: Processes, tmp_path: Path) -> Proc:
    stub = procs.stub("--tokens", "400", "--chunk-delay", CHUNK_DELAY)
    table = {**admission(2, 40, timeout=60), "fairness": '"tokens"'}
    toml = upstream_toml("m", stub.url, ["m"], table)  # type: ignore[arg-type]
    keys = tmp_path / "keys.toml"
    keys.write_text("".join(f'[consumers.{who}]\nkeys = ["{key_digest(key)}"]\n' for who, key in KEYS.items()))
    return procs.gateway(toml + f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n')


async def _flood(c: httpx.AsyncClient, gw: Proc, who: str) -> None:
    body = {"model": "m", "stream": True, "max_tokens": ANSWER[who], "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{who} wants a story"}]}
    headers = {"authorization": f"Bearer {KEYS[who]}"}
    for _ in range(10_000):  # bounded; cancelled at the end of the window anyway
        async with c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            async for _chunk in r.aiter_bytes():
                pass


async def _weighted(c: httpx.AsyncClient, gw: Proc) -> dict[str, float]:
    """Each consumer's input + 2 x output tokens on the upstream so far."""
    out = dict.fromkeys(KEYS, 0.0)
    for name, labels, value in samples((await c.get(gw.ops_url + "/metrics")).text):
        if name == "gateway_consumer_tokens_total" and labels["upstream"] == "m":
            out[labels["consumer"]] += {"input": 1.0, "output": 2.0}.get(labels["kind"], 0.0) * value
    return out


@pytest.mark.slow
async def test_long_and_short_answers_get_the_same_service_under_tokens(procs: Processes, tmp_path: Path) -> None:
    gw = _gateway(procs, tmp_path)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=httpx.Limits(max_connections=20)) as c:
        tasks = [asyncio.create_task(_flood(c, gw, who)) for who in KEYS for _ in range(WORKERS)]
        try:
            async def both_served() -> bool:
                return all(v > 0 for v in (await _weighted(c, gw)).values())

            await until(both_served, "both consumers served", timeout=10)
            await asyncio.sleep(WARM_UP)
            before = await _weighted(c, gw)
            await asyncio.sleep(WINDOW)
            after = await _weighted(c, gw)
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
